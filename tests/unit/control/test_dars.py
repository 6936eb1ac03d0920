"""DARS / DARS-B (control/dars.py, docs/specs/allocation.md §1): the ΔN schedule worked by hand, the
§1.6 properties, the two-stage controller with its budget and state, and the real loop with a
scripted backend where groups of different sizes reach the trainer."""

import json
import math

import pytest
import torch

import rollwise
from conftest import as_sets, scripted_arithmetic, tiny_overrides
from rollwise.config import load_config
from rollwise.control import REGISTRY
from rollwise.control.dars import DARS, DARSB, extra_rollouts
from rollwise.filter.basic import zero_variance
from rollwise.objectives import ADVANTAGES
from rollwise.types import Group, Prompt, Rollout, RunState, Verdict


def _prompts(n):
    return [Prompt(f"p{i}", "t", f"{i}", "0") for i in range(n)]


def _group(prompt, scores, length=3):
    rs = tuple(Rollout(prompt.id, (1,), (2,) * length, (-1.0,) * length, "stop", 0, "", Verdict(s)) for s in scores)
    return Group(prompt, rs)


def _dars(*overrides, options=None, cls=DARS, prompts=20):
    cfg = load_config(overrides=["control.prompts_per_step=4", "control.rollouts_per_prompt=8", *overrides]).control
    return cls(_prompts(prompts), cfg, cls.Options(**(options or {})), seed=0)


# ------------------------------------------------------------------ the schedule, by hand

# docs/specs/allocation.md §1.2, N = 8. No-std: S(p) = 2p(1-p), A_peak = N/2 = 4.
#   k=0: p -> 0.5/8 = 1/16, S = 2(1/16)(15/16) = 15/128 = 0.1171875
#        ET: 4 / S = 34.13 -> ceil(34.13 - 8) = 27 -> capped at 32 - 8 = 24
#        HW: 2(15/16)4 / S = 7.5 / 0.1171875 = 64 -> 64 - 8 = 56 (= 64 - 8, the cap)
#   k=1: p = .125, S = .21875: ET 4/S = 18.29 -> 11;  HW 7/S = 32 -> 24
#   k=2: p = .25,  S = .375:   ET 10.67 -> 3;         HW 6/S = 16 -> 8
#   k=3: p = .375, S = .46875: ET 8.53 -> 1;          HW 5/S = 10.67 -> 3
# Std: S(p) = 2 sqrt(p(1-p)), A_peak = N = 8.
#   k=0: S = 2 sqrt(15/256) = .4841: ET 8/S = 16.52 -> 9;  HW 15/S = 30.98 -> 23
#   k=1: S = .6614: ET 12.10 -> 5;  HW 14/S = 21.17 -> 14
#   k=2: S = .8660: ET 9.24 -> 2;   HW 12/S = 13.86 -> 6
#   k=3: S = .9682: ET 8.26 -> 1;   HW 10/S = 10.33 -> 3
TABLE = [  # k, ET (N_max 32), HW (N_max 64), ET std, HW std
    (0, 24, 56, 9, 23),
    (1, 11, 24, 5, 14),
    (2, 3, 8, 2, 6),
    (3, 1, 3, 1, 3),
    (4, 0, 0, 0, 0),
    (5, 0, 0, 0, 0),
    (8, 0, 0, 0, 0),
]


@pytest.mark.parametrize("k,et,hw,et_std,hw_std", TABLE)
def test_delta_n_table_of_the_spec(k, et, hw, et_std, hw_std):
    p = k / 8
    assert extra_rollouts(p, 8, 32, "et", False) == et
    assert extra_rollouts(p, 8, 64, "hw", False) == hw
    assert extra_rollouts(p, 8, 32, "et", True) == et_std
    assert extra_rollouts(p, 8, 64, "hw", True) == hw_std


GRID = [i / 200 for i in range(1, 100)]  # (0, 0.5)


