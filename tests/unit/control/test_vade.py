"""VADE (control/vade.py, allocation.md §5, [RECON]): Beta posteriors folded from the prompt
history with two-scale decay (worked by hand), Thompson selection (Monte-Carlo), no extra
rollouts, the step budget, checkpoint state, and a short loop run that resumes exactly."""

import json

import pytest

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.config import load_config
from rollwise.control.history import PromptHistory
from rollwise.control.vade import VADE, VADEOptions, posterior
from rollwise.types import Group, Prompt, Rollout, RunState, Verdict


def _prompts(n):
    return [Prompt(f"p{i}", "t", f"{i}", "0") for i in range(n)]


def _group(prompt, k, n):
    scores = [1.0] * k + [0.0] * (n - k)
    return Group(prompt, tuple(Rollout(prompt.id, (1,), (2,), (-1.0,), "stop", 0, "", Verdict(s)) for s in scores))


def _ctrl(*overrides, options=None, n=12):
    cfg = load_config(overrides=["control.prompts_per_step=3", "control.rollouts_per_prompt=4", *overrides]).control
    return VADE(_prompts(n), cfg, VADEOptions(**(options or {})), seed=0)


def test_posterior_after_observations_by_hand():
    # a0 = b0 = 1, lg = 0.99, ls = 0.7
    h = PromptHistory()
    p = _prompts(1)[0]
    h.record([_group(p, 3, 4)], step=0)
    opts = VADEOptions()
    # step 0: the global shrink leaves the prior as it is; visit: a = 0.7*1 + 3 = 3.7, b = 0.7*1 + 1 = 1.7
    assert posterior(h.of("p0"), 1, opts) == pytest.approx((3.7, 1.7))
    # selection at step 2 sees one more shrink (step 1): a = 1 + 0.99*2.7 = 3.673, b = 1 + 0.99*0.7 = 1.693
    assert posterior(h.of("p0"), 2, opts) == pytest.approx((3.673, 1.693))
    # revisit at step 2 with 0 of 4: the shrinks of steps 1 and 2 (0.99^2 = 0.9801), then the visit:
    # a = 0.7*(1 + 0.9801*2.7) + 0 = 0.7*3.64627 = 2.552389, b = 0.7*(1 + 0.9801*0.7) + 4 = 5.180249
    h.record([_group(p, 0, 4)], step=2)
    assert posterior(h.of("p0"), 3, opts) == pytest.approx((2.552389, 5.180249))
    # records at or after the selection step are not yet known to it
    assert posterior(h.of("p0"), 2, opts) == pytest.approx((3.673, 1.693))
    assert posterior([], 5, opts) == (1.0, 1.0)


def test_fold_equals_the_per_step_recursion():
    """The closed-form fold = shrinking every posterior every step, then adding the visits."""
    opts = VADEOptions(alpha0=2.0, beta0=0.5, global_decay=0.9, visit_decay=0.6)
    p = _prompts(1)[0]
    visits = {0: (2, 4), 1: (4, 4), 4: (1, 4), 5: (0, 8)}
    h, a, b = PromptHistory(), opts.alpha0, opts.beta0
    for step in range(8):
        a, b = 0.9 * a + 0.1 * 2.0, 0.9 * b + 0.1 * 0.5
        if step in visits:
            k, n = visits[step]
            h.record([_group(p, k, n)], step=step)
            a, b = 0.6 * a + k, 0.6 * b + (n - k)
        assert posterior(h.of("p0"), step + 1, opts) == pytest.approx((a, b))


def test_many_all_correct_observations_push_the_mean_to_one_and_selection_away():
    c = _ctrl("control.prompts_per_step=1", options={"pool_factor": 2}, n=2)
    a, fresh = _prompts(2)
    for step in range(30):
        c.observe([_group(a, 4, 4)], RunState(step=step))
    al, be = c.posterior("p0", 30)
    assert al / (al + be) > 0.95
    assert c.posterior("p1", 30) == (1.0, 1.0)
    # Monte-Carlo: against an unseen prompt (Beta(1, 1)), the all-correct one is rarely chosen
    picks = [c.select(RunState(step=30))[0].id for _ in range(400)]
    assert picks.count("p0") / 400 < 0.1


