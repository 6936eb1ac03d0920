"""D3S (allocation.md §8): max-variance row subsets, |A|*H token selection, the schedule, the stage."""

import itertools
import json
import math
import random

import pytest
import torch

from rollwise.batch.d3s import (
    Options,
    apply,
    keep_count,
    max_variance_subset,
    needs_entropy,
    ramp_length,
    ratio,
    ratios,
    sampler_entropy,
    select_rows,
    select_tokens,
    token_scores,
)
from rollwise.collate import collate
from rollwise.objectives.advantages import dr_grpo, grpo
from rollwise.types import Rollout


def _pvar(x):
    x = [float(v) for v in x]
    m = sum(x) / len(x)
    return sum((v - m) ** 2 for v in x) / len(x)


# ---------------------------------------------------------------- sample level


def test_max_variance_subset_by_hand():
    # r = [0, 0.2, 0.5, 1.0], dr_grpo: mean 0.425 -> A = [-0.425, -0.225, 0.075, 0.575].
    a = dr_grpo(torch.tensor([0.0, 0.2, 0.5, 1.0]), torch.zeros(4, dtype=torch.long)).values
    assert torch.allclose(a, torch.tensor([-0.425, -0.225, 0.075, 0.575]))
    # m = 2: the pair with the largest spread is {-0.425, 0.575}: variance (1.0 / 2)^2 = 0.25.
    assert max_variance_subset(a, 2).tolist() == [0, 3]
    # m = 3, j = #largest kept: j=0 {-.425,-.225,.075} 0.0422; j=1 {.575,-.425,-.225} 0.1867;
    # j=2 {.575,.075,-.425} 0.1667; j=3 {-.225,.075,.575} 0.1089 -> j = 1.
    assert max_variance_subset(a, 3).tolist() == [0, 1, 3]
    assert _pvar(a[[0, 1, 3]]) == pytest.approx(0.186667, abs=1e-5)
    assert max_variance_subset(a, 4).tolist() == [0, 1, 2, 3]


def test_max_variance_subset_beats_every_subset_brute_force():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(2, 9)
        vals = torch.tensor([rng.choice([rng.gauss(0, 1), 0.0, 1.0]) for _ in range(n)])
        m = rng.randint(1, n)
        got = _pvar(vals[max_variance_subset(vals, m)])
        best = max(_pvar(vals[list(s)]) for s in itertools.combinations(range(n), m))
        assert got == pytest.approx(best, abs=1e-9)


def test_binary_rewards_keep_a_balanced_subset():
    # 3 correct, 5 wrong; GRPO advantages take two values; m = ceil(0.5 * 8) = 4 -> 2 + 2.
    r = torch.tensor([1.0, 0, 0, 1, 0, 0, 1, 0])
    a = grpo(r, torch.zeros(8, dtype=torch.long)).values
    kept = max_variance_subset(a, 4)
    assert len(kept) == 4 and int(r[kept].sum()) == 2


def test_select_rows_per_group_and_over_the_batch():
    a = torch.tensor([-0.425, -0.225, 0.075, 0.575, 1.0, -1.0, 0.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    cand = torch.tensor([True] * 6 + [False])  # row 6 is excluded already (e.g. a pivot) and stays out
    keep = select_rows(a, g, cand, 0.5, "group")
    # group 0: ceil(0.5 * 4) = 2 -> rows 0, 3; group 1 (candidates 4, 5): ceil(0.5 * 2) = 1 -> the lower, row 5
    assert torch.nonzero(keep).flatten().tolist() == [0, 3, 5]
    keep = select_rows(a, g, cand, 0.5, "batch")  # ceil(0.5 * 6) = 3 over all: {-1, -0.425} + {1}? j scan
    chosen = torch.nonzero(keep).flatten().tolist()
    assert len(chosen) == 3 and 4 in chosen and 5 in chosen
    best = max(_pvar(a[list(s)]) for s in itertools.combinations(range(6), 3))
    assert _pvar(a[chosen]) == pytest.approx(best)


# ---------------------------------------------------------------- token level


def test_token_selection_keeps_the_top_fraction_by_abs_advantage_times_entropy():
    mask = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1]], dtype=torch.float32)
    ent = torch.tensor([[9.0, 1.0, 2.0, 3.0], [9.0, 9.0, 1.0, 0.5]])
    adv = torch.tensor([[-0.5], [2.0]])
    s = token_scores(adv, ent, mask)
    # scores on loss tokens: row 0: 0.5 * [1, 2, 3] = [0.5, 1, 1.5]; row 1: 2 * [1, 0.5] = [2, 1]
    assert torch.allclose(s, torch.tensor([[0, 0.5, 1.0, 1.5], [0, 0, 2.0, 1.0]]))
    kept = select_tokens(
        s, mask, 0.5, "batch"
    )  # 5 tokens -> ceil(2.5) = 3: scores 2, 1.5, then the tie 1 (row 0 first)
    assert kept.tolist() == [[0, 0, 1, 1], [0, 0, 1, 0]]
    assert int(kept.sum()) == math.ceil(0.5 * 5)
    per_row = select_tokens(s, mask, 0.5, "sequence")  # row 0: ceil(1.5) = 2 of 3; row 1: 1 of 2
    assert per_row.tolist() == [[0, 0, 1, 1], [0, 0, 1, 0]]