@pytest.mark.parametrize("std", [False, True])
@pytest.mark.parametrize("n,n_max", [(8, 32), (8, 64), (4, 16), (16, 512)])
def test_schedule_properties(n, n_max, std):
    for sched in ("et", "hw"):
        dn = [extra_rollouts(p, n, n_max, sched, std) for p in GRID]
        assert all(a >= b for a, b in zip(dn, dn[1:])), "ΔN is non-increasing on (0, 0.5)"
        assert all(0 <= d <= n_max - n for d in dn), "ΔN <= N_max - N"
        assert all(extra_rollouts(p, n, n_max, sched, std) == 0 for p in (0.5, 0.6, 0.99, 1.0))
        # p_hat = 0 is treated as half a success: same ΔN as p_hat = 0.5 / N (and below 1e-6)
        assert extra_rollouts(0.0, n, n_max, sched, std) == extra_rollouts(0.5 / n, n, n_max, sched, std)
        assert extra_rollouts(1e-7, n, n_max, sched, std) == extra_rollouts(0.0, n, n_max, sched, std)
    for p in GRID:
        assert extra_rollouts(p, n, n_max, "hw", std) >= extra_rollouts(p, n, n_max, "et", std), "HW >= ET"


def test_n_max_caps_and_never_goes_negative():
    # p = 1/16 with N = 8 asks for 27 (ET, uncapped) -> N_max = 20 allows 12; N_max < N gives 0
    assert extra_rollouts(0.0, 8, 10**6, "et", False) == 27
    assert extra_rollouts(0.0, 8, 20, "et", False) == 12
    assert extra_rollouts(0.0, 8, 8, "et", False) == 0
    assert extra_rollouts(0.0, 8, 4, "et", False) == 0
    with pytest.raises(ValueError, match="schedule"):
        extra_rollouts(0.1, 8, 32, "xx", False)


@pytest.mark.parametrize("n", [4, 8, 16])
def test_et_without_cap_reaches_the_peak_cumulative_advantage(n):
    # (N + ΔN) * 2p(1-p) >= N/2 for every p in (0, 0.5): the top-up lifts the prompt to p = 0.5's level
    for p in GRID:
        dn = extra_rollouts(p, n, 10**9, "et", False)
        assert (n + dn) * 2 * p * (1 - p) >= n / 2 - 1e-9
        # and std mode: (N + ΔN) * 2 sqrt(p(1-p)) >= N
        dn = extra_rollouts(p, n, 10**9, "et", True)
        assert (n + dn) * 2 * math.sqrt(p * (1 - p)) >= n - 1e-9


@pytest.mark.parametrize("k,n", [(1, 8), (3, 8), (2, 11), (5, 6)])
def test_cumulative_advantage_identity_for_mean_only_advantages(k, n):
    # dr_grpo: correct rows get 1 - p, wrong ones -p; sum |A| = k(1-p) + (n-k)p = 2 n p (1-p)
    # e.g. k=1, n=8: 7/8 + 7 * 1/8 = 1.75 = 2 * 8 * (1/8)(7/8)
    p = k / n
    r = torch.tensor([1.0] * k + [0.0] * (n - k))
    dr = ADVANTAGES.get("dr_grpo")
    a = dr(r, torch.zeros(n, dtype=torch.long), dr.Options()).values
    assert float(a.abs().sum()) == pytest.approx(2 * n * p * (1 - p))


# ------------------------------------------------------------------ the controller


def test_two_stages_then_stop():
    d = _dars()
    ps = d.select(None)
    plan = d.plan(ps, None)
    assert [r.n for r in plan.requests] == [8, 8, 8, 8]
    # stage 1: k = 0, 1, 4, 8 of 8 -> ΔN (ET, N_max 32) = 24, 11, 0, 0 (the table)
    groups = [_group(p, [1] * k + [0] * (8 - k)) for p, k in zip(ps, (0, 1, 4, 8))]
    top = d.next_round(groups, None)
    assert [(r.prompt.id, r.n) for r in top.requests] == [(ps[0].id, 24), (ps[1].id, 11)]
    # stage 2 merged in: no third round, even for groups that are still hard
    merged = [_group(ps[0], [0] * 32), _group(ps[1], [1] + [0] * 18)] + groups[2:]
    assert not d.next_round(merged, None)


def test_hw_std_and_breadth_options():
    d = _dars(options={"schedule": "hw", "std": True})
    assert d.n_max == 64
    ps = d.select(None)
    d.plan(ps, None)
    groups = [_group(p, [1] * k + [0] * (8 - k)) for p, k in zip(ps, (0, 1, 2, 3))]
    assert [r.n for r in d.next_round(groups, None).requests] == [23, 14, 6, 3]  # the table's HW std column
    b = _dars(cls=DARSB)
    assert len(b.select(None)) == 4 * 4 and b.budget == 16 * 32  # breadth 4 x 4 prompts; cap = prompts * N_max
    assert len(_dars(options={"breadth": 2}).select(None)) == 8
    assert REGISTRY.get("dars") is DARS and REGISTRY.get("dars_b") is DARSB