def test_prompts_near_one_half_are_chosen_most_often():
    c = _ctrl("control.prompts_per_step=1", options={"pool_factor": 3}, n=3)
    easy, mid, hard = _prompts(3)
    for step in range(5):
        c.observe([_group(easy, 8, 8), _group(mid, 4, 8), _group(hard, 0, 8)], RunState(step=step))
    picks = [c.select(RunState(step=5))[0].id for _ in range(300)]
    assert picks.count("p1") > 0.8 * 300 and picks.count("p1") > picks.count("p0") + picks.count("p2")


def test_decay_returns_an_unvisited_posterior_to_the_prior():
    c = _ctrl()
    c.observe([_group(_prompts(1)[0], 4, 4)], RunState(step=0))
    assert c.posterior("p0", 1)[0] > 4
    a, b = c.posterior("p0", 2000)  # 0.99^1999 ~ 2e-9
    assert a == pytest.approx(1.0, abs=1e-6) and b == pytest.approx(1.0, abs=1e-6)
    # without the global decay (lg = 1) the evidence stays
    d = _ctrl(options={"global_decay": 1.0})
    d.observe([_group(_prompts(1)[0], 4, 4)], RunState(step=0))
    assert d.posterior("p0", 2000) == pytest.approx((4.7, 0.7))


def test_no_extra_rollouts_and_the_budget_caps_the_plan():
    c = _ctrl()
    prompts = c.select(RunState(step=0))
    plan = c.plan(prompts, RunState(step=0))
    assert len(prompts) == 3 and len({p.id for p in prompts}) == 3
    assert plan.total == 3 * 4 and not c.next_round([], RunState(step=0))  # generation count = B * G
    d = _ctrl("control.budget_rollouts=10")
    plan = d.plan(d.select(RunState(step=0)), RunState(step=0))
    assert [r.n for r in plan.requests] == [4, 4, 2]


def test_candidate_pool_is_deduplicated_at_the_dataset_size():
    c = _ctrl("control.prompts_per_step=3", options={"pool_factor": 4}, n=5)  # M = 12 > 5 prompts
    for step in range(4):
        ids = [p.id for p in c.select(RunState(step=step))]
        assert len(ids) == 3 == len(set(ids))


def test_state_round_trips_stream_rng_and_history():
    c = _ctrl()
    for step in range(3):
        ps = c.select(RunState(step=step))
        c.observe([_group(p, i % 5, 4) for i, p in enumerate(ps)], RunState(step=step))
    d = VADE(_prompts(12), c.cfg, c.opts, seed=99)
    d.load_state_dict(c.state_dict())
    for step in range(3, 6):
        assert [p.id for p in d.select(RunState(step=step))] == [p.id for p in c.select(RunState(step=step))]


# ------------------------------------------------------------------ the loop


def _stable(path):
    return [
        {k: v for k, v in json.loads(x).items() if k != "wall_s" and not k.startswith("time/")}
        for x in path.read_text().splitlines()
    ]


def _run(tmp_path, name, steps, resume=False):
    o = tiny_overrides(
        tmp_path, name=name, steps=steps, **{"eval.at_start": False, "run.threads": 1, "control.name": "vade"}
    )
    return rollwise.train(load_config(overrides=as_sets(o)), resume=resume, log=lambda m: None)


def test_loop_run_spends_b_times_g_and_resumes_exactly(tmp_path):
    full = _run(tmp_path, "full", 4)
    lines = _stable(full.run_dir / "metrics.jsonl")
    assert [m["cost/rollouts"] for m in lines] == [16, 32, 48, 64]  # 4 prompts x 4 rollouts per step
    _run(tmp_path, "resumed", 2)
    _run(tmp_path, "resumed", 4, resume=True)
    assert _stable(tmp_path / "resumed" / "metrics.jsonl") == lines