def test_token_scores_are_nonnegative_and_zero_when_advantage_is_zero():
    mask = torch.ones(3, 5)
    ent = torch.rand(3, 5, generator=torch.Generator().manual_seed(0))
    s = token_scores(torch.tensor([[-1.0], [0.0], [2.0]]), ent, mask)
    assert bool((s >= 0).all()) and bool((s[1] == 0).all())
    for rho, n in ((0.3, 15), (0.7, 15), (1.0, 15)):
        assert int(select_tokens(s, mask, rho).sum()) == math.ceil(rho * n - 1e-9)


# ---------------------------------------------------------------- schedule


def test_schedule_values_monotone_and_reaching_one():
    # start 0.5, ramp over 60 steps: 0.5 + 0.5 * t / 60
    assert [ratio(t, 0.5, 60) for t in (0, 30, 45, 60, 99)] == [0.5, 0.75, 0.875, 1.0, 1.0]
    vals = [ratio(t, 0.3, 37) for t in range(100)]
    assert vals == sorted(vals) and vals[-1] == 1.0
    assert ratio(80, 0.5, 60, "constant") == 0.5
    assert ratio(0, 0.5, 0) == 1.0
    assert ramp_length(Options(), 100) == 60 and ramp_length(Options(ramp_steps=7), 100) == 7
    assert keep_count(0.7, 10) == 7 and keep_count(0.5, 3) == 2 and keep_count(0.01, 4) == 1
    # entropies are needed only while rho_k < 1
    assert (
        ratios(5, 100, Options(ramp_steps=10)) == (0.75, 0.75)
        and ratios(5, 100, Options(ramp_steps=10, token_level=False))[1] == 1.0
    )
    assert [needs_entropy(t, 100, Options(ramp_steps=2)) for t in (0, 1, 2, 3)] == [True, True, False, False]
    assert not needs_entropy(0, 100, Options(token_level=False)) and needs_entropy(
        50, 100, Options(schedule="constant")
    )


# ---------------------------------------------------------------- the stage on a Batch


def _rows():
    # two groups of 4; completions of 2-3 tokens with recorded sampler entropies
    rs, rewards = [], [1, 0, 0, 1, 1, 1, 0, 1]
    for i, _r in enumerate(rewards):
        c = 2 + i % 2
        rs.append(
            Rollout(
                f"p{i // 4}",
                (1, 5),
                tuple(range(10, 10 + c)),
                (-0.1,) * c,
                "stop",
                0,
                entropies=tuple(0.1 * (i + 1) * (t + 1) for t in range(c)),
            )
        )
    return rs, torch.tensor(rewards, dtype=torch.float32), torch.tensor([0] * 4 + [1] * 4)


def test_apply_drops_rows_masks_tokens_and_recounts():
    rows, rewards, gidx = _rows()
    advs = grpo(rewards, gidx)
    batch = collate(rows, rewards, gidx, advs, 0)
    ent = sampler_entropy(rows, batch)
    assert ent[2, 2:4].tolist() == pytest.approx([0.3, 0.6])  # row 2: prompt of 2, entropies 0.3 * (1, 2)
    out, m = apply(batch, ent, step=0, train_steps=10, opts=Options())
    # rho = 0.5 at step 0: 2 rows per group survive (one correct, one wrong, max variance)
    assert out.size == 4 and m["d3s/rows"] == 4
    for g in (0, 1):
        assert sorted(out.rewards[out.group_index == g].tolist()) == [0.0, 1.0]
    before = int((out.attention_mask.sum(1) - 2).sum())  # completion tokens of the kept rows (prompts are 2 ids)
    assert out.num_loss_tokens == int(out.loss_mask.sum()) == math.ceil(0.5 * before)
    assert m["d3s/token_frac"] == pytest.approx(out.num_loss_tokens / before)
    assert out.num_sequences == int((out.loss_mask.sum(1) > 0).sum())
    assert m["d3s/adv_var_after"] >= m["d3s/adv_var_before"]
    full, m1 = apply(batch, ent, step=6, train_steps=10, opts=Options())  # past the ramp: unchanged
    assert full.size == 8 and full.num_loss_tokens == batch.num_loss_tokens and m1["d3s/rows"] == 0


def test_sampler_entropy_missing_gives_none():
    rows, rewards, gidx = _rows()
    rows[3] = Rollout("p0", (1, 5), (10, 11), (-0.1, -0.1), "stop", 0)
    batch = collate(rows, rewards, gidx, grpo(rewards, gidx), 0)
    assert sampler_entropy(rows, batch) is None


