"""ARRoL (allocation.md §10): the balance-seeking pruning rule, the quality head, the decode hook,
the pool wrapper's accounting, checkpoint state and a training run."""

import itertools
import json
import math
import random

import pytest
import torch

from rollwise.generate.arrol import (
    ArrolPool,
    Options,
    PruneHook,
    QualityHead,
    auc,
    balanced_subset,
    check_step,
    trim_surplus,
)
from rollwise.types import Plan, Prompt, Request, Sampling, Verdict


def _dist(q, idx, rho):
    return abs(sum(q[i] for i in idx) / len(idx) - rho)


# ---------------------------------------------------------------- pruning rule


def test_balanced_subset_by_hand():
    q = [0.9, 0.8, 0.2, 0.7, 0.1, 0.3]
    kept = balanced_subset(q, 2, 0.5)
    assert len(kept) == 2 and _dist(q, kept, 0.5) < 1e-9  # e.g. {0.8, 0.2}: mean exactly 0.5
    # an easy prompt (all predictions high): the most likely failures are kept alongside
    q = [0.95, 0.9, 0.9, 0.85, 0.6, 0.55]
    assert sorted(q[i] for i in balanced_subset(q, 2, 0.5)) == [0.55, 0.6]
    assert balanced_subset(q, 6) == list(range(6)) and balanced_subset(q, 0) == []


def test_balanced_subset_exact_size_and_never_worse_than_the_spec_greedy():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(2, 16)
        q = [rng.random() for _ in range(n)]
        k = rng.randint(1, n)
        kept = balanced_subset(q, k, 0.5)
        assert len(kept) == k == len(set(kept))
        order = sorted(range(n), key=lambda i: q[i])
        greedy = order[n - k // 2 :] + order[: k - k // 2] if k // 2 else order[:k]
        assert _dist(q, kept, 0.5) <= _dist(q, greedy, 0.5) + 1e-12
        if math.comb(n, k) <= 256:  # small groups: the brute-force optimum
            best = min(_dist(q, s, 0.5) for s in itertools.combinations(range(n), k))
            assert _dist(q, kept, 0.5) == pytest.approx(best, abs=1e-9)
        else:  # larger ones: no single swap improves the heuristic's choice
            out = [i for i in range(n) if i not in kept]
            assert all(
                _dist(q, [x for x in kept if x != a] + [b], 0.5) >= _dist(q, kept, 0.5) - 1e-12
                for a in kept
                for b in out
            )


def test_survivors_closer_to_rho_than_all_when_a_subset_allows_it():
    # binary-like predictions with both kinds present: the survivors' mean is rho exactly
    q = [0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.1, 0.1]  # all-rollout mean 0.7
    kept = balanced_subset(q, 4, 0.5)
    assert _dist(q, kept, 0.5) < _dist(q, range(8), 0.5) and _dist(q, kept, 0.5) < 1e-9
    # the spec's property cannot hold everywhere (granularity): mean of all 0.25, pairs 0 or 0.5
    q = [0.0, 0.0, 0.0, 1.0]
    assert _dist(q, balanced_subset(q, 2, 0.3), 0.3) == pytest.approx(0.2)


def test_equal_predictions_keep_any_subset_of_the_right_size():
    assert len(balanced_subset([0.5] * 8, 4, 0.5)) == 4


def test_auc_by_hand():
    assert auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0.0, 0, 1, 1])) == 0.75
    assert auc(torch.tensor([0.2, 0.2]), torch.tensor([0.0, 1.0])) == 0.5
    assert auc(torch.tensor([0.2, 0.3]), torch.tensor([1.0, 1.0])) is None


# ---------------------------------------------------------------- quality head


