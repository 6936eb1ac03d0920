"""POLARIS/SkyRL "replace" dynamic sampling (filter/replace.py, control/rounds.py; docs/specs/selection.md
§4): the §4.6 properties on hand-made batches, the loss/advantage side effects worked by hand, the
wrapper's gate / discard / limit, the config switch, and the real loop with a scripted backend."""

import json
import random
from collections import Counter

import pytest

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.backends.scripted import ScriptedBackend
from rollwise.collate import collate, flatten
from rollwise.components import build_filters
from rollwise.config import load_config
from rollwise.control.rounds import DynamicSampling, target_groups
from rollwise.control.uniform import Uniform
from rollwise.filter.chain import apply_filters
from rollwise.filter.replace import is_zv, passes_gate, pick_sources, replace_bad
from rollwise.objectives import ADVANTAGES
from rollwise.registry import UserError
from rollwise.types import Group, Prompt, Rollout, RunState, Verdict


def _group(uid, scores, length=2):
    p = Prompt(uid, "t", uid, "0")
    return Group(
        p, tuple(Rollout(uid, (1,), (2,) * length, (-1.0,) * length, "stop", 0, "", Verdict(s)) for s in scores)
    )


def _uids(groups):
    return [g.prompt.id for g in groups]


def _rows(groups):
    return sum(g.size for g in groups)


# ------------------------------------------------------------------ §4.6 on one batch


@pytest.mark.parametrize("merge", [True, False])
def test_basic_replace(merge):
    # B = 3, n = 2: [1,2] and [3,4] are good, [1,1] is bad; 2 > 0.3 * 3 = 0.9 -> replace
    batch = [_group("uid1", [1, 2]), _group("uid2", [1, 1]), _group("uid3", [3, 4])]
    res = replace_bad(batch, random.Random(0), 0.3, merge=merge)
    assert not res.keep_sampling and res.replaced == 1 and res.distinct == 2
    assert _rows(res.groups) == 6 and "uid2" not in _uids(res.groups)
    assert set(_uids(res.groups)) == {"uid1", "uid3"}
    assert len(res.groups) == (2 if merge else 3)  # merged into its source, or a group of its own in uid2's slot


def test_gate():
    # all bad -> keep sampling, output unchanged
    batch = [_group(f"u{i}", [1, 1]) for i in range(4)]
    res = replace_bad(batch, random.Random(0), 0.3)
    assert res.keep_sampling and res.groups == batch and res.replaced == 0
    # B = 10 with 3 good: 3 > 3.0 is false -> regenerate; 4 good: 4 > 3.0 -> replace
    assert not passes_gate(3, 10, 0.3) and passes_gate(4, 10, 0.3)
    three = [_group(f"g{i}", [0, 1]) for i in range(3)] + [_group(f"b{i}", [0, 0]) for i in range(7)]
    assert replace_bad(three, random.Random(0), 0.3).keep_sampling
    four = [_group(f"g{i}", [0, 1]) for i in range(4)] + [_group(f"b{i}", [0, 0]) for i in range(6)]
    assert not replace_bad(four, random.Random(0), 0.3).keep_sampling


def test_groups_of_one_are_good_and_unchanged():
    batch = [_group(f"u{i}", [float(i % 2)]) for i in range(4)]  # n = 1
    assert not any(is_zv(g) for g in batch)
    res = replace_bad(batch, random.Random(0), 0.3)
    assert res.groups == batch and res.replaced == 0 and not res.keep_sampling