def test_groups_with_no_verified_rollout_or_not_from_stage_one_get_nothing():
    d = _dars()
    ps = d.select(None)
    d.plan(ps[:2], None)
    groups = [_group(ps[0], [None] * 8), _group(ps[1], [0] * 8), _group(ps[2], [0] * 8)]  # ps[2] never planned
    assert [(r.prompt.id, r.n) for r in d.next_round(groups, None).requests] == [(ps[1].id, 24)]


def test_budget_caps_both_stages_and_scales_top_ups():
    # budget 40: stage 1 = 4 x 8 = 32, stage 2 may add 8. Wanted: 24 (k=0) + 11 (k=1) + 3 (k=2) = 38.
    # Shares 8 * (24, 11, 3) / 38 = 5.05, 2.32, 0.63 -> floors 5, 2, 0 (7) -> the 1 left goes to
    # the largest remainder (0.63) -> (5, 2, 1), total 8: 32 + 8 = 40 = budget.
    d = _dars("control.budget_rollouts=40")
    ps = d.select(None)
    assert d.plan(ps, None).total == 32
    groups = [_group(p, [1] * k + [0] * (8 - k)) for p, k in zip(ps, (0, 1, 2, 4))]
    assert [r.n for r in d.next_round(groups, None).requests] == [5, 2, 1]
    # budget 20 < stage 1: the last prompts lose rollouts first (8, 8, 4), no top-up room
    d = _dars("control.budget_rollouts=20")
    ps = d.select(None)
    plan = d.plan(ps, None)
    assert [r.n for r in plan.requests] == [8, 8, 4]
    groups = [_group(r.prompt, [0] * r.n) for r in plan.requests]
    assert not d.next_round(groups, None)


def test_token_budget_for_the_top_up():
    # budget_tokens 200, max_new_tokens 5 (no data yet): stage 1 may plan floor(200 / 5) = 40 >= 32.
    # Stage-1 rollouts are 3 tokens long: used 96, L = 3 -> floor((200 - 96) / 3) = 34 more allowed,
    # wanted 24 + 24 + 24 + 24 (all wrong) = 96 -> scaled to 34 -> 8.5 each -> (9, 9, 8, 8)
    cfg = load_config(
        overrides=[
            "control.prompts_per_step=4",
            "control.rollouts_per_prompt=8",
            "control.budget_tokens=200",
            "sampling.max_new_tokens=5",
        ]
    ).control
    d = DARS(_prompts(10), cfg, None, seed=0)
    ps = d.select(None)
    assert d.plan(ps, None).total == 32
    groups = [_group(p, [0] * 8, length=3) for p in ps]
    top = d.next_round(groups, None)
    assert [r.n for r in top.requests] == [9, 9, 8, 8] and top.total == 34


def test_merge_and_filter_leaves_no_group_at_accuracy_zero_or_one():
    d = _dars(options={"schedule": "hw"})
    ps = d.select(None)
    d.plan(ps, None)
    stage1 = {p.id: [1] * k + [0] * (8 - k) for p, k in zip(ps, (0, 1, 8, 3))}
    top = d.next_round([_group(p, stage1[p.id]) for p in ps], None)
    # stage 2: prompt 0 finds one success, prompt 1 none, prompt 3 two
    extra = {ps[0].id: 1, ps[1].id: 0, ps[3].id: 2}
    merged = [
        _group(p, stage1[p.id] + [1] * extra.get(p.id, 0) + [0] * (n - extra.get(p.id, 0)))
        for p, n in [(r.prompt, r.n) for r in top.requests] + [(ps[2], 0)]
    ]
    kept = [g for g in merged if zero_variance(g).keep]
    accs = [sum(g.rewards()) / g.size for g in kept]
    assert all(0 < a < 1 for a in accs) and len(kept) == 3  # the all-correct prompt 2 is dropped
    assert {g.size for g in kept} == {8 + 56, 8 + 24, 8 + 3}


def _fake_step(ctrl, step, correct):
    """One step without a model: prompt i's rollout j is right when correct(i, j, round)."""
    st = RunState(step=step)
    prompts = ctrl.select(st)
    plan = ctrl.plan(prompts, st)
    groups, totals, rnd = {}, [], 0
    while plan:
        totals.append(plan.total)
        for r in plan.requests:
            old = groups.get(r.prompt.id, _group(r.prompt, []))
            new = _group(r.prompt, [float(correct(int(r.prompt.id[1:]), old.size + j, rnd)) for j in range(r.n)])
            groups[r.prompt.id] = Group(r.prompt, old.rollouts + new.rollouts)
        plan = ctrl.next_round(list(groups.values()), st)
        rnd += 1
    ctrl.observe(list(groups.values()), st)
    return totals, {pid: g.size for pid, g in groups.items()}