def _toy(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return x, (x[:, 0] + 0.5 * x[:, 1] > 0).float()


def test_head_learns_a_separable_toy_signal():
    head = QualityHead(Options(head_steps=20, min_examples=100, min_auc=0.9), seed=0)
    losses = []
    for step in range(6):
        x, y = _toy(64, step)
        head.update(x, y)
        losses.append(head.last_loss)
    assert losses[-1] < losses[0] < math.log(2) + 0.05
    x, y = _toy(500, 99)
    assert auc(head.predict(x), y) > 0.97
    assert head.trusted() and head.auc > 0.9  # prequential AUC on each new batch
    mlp = QualityHead(Options(head="mlp", head_steps=30), seed=0)
    first = mlp.update(*_toy(128, 0))["arrol/head_loss"]
    for s in range(1, 4):
        mlp.update(*_toy(128, s))
    assert mlp.last_loss < first


def test_head_is_untrusted_until_min_examples_and_min_auc():
    head = QualityHead(Options(min_examples=10, min_auc=0.99))
    assert not head.trusted() and head.predict(torch.zeros(3, 4)).tolist() == [0.5] * 3
    g = torch.Generator().manual_seed(0)
    head.update(torch.randn(40, 4, generator=g), (torch.rand(40, generator=g) > 0.5).float())  # noise
    head.update(torch.randn(40, 4, generator=g), (torch.rand(40, generator=g) > 0.5).float())
    assert head.seen == 80 and not head.trusted()


def test_head_state_round_trip():
    opts = Options(head="mlp", head_steps=5)
    head = QualityHead(opts, seed=3)
    for s in range(3):
        head.update(*_toy(32, s))
    state = head.state_dict()
    import io

    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    other = QualityHead(opts, seed=7)
    other.load_state_dict(torch.load(buf, weights_only=False))
    x, y = _toy(16, 50)
    assert torch.equal(other.predict(x), head.predict(x))
    assert (other.auc, other.seen, other.trusted()) == (head.auc, head.seen, head.trusted())
    head.update(x, y), other.update(x, y)  # optimiser state came along: identical next step
    assert torch.allclose(other.predict(x), head.predict(x))


# ---------------------------------------------------------------- decode hook


class _Scores:
    """A stand-in head: the predicted success is the feature's first coordinate."""

    def predict(self, x):
        return x[:, 0]


def test_prune_hook_keeps_balanced_survivors_on_a_scripted_example():
    # one group of 8 started for n = 4; rows 0..7; row 5 finished before the check point
    hook = PruneHook(2, [(list(range(8)), 4)], _Scores(), True, 0.5)
    assert hook.wants(2) and not hook.wants(1)
    scores = torch.tensor([0.9, 0.8, 0.85, 0.1, 0.2, 0.5, 0.95, 0.15])
    alive = torch.tensor([True] * 5 + [False] + [True] * 2)
    stop = hook(2, torch.arange(8), scores[:, None].repeat(1, 3), alive)
    kept = [i for i in range(8) if alive[i] and not stop[i]]
    # 1 finished + 3 running survivors, the triple of running rows with mean closest to 0.5
    # (brute force over the 7 running rows)
    running = [i for i in range(8) if alive[i]]
    best = min(abs(sum(float(scores[i]) for i in c) / 3 - 0.5) for c in itertools.combinations(running, 3))
    assert len(kept) == 3 and not bool(stop[5])
    assert abs(sum(float(scores[i]) for i in kept) / 3 - 0.5) == pytest.approx(best, abs=1e-6)
    assert hook.pruned == {i for i in range(8) if bool(stop[i])} and len(hook.pruned) == 4
    assert set(hook.features) == {i for i in range(8) if alive[i]}


def test_prune_hook_shares_the_quota_of_a_group_split_over_chunks():
    hook = PruneHook(1, [(list(range(8)), 4)], _Scores(), True, 0.5)
    s = torch.tensor([0.9, 0.1, 0.8, 0.2, 0.7, 0.3, 0.6, 0.4])[:, None]
    first = hook(1, torch.arange(0, 6), s[:6], torch.ones(6, dtype=torch.bool))  # 6 of 8 rows: round(4 * 6/8) = 3
    second = hook(1, torch.arange(6, 8), s[6:], torch.ones(2, dtype=torch.bool))  # the remaining quota: 1
    assert int((~first).sum()) == 3 and int((~second).sum()) == 1


def test_prune_hook_inactive_only_collects_features():
    hook = PruneHook(1, [([0, 1, 2], 3)], _Scores(), False, 0.5)
    assert hook(1, torch.arange(3), torch.rand(3, 4), torch.tensor([True, False, True])) is None
    assert set(hook.features) == {0, 2} and not hook.pruned


def test_trim_surplus_cuts_every_unit_to_n_keep():
    # the hook never fired (every row finished before L_p): the first N_keep rows in row order
    hook = PruneHook(1, [(list(range(8)), 4), (list(range(8, 11)), 4)], _Scores(), True, 0.5)
    units = [(list(range(8)), 4), (list(range(8, 11)), 4)]
    assert trim_surplus(units, hook, _Scores(), 0.5) == {4, 5, 6, 7}  # the 3-row unit is under quota
    # 5 of 8 finished before the check point: the hook keeps them all (no running row); one too many
    hook = PruneHook(2, [(list(range(8)), 4)], _Scores(), True, 0.5)
    hook(2, torch.arange(8), torch.rand(8, 3), torch.tensor([False] * 5 + [True] * 3))
    assert hook.pruned == {5, 6, 7} and trim_surplus([(list(range(8)), 4)], hook, _Scores(), 0.5) == {4}
    # split over chunks: chunk 0..3 checked (row 0 finished, 1 of its 2 quota running), chunk 4..7 all finished early
    hook = PruneHook(2, [(list(range(8)), 4)], _Scores(), True, 0.5)
    hook(2, torch.arange(4), torch.tensor([0.0, 0.9, 0.5, 0.1])[:, None], torch.tensor([False, True, True, True]))
    assert hook.pruned == {1, 3}  # kept row 2 (q = 0.5)
    assert trim_surplus([(list(range(8)), 4)], hook, _Scores(), 0.5) == {2, 7}  # finished rows first, in row order
    # scored survivors beyond the quota are chosen by the balanced rule on the head's predictions
    hook = PruneHook(1, [(list(range(6)), 2)], _Scores(), False, 0.5)
    hook(1, torch.arange(6), torch.tensor([0.9, 0.95, 0.8, 0.1, 0.85, 0.7])[:, None], torch.ones(6, dtype=torch.bool))
    assert trim_surplus([(list(range(6)), 2)], hook, _Scores(), 0.5) == {1, 2, 4, 5}  # keeps {0.9, 0.1}: mean 0.5


# ---------------------------------------------------------------- with the hf backend


@pytest.fixture(scope="module")
def tiny():
    from rollwise.trainer.tiny import build_tiny

    model, tok = build_tiny("tiny-s", seed=1)
    return model.eval(), tok


class _NoEOS(torch.nn.Module):
    """The tiny model with EOS forbidden, so every row runs to max_new_tokens."""

    def __init__(self, model, eos):
        super().__init__()
        self.model, self.eos = model, eos
        self.config = model.config

    def forward(self, **kw):
        out = self.model(**kw)
        out.logits[..., self.eos] -= 1e4
        return out


class _StopRows:
    def __init__(self, at, rows):
        self.at, self.rows, self.seen = at, rows, None

    def wants(self, t):
        return t == self.at

    def __call__(self, t, rows, hidden, alive):
        self.seen = (rows.tolist(), tuple(hidden.shape))
        return torch.tensor([r in self.rows for r in rows.tolist()])


def test_hf_decode_hook_stops_rows_and_leaves_the_others_alone(tiny):
    from rollwise.backends.hf import HFBackend

    model, tok = tiny
    b = HFBackend(_NoEOS(model, tok.eos_token_id), [tok.eos_token_id], tok.pad_token_id, max_batch=3)
    seqs = [[1] + tok.encode(f"{i}+{i}=") for i in range(5)]
    plain = b.generate(seqs, Sampling(0.0, 1.0, 6))
    hook = _StopRows(2, {1, 3})
    cut = b.generate(seqs, Sampling(0.0, 1.0, 6), decode_hook=hook)
    assert hook.seen == ([3, 4], (2, model.config.hidden_size))  # last chunk: global row ids 3, 4
    for i in range(5):
        if i in (1, 3):
            assert cut[i].finish == "partial" and cut[i].token_ids == plain[i].token_ids[:2]
        else:  # the cut rows left the batch (KV-cache compaction): the others' floats may round differently
            assert (cut[i].token_ids, cut[i].finish) == (plain[i].token_ids, plain[i].finish)
            assert cut[i].logprobs == pytest.approx(plain[i].logprobs, abs=1e-5)


class _OnlyEOS(torch.nn.Module):
    """The tiny model forced to end at once: every completion is the single EOS token."""

    def __init__(self, model, eos):
        super().__init__()
        self.model, self.eos = model, eos
        self.config = model.config

    def forward(self, **kw):
        out = self.model(**kw)
        keep = out.logits[..., self.eos].clone()
        out.logits[...] = -1e4
        out.logits[..., self.eos] = keep
        return out


def _pool(tiny, max_new_tokens=6, wrap=_NoEOS, max_batch=64):
    from rollwise.backends.hf import HFBackend
    from rollwise.distributed.local import LocalPool
    from rollwise.tokens import Codec

    model, tok = tiny
    backend = HFBackend(wrap(model, tok.eos_token_id), [tok.eos_token_id], tok.pad_token_id, max_batch=max_batch)
    verify = lambda p, text: Verdict(float(text[:1] in "13579"), "scripted")  # noqa: E731
    return LocalPool(backend, Codec(tok, use_chat=False), verify, Sampling(1.0, 1.0, max_new_tokens), max_batch=64)


def _plan(n_prompts, n):
    return Plan(tuple(Request(Prompt(f"p{i}", "arithmetic", f"{i}+{i}=", str(2 * i)), n) for i in range(n_prompts)))


def test_pool_prunes_to_n_and_charges_every_generated_token(tiny):
    pool = ArrolPool(_pool(tiny), Options(check_tokens=2, min_examples=0, min_auc=0.0), max_new_tokens=6)
    pool.head.update(torch.randn(8, tiny[0].config.hidden_size), torch.tensor([0.0, 1] * 4))  # trained -> trusted
    assert pool.head.trusted()
    groups = pool.generate(_plan(3, 4), [], version=0)
    cost = pool.take_cost()
    n0, n, lp, lmax = 8, 4, 2, 6
    assert [g.size for g in groups] == [n] * 3  # no row finishes early (EOS forbidden): exactly N_keep survive
    # every started row generated L_p tokens, every survivor L_max: N_0 * L_p + N_keep * (L_max - L_p) per prompt
    assert cost.generated_tokens == 3 * (n0 * lp + n * (lmax - lp))
    assert cost.rollouts == 3 * n0 and cost.verifier_calls == 3 * n
    assert cost.metrics["arrol/pruned"] == 3 * (n0 - n) and cost.metrics["arrol/pruned_tokens"] == 3 * (n0 - n) * lp
    assert cost.metrics["arrol/active"] == 1.0
    assert all(r.finish == "length" and len(r.completion_ids) == lmax for g in groups for r in g.rollouts)


def test_pool_keeps_exactly_n_when_rows_finish_before_the_check_point(tiny):
    # every completion ends (EOS) before the check point: the hook never fires, all N_0 finish
    pool = ArrolPool(
        _pool(tiny, wrap=_OnlyEOS, max_batch=5), Options(check_tokens=1, min_examples=0, min_auc=0.0), max_new_tokens=6
    )
    pool.head.update(torch.randn(8, tiny[0].config.hidden_size), torch.tensor([0.0, 1] * 4))
    calls = []
    verify = pool.pool.verify
    pool.pool.verify = lambda p, text: calls.append(p.id) or verify(p, text)
    groups = pool.generate(_plan(3, 4), [], version=0)
    cost = pool.take_cost()
    assert [g.size for g in groups] == [4, 4, 4]
    assert cost.generated_tokens == 3 * 8 and cost.rollouts == 3 * 8  # the 4 extras per group were generated: charged
    assert cost.metrics["arrol/surplus"] == 3 * 4 and cost.metrics["arrol/surplus_tokens"] == 3 * 4
    assert cost.metrics["arrol/pruned"] == 0
    assert cost.verifier_calls == len(calls) == 3 * 4  # the extras are not verified
    assert all(r.completion_ids == (tiny[1].eos_token_id,) for g in groups for r in g.rollouts)


def test_pool_before_the_head_is_trusted_generates_n_and_learns(tiny):
    pool = ArrolPool(_pool(tiny), Options(check_tokens=2, min_examples=1000), max_new_tokens=6)
    groups = pool.generate(_plan(2, 3), [], version=0)
    cost = pool.take_cost()
    assert [g.size for g in groups] == [3, 3] and cost.generated_tokens == 6 * 6 and cost.metrics["arrol/pruned"] == 0
    assert pool.head.seen == 6 and cost.metrics["arrol/active"] == 0.0
    # evaluation goes through the wrapped pool, unpruned and uncharged
    out = pool.rollouts(_plan(1, 2), 0, charge=False)
    assert len(out) == 2 and pool.take_cost().generated_tokens == 0


def test_pool_state_round_trip(tiny):
    a = ArrolPool(_pool(tiny), Options(check_tokens=2, head_steps=3), max_new_tokens=6)
    a.generate(_plan(2, 4), [], version=0)
    b = ArrolPool(_pool(tiny), Options(check_tokens=2, head_steps=3), max_new_tokens=6)
    b.load_state_dict(a.state_dict())
    x = torch.randn(5, tiny[0].config.hidden_size)
    assert torch.equal(a.head.predict(x), b.head.predict(x)) and b.head.seen == a.head.seen == 8


def test_pool_refuses_a_backend_without_decode_hooks():
    from rollwise.backends.scripted import ScriptedBackend
    from rollwise.distributed.local import LocalPool
    from rollwise.registry import UserError

    pool = LocalPool(ScriptedBackend(lambda s, i: [5], eos_id=2), None, None, Sampling())
    with pytest.raises(UserError, match="decode hooks"):
        ArrolPool(pool, Options(), 8)


# ---------------------------------------------------------------- config and a training run


def test_config_validation_names_the_key():
    from rollwise.config import load_config
    from rollwise.registry import UserError

    assert load_config().sampling.arrol.enabled is False
    assert check_step(Options(), 8) == 2 and check_step(Options(check_tokens=3), 8) == 3
    with pytest.raises(UserError, match="sampling.arrol.check_tokens"):
        load_config(overrides=["sampling.arrol.enabled=true", "sampling.arrol.check_tokens=8"])
    with pytest.raises(UserError, match="sampling.arrol.target_ratio"):
        load_config(overrides=["sampling.arrol.target_ratio=1.0"])
    with pytest.raises(UserError, match="sampling.latr"):
        load_config(overrides=["sampling.arrol.enabled=true", "sampling.latr.enabled=true"])


def test_arrol_trains_prunes_and_checkpoints_the_head(tmp_path):
    import rollwise
    from conftest import as_sets, tiny_overrides
    from rollwise.config import load_config

    cfg = load_config(
        overrides=as_sets(tiny_overrides(tmp_path, steps=3, **{"eval.at_start": False}))
        + [
            "sampling.arrol.enabled=true",
            "sampling.arrol.check_tokens=1",
            "sampling.arrol.min_examples=0",
            "sampling.arrol.min_auc=0.0",
        ]
    )
    rollwise.train(cfg, log=lambda m: None)
    lines = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["arrol/active"] == 0.0 and lines[0]["arrol/pruned"] == 0  # no head yet
    assert lines[1]["arrol/active"] == 1.0 and lines[1]["arrol/started"] == 4 * 8
    assert lines[1]["arrol/pruned"] + lines[1]["arrol/surplus"] == 4 * (8 - 4)  # exactly N_keep = 4 per group survive
    assert lines[1]["arrol/pruned"] > 0 and lines[1]["control/rollouts_per_prompt_max"] <= 4
    step_tokens = lines[1]["cost/generated_tokens"] - lines[0]["cost/generated_tokens"]
    assert step_tokens <= 4 * (8 * 1 + 4 * (cfg.sampling.max_new_tokens - 1))
    state = torch.load(tmp_path / "t" / "checkpoints" / "step-3" / "state.pt", weights_only=False)
    assert 0 < state["arrol"]["head"]["seen"] <= lines[-1]["cost/verifier_calls"]  # rows running at the check point