@pytest.mark.parametrize("seed", range(5))
def test_source_selection(seed):
    # 5 good, 5 bad: a permutation -> each good group copied exactly once (merged: 2n rollouts each)
    batch = [_group(f"g{i}", [0, 1]) for i in range(5)] + [_group(f"b{i}", [1, 1]) for i in range(5)]
    res = replace_bad(batch, random.Random(seed), 0.3)
    assert [g.size for g in res.groups] == [4] * 5
    assert sorted(pick_sources(5, 5, random.Random(seed))) == [0, 1, 2, 3, 4]
    # 4 good, 6 bad: with replacement -> some good group is copied at least twice (6 copies > 4 groups)
    batch = [_group(f"g{i}", [0, 1]) for i in range(4)] + [_group(f"b{i}", [1, 1]) for i in range(6)]
    res = replace_bad(batch, random.Random(seed), 0.3)
    assert max(g.size for g in res.groups) >= 6 and _rows(res.groups) == 20
    assert max(Counter(pick_sources(4, 6, random.Random(seed))).values()) >= 2


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("merge", [True, False])
def test_output_invariants(seed, merge):
    rng = random.Random(100 + seed)
    B, n = 12, 4
    batch = [_group(f"u{i}", [float(rng.random() < 0.5) for _ in range(n)]) for i in range(B)]
    good = [g for g in batch if not is_zv(g)]
    res = replace_bad(batch, random.Random(seed), 0.3, merge=merge)
    if len(good) <= 0.3 * B:
        assert res.keep_sampling and res.groups == batch
        return
    assert not any(is_zv(g) for g in res.groups)
    assert _rows(res.groups) == B * n
    assert len(set(_uids(res.groups))) == len(good) == res.distinct


def test_loss_normalisation_counts_a_copy_twice():
    # B = 3, n = 2, 3 tokens per completion; one bad group -> 6 rows, 18 loss tokens, as a full batch
    batch = [_group("a", [0, 1], 3), _group("b", [0, 0], 3), _group("c", [1, 0], 3)]
    out = replace_bad(batch, random.Random(0), 0.3).groups
    rows, rewards, gidx = flatten(out)
    b = collate(rows, rewards, gidx, ADVANTAGES.get("grpo")(rewards, gidx), pad_id=0)
    assert b.num_sequences == 6 and b.num_loss_tokens == 18
    # one of the two good groups now has 4 rows: its tokens are 12/18 of the token-mean loss (6/18 before)
    assert sorted(Counter(gidx.tolist()).values()) == [2, 4]


def test_merged_advantage_by_hand():
    # n = 8, k = 4 (GRPO, unbiased std): std = sqrt(8 * .25 / 7) = 0.5345 -> A = ±0.5/0.5345 = ±0.935.
    # Merged to 16 samples: std = sqrt(16 * .25 / 15) = 0.5164 -> ±0.968 (= 0.935 / sqrt(2*7/15), +3.5%).
    good, bad = _group("g", [1, 0] * 4), _group("b", [0] * 8)
    grpo = ADVANTAGES.get("grpo")
    for groups, expected in (
        ([good], 0.5 / (2 / 7) ** 0.5),
        (replace_bad([good, bad], random.Random(0), 0.3).groups, 0.5 / (4 / 15) ** 0.5),
    ):
        _, r, g = flatten(groups)
        a = grpo(r, g, grpo.Options(eps=0.0)).values
        assert r.numel() == 16 or len(groups) == 1
        assert a.abs().tolist() == pytest.approx([expected] * r.numel(), rel=1e-5)
    assert 0.5 / (2 / 7) ** 0.5 == pytest.approx(0.935, abs=1e-3) and 0.5 / (4 / 15) ** 0.5 == pytest.approx(
        0.968, abs=1e-3
    )
    # population std and mean-only advantages are unchanged by the merge; a separate copy equals its source
    merged = replace_bad([good, bad], random.Random(0), 0.3).groups
    separate = replace_bad([good, bad], random.Random(0), 0.3, merge=False).groups
    for name, opts in (("grpo", grpo.Options(std="population")), ("dr_grpo", None)):
        fn = ADVANTAGES.get(name)
        base = fn(*flatten([good])[1:], opts).values.tolist()
        assert fn(*flatten(merged)[1:], opts).values.tolist() == pytest.approx(base * 2)
    _, r, g = flatten(separate)
    a = grpo(r, g).values.tolist()
    assert a[:8] == pytest.approx(a[8:])