def test_state_round_trip_continues_identically():
    correct = lambda i, j, rnd: (i * 7 + j * 3 + rnd) % 5 == 0  # noqa: E731  mostly hard prompts
    a = _dars(options={"schedule": "hw"})
    for s in range(3):
        _fake_step(a, s, correct)
    saved = json.loads(json.dumps(a.state_dict()))  # plain data, as in a checkpoint
    b = _dars(options={"schedule": "hw"})
    b.load_state_dict(saved)
    assert b.history.records == a.history.records
    for s in range(3, 6):
        assert _fake_step(a, s, correct) == _fake_step(b, s, correct)


# ------------------------------------------------------------------ the real loop


def test_loop_tops_up_hard_prompts_and_trains_on_groups_of_different_sizes(tmp_path, trainer_batches):
    # 4 prompts x N = 4. Stage 1 (calls 0-15): group g has g of 4 right -> p_hat 0, .25, .5, .75.
    # ΔN (ET, no std, N = 4, A_peak = 2): p -> 0.5/4 = .125, S = .21875, 2/S = 9.14 -> 6;
    # p = .25, S = .375, 2/S = 5.33 -> 2; the others 0. Stage 2 (calls 16-23): even calls right, so
    # group 0 = 0/4 + 3/6 and group 1 = 1/4 + 1/2: both mixed; merged sizes 10, 6, 4, 4.
    schedule = lambda i: (i % 4) < (i // 4) if i < 16 else i % 2 == 0  # noqa: E731
    o = tiny_overrides(
        tmp_path,
        steps=1,
        **{
            "control.name": "dars",
            "filter.names": ["zero_variance"],
            "advantage.name": "dr_grpo",
            "eval.at_start": False,
            "model.warm_start.steps": 0,
            "eval.n_prompts": 2,
        },
    )
    result = rollwise.train(
        load_config(overrides=as_sets(o)), backend=scripted_arithmetic(schedule), log=lambda m: None
    )
    m = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert m["control/rounds"] == 2 and m["control/budget_used"] == 16 + 8 == m["cost/rollouts"]
    assert m["control/rollouts_per_prompt_min"] == 4 and m["control/rollouts_per_prompt_max"] == 10
    assert m["control/rollouts_per_prompt_p90"] == 10
    assert sorted(trainer_batches[0]) == [4, 4, 6, 10]  # groups of different sizes reach the trainer
    assert m["cost/trained_tokens"] > 0


def test_loop_resume_with_dars_matches_uninterrupted(tmp_path):
    """Checkpoint at step 2, resume to step 4 == 4 uninterrupted steps (controller state restored).
    Both runs evaluate at step 2 (eval.every = 2), as the 2-step run does when it ends, because the
    scripted backend's call counter (checkpointed) also advances during evaluation."""
    schedule = lambda i: (i * 7) % 5 == 0  # noqa: E731  hard prompts, top-ups every step
    base = tiny_overrides(
        tmp_path,
        steps=4,
        **{
            "control.name": "dars",
            "control.options": {"schedule": "hw"},
            "eval.at_start": False,
            "model.warm_start.steps": 0,
            "eval.every": 2,
            "eval.n_prompts": 2,
            "run.checkpoint_every": 2,
        },
    )
    full = rollwise.train(
        load_config(overrides=as_sets(dict(base, **{"run.name": "full"}))),
        backend=scripted_arithmetic(schedule),
        log=lambda m: None,
    )
    part = dict(base, **{"run.name": "part", "train.steps": 2})
    rollwise.train(load_config(overrides=as_sets(part)), backend=scripted_arithmetic(schedule), log=lambda m: None)
    resumed = rollwise.train(
        load_config(overrides=as_sets(dict(part, **{"train.steps": 4}))),
        resume=True,
        backend=scripted_arithmetic(schedule),
        log=lambda m: None,
    )

    def stable(d):
        return [
            {k: v for k, v in json.loads(x).items() if not k.startswith(("wall_s", "time/"))}
            for x in (d / "metrics.jsonl").read_text().splitlines()
        ]

    a, b = stable(full.run_dir), stable(resumed.run_dir)
    assert len(a) == 4 and a == b
    assert any(m["control/rounds"] == 2 for m in a)