def test_hf_backend_records_the_sampling_entropy():
    from rollwise.backends.hf import HFBackend
    from rollwise.trainer.tiny import build_tiny
    from rollwise.types import Sampling

    model, tok = build_tiny("tiny-s", seed=1)
    b = HFBackend(model.eval(), [tok.eos_token_id], tok.pad_token_id, max_batch=8, seed=0)
    seq = [tok.bos_token_id] + tok.encode("12+34=")
    assert b.generate([seq], Sampling(1.0, 1.0, 4))[0].entropies is None  # off by default
    b.record_entropy = True
    c = b.generate([seq, seq], Sampling(0.7, 1.0, 4))[0]
    full = torch.tensor([seq + list(c.token_ids)])
    with torch.no_grad():
        logp = torch.log_softmax(model(full).logits[0].float() / 0.7, -1)[len(seq) - 1 : -1]
    expect = -(logp.exp() * logp).sum(-1)
    assert torch.allclose(torch.tensor(c.entropies), expect[: len(c.token_ids)], atol=1e-4)


# ---------------------------------------------------------------- config and a training run


def test_config_options_are_validated_with_the_key():
    from rollwise.config import load_config
    from rollwise.registry import UserError

    assert load_config().batch.d3s.enabled is False  # default unchanged
    with pytest.raises(UserError, match="batch.d3s.sample_start"):
        load_config(overrides=["batch.d3s.sample_start=0"])
    with pytest.raises(UserError, match="batch.d3s.token_scope"):
        load_config(overrides=["batch.d3s.token_scope='row'"])


def test_d3s_trains_and_logs(tmp_path):
    import rollwise
    from conftest import as_sets, tiny_overrides
    from rollwise.config import load_config

    cfg = load_config(
        overrides=as_sets(tiny_overrides(tmp_path, steps=2, **{"eval.at_start": False}))
        + ["batch.d3s.enabled=true", "batch.d3s.ramp_steps=4"]
    )
    rollwise.train(cfg, log=lambda m: None)
    lines = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    assert [x["d3s/rho_s"] for x in lines] == [0.5, 0.625]
    assert lines[0]["d3s/rows"] == 8  # 4 groups of 4 -> 2 kept each
    assert lines[0]["d3s/entropy_from_trainer"] == 0.0  # the hf backend recorded entropies
    assert lines[0]["cost/trained_tokens"] > 0


def test_d3s_without_sampler_entropies_uses_the_trainer(tmp_path):
    import rollwise
    from conftest import as_sets, tiny_overrides
    from rollwise.backends.scripted import ScriptedBackend
    from rollwise.config import load_config
    from rollwise.trainer.tiny import char_tokenizer

    tok = char_tokenizer()
    backend = ScriptedBackend(lambda seq, i: tok.encode(str(i % 3)), eos_id=tok.eos_token_id)
    cfg = load_config(
        overrides=as_sets(tiny_overrides(tmp_path, steps=1, **{"eval.at_start": False})) + ["batch.d3s.enabled=true"]
    )
    rollwise.train(cfg, backend=backend, log=lambda m: None)
    line = json.loads((tmp_path / "t" / "metrics.jsonl").read_text().splitlines()[0])
    assert line["d3s/entropy_from_trainer"] == 1.0


def test_d3s_makes_no_entropy_forward_after_the_ramp_and_times_it_as_training(tmp_path, monkeypatch):
    import time

    import rollwise
    from conftest import as_sets, tiny_overrides
    from rollwise.backends.scripted import ScriptedBackend
    from rollwise.config import load_config
    from rollwise.trainer.tiny import char_tokenizer
    from rollwise.trainer.trainer import Trainer

    calls = []
    real = Trainer.token_entropy

    def spy(self, batch):
        calls.append(len(calls))
        if len(calls) > 1:  # rho_k = 1 from step 1 on: no forward may be made
            raise AssertionError("token_entropy called after the ramp")
        time.sleep(0.5)  # visible in time/train_s
        return real(self, batch)

    monkeypatch.setattr(Trainer, "token_entropy", spy)
    tok = char_tokenizer()
    backend = ScriptedBackend(lambda seq, i: tok.encode(str(i % 3)), eos_id=tok.eos_token_id)  # no sampler entropies
    cfg = load_config(
        overrides=as_sets(tiny_overrides(tmp_path, steps=3, **{"eval.at_start": False}))
        + ["batch.d3s.enabled=true", "batch.d3s.ramp_steps=1"]
    )
    rollwise.train(cfg, backend=backend, log=lambda m: None)
    lines = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    assert len(calls) == 1 and [x["d3s/rho_k"] for x in lines] == [0.5, 1.0, 1.0]
    assert [x["d3s/entropy_from_trainer"] for x in lines] == [1.0, 0.0, 0.0]
    assert lines[0]["time/train_s"] >= 0.5  # the down-sampling (entropy forward) counts as training time