# ------------------------------------------------------------------ the wrapper: gate, discard, limit

ZV = [
    'filter.names=["zero_variance"]',
    "control.prompts_per_step=4",
    "control.rollouts_per_prompt=2",
    "control.dynamic_sampling.enabled=true",
    'control.dynamic_sampling.type="replace"',
]


def _prompts(n):
    return [Prompt(f"p{i}", "t", f"{i}", "0") for i in range(n)]


def _wrapped(*overrides, prompts=40):
    cfg = load_config(overrides=ZV + list(overrides))
    return DynamicSampling(Uniform(_prompts(prompts), cfg.control, None, seed=0), build_filters(cfg), cfg.control), cfg


def _groups_for(plan, scores):
    return [_group(r.prompt.id, s) for r, s in zip(plan.requests, scores)]


def test_gate_passes_then_finish_replaces():
    ds, cfg = _wrapped()
    state = RunState(step=0, seed=0)
    plan = ds.plan(ds.select(state), state)
    groups = _groups_for(plan, [[1, 0], [0, 0], [1, 1], [0, 1]])  # 2 good > 1.2
    assert not ds.next_round(groups, state)
    kept, dropped = apply_filters(build_filters(cfg), groups, target_groups(cfg.control), ds)
    assert dropped == Counter({"all_wrong": 1, "all_correct": 1})
    assert len(kept) == 2 and _rows(kept) == 8  # both good groups copied once, merged
    assert ds.metrics == {
        "control/replace_replaced": 2.0,
        "control/replace_discarded_batches": 0.0,
        "control/replace_distinct_groups": 2.0,
    }


def test_gate_fails_discards_the_batch_and_draws_a_new_one():
    ds, cfg = _wrapped()
    state = RunState(step=3, seed=1)
    first = ds.plan(ds.select(state), state)
    groups = _groups_for(first, [[1, 0], [0, 0], [0, 0], [1, 1]])  # 1 good, not > 1.2
    second = ds.next_round(groups, state)
    assert second.total == 4 * 2 and not {r.prompt.id for r in second.requests} & {r.prompt.id for r in first.requests}
    groups += _groups_for(second, [[1, 0], [0, 1], [0, 1], [0, 0]])  # 3 good
    assert not ds.next_round(groups, state)
    kept, dropped = apply_filters(build_filters(cfg), groups, None, ds)
    # batch 1: its good group is dropped as discarded_batch (its bad ones keep their reasons)
    assert dropped == Counter({"all_wrong": 3, "all_correct": 1, "discarded_batch": 1})
    assert set(_uids(kept)) <= {r.prompt.id for r in second.requests} and len(kept) == 3 and _rows(kept) == 8
    assert ds.metrics["control/replace_discarded_batches"] == 1 and ds.metrics["control/replace_replaced"] == 1
    # the copies' choice is a function of (run seed, step): the same on a resumed run
    again, _ = apply_filters(build_filters(cfg), groups, None, ds)
    assert again == kept


def test_failure_limit_raises():
    ds, _ = _wrapped("control.dynamic_sampling.max_failed_batches=30", prompts=200)
    state = RunState()
    plan = ds.plan(ds.select(state), state)
    groups = []
    for _i in range(29):  # 29 failed gates: a new batch each time
        groups += _groups_for(plan, [[0, 0]] * 4)
        plan = ds.next_round(groups, state)
        assert plan.total == 8
    groups += _groups_for(plan, [[0, 0]] * 4)
    with pytest.raises(RuntimeError, match="max_failed_batches"):
        ds.next_round(groups, state)  # the 30th


def test_config_switch():
    cfg = load_config(overrides=['filter.names=["zero_variance"]', "control.dynamic_sampling.enabled=true"])
    assert cfg.control.dynamic_sampling.type == "refill" and target_groups(cfg.control) == 32  # default unchanged
    _, cfg = _wrapped()
    assert target_groups(cfg.control) is None  # no surplus truncation: the batch is B by construction
    with pytest.raises(UserError, match="target_groups"):
        load_config(overrides=ZV + ["control.dynamic_sampling.target_groups=2"])
    with pytest.raises(UserError, match="zero_variance"):
        load_config(overrides=ZV[1:] + ["filter.names=[]"])
    with pytest.raises(UserError, match="type"):
        load_config(overrides=ZV + ['control.dynamic_sampling.type="filter"'])
    shipped = load_config("configs/replace.toml")
    assert shipped.control.dynamic_sampling.type == "replace" and shipped.filter.names == ["zero_variance"]


# ------------------------------------------------------------------ the real loop, scripted answers


def _run(tmp_path, schedule, **extra):
    """One training step (4 prompts x 4 rollouts; replace) where ``schedule(call_index)`` says
    whether the scripted answer is right; returns the step's metrics line."""
    from rollwise.trainer.tiny import char_tokenizer

    tok = char_tokenizer()

    def respond(seq, i):
        a, b = tok.decode(seq, skip_special_tokens=True).rstrip("=").replace("-", "+-").split("+")[:2]
        ans = int(a) + int(b)
        return tok.encode(str(ans if schedule(i) else ans + 1))

    o = tiny_overrides(
        tmp_path,
        steps=1,
        **{
            "filter.names": ["zero_variance"],
            "eval.at_start": False,
            "model.warm_start.steps": 0,
            "eval.n_prompts": 2,
            "control.dynamic_sampling.enabled": True,
            "control.dynamic_sampling.type": "replace",
            **extra,
        },
    )
    result = rollwise.train(
        load_config(overrides=as_sets(o)), backend=ScriptedBackend(respond, tok.eos_token_id), log=lambda m: None
    )
    return json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[0])


def test_loop_replaces_in_one_round(tmp_path):
    # calls 0-7 alternate right/wrong (groups 1-2 good), 8-15 wrong (groups 3-4 bad): 2 > 1.2 -> replace
    m = _run(tmp_path, lambda i: i % 2 == 0 if i < 8 else False)
    assert m["control/rounds"] == 1 and m["cost/rollouts"] == 16
    assert m["filter/all_wrong"] == 2 and m["control/replace_replaced"] == 2
    assert m["control/replace_distinct_groups"] == 2 and m["control/replace_discarded_batches"] == 0
    # the two good groups are trained twice each: as many loss tokens as 4 groups of their length
    assert m["cost/trained_tokens"] > 0


def test_loop_discards_a_batch_that_fails_the_gate(tmp_path):
    # batch 1 (calls 0-15): all wrong -> 0 good -> discarded; batch 2 (16-31) alternates -> all good
    m = _run(tmp_path, lambda i: i >= 16 and i % 2 == 0)
    assert m["control/rounds"] == 2 and m["cost/rollouts"] == 32 == m["control/budget_used"]
    assert m["filter/all_wrong"] == 4 and m["control/replace_discarded_batches"] == 1
    assert m["control/replace_replaced"] == 0 and m["control/replace_distinct_groups"] == 4
    assert m["groups/count"] == 8


def test_no_fresh_prompts_left_trains_on_nothing():
    # 8 train prompts, 4 per batch: after 2 discarded batches every prompt was generated this step
    ds, cfg = _wrapped("control.dynamic_sampling.max_failed_batches=-1", prompts=8)
    state = RunState()
    plan = ds.plan(ds.select(state), state)
    groups = _groups_for(plan, [[0, 0]] * 4)
    plan = ds.next_round(groups, state)
    groups += _groups_for(plan, [[1, 1]] * 4)
    assert not ds.next_round(groups, state)
    kept, dropped = apply_filters(build_filters(cfg), groups, None, ds)
    assert kept == [] and dropped == Counter({"all_wrong": 4, "all_correct": 4})
    assert ds.metrics["control/replace_discarded_batches"] == 2
