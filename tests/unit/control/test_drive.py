"""DRIVE-style curation: solved prompts skipped by pass rate, hard-focus stage 2 (rollwise.control.drive)."""

from rollwise.config import ControlConfig, load_config
from rollwise.control.drive import DRIVE, DRIVEOptions
from rollwise.types import Group, Prompt, Rollout, RunState, Verdict


def _prompts(n):
    return [Prompt(f"p{i}", "t", f"q{i}", "1") for i in range(n)]


def _group(prompt, k, n):
    """A group of ``n`` verified rollouts, the first ``k`` correct."""
    rs = tuple(Rollout(prompt.id, (1,), (2,), (-1.0,), "stop", 0, "", Verdict(1.0 if i < k else 0.0)) for i in range(n))
    return Group(prompt, rs)


def _drive(n_prompts=6, per_step=2, n=4, **opts):
    ps = _prompts(n_prompts)
    return ps, DRIVE(
        ps, ControlConfig(name="drive", prompts_per_step=per_step, rollouts_per_prompt=n), DRIVEOptions(**opts), seed=0
    )


def test_pass_rate_reads_the_shared_history_window():
    ps, d = _drive(window=2)
    # visits of p0: 0/4, then 4/4, then 3/4 -> window of the last 2 visits: (4 + 3) / (4 + 4) = 7/8
    for step, k in enumerate((0, 4, 3)):
        d.observe([_group(ps[0], k, 4)], RunState(step=step))
    assert d.pass_rate("p0") == 7 / 8
    assert d.pass_rate("p1") is None  # never seen
    assert d.history.totals("p0") == (12, 7)  # the history itself keeps everything


def test_solved_prompts_are_skipped_while_others_remain():
    ps, d = _drive(n_prompts=4, per_step=2, min_rollouts=8, window=2)
    for step in range(2):  # p0 and p1: 8/8 over the last two visits -> solved; p2: 7/8 -> not
        d.observe([_group(ps[0], 4, 4), _group(ps[1], 4, 4), _group(ps[2], 4 - step, 4)], RunState(step=step))
    assert d.solved("p0") and d.solved("p1") and not d.solved("p2") and not d.solved("p3")
    picked = [p.id for _ in range(3) for p in d.select(RunState(step=2))]
    assert set(picked) == {"p2", "p3"}  # three steps of two prompts: only the unsolved ones
    assert d.metrics["control/drive_skipped"] >= 1 and d.metrics["control/drive_stage"] == 1.0


def test_a_fully_solved_pool_still_gives_a_batch():
    ps, d = _drive(n_prompts=2, per_step=2, min_rollouts=4, window=1)
    d.observe([_group(ps[0], 4, 4), _group(ps[1], 4, 4)], RunState(step=0))
    assert len(d.select(RunState(step=1))) == 2


def test_stage2_keeps_the_hardest_with_more_rollouts_and_shrinks_each_epoch():
    ps, d = _drive(n_prompts=6, per_step=1, n=4, stage2_step=1, stage2_pool=4, retain=0.5, min_pool=1, min_rollouts=100)
    # pass rates: p0 1.0, p1 0.75, p2 0.5, p3 0.25, p4 0.0, p5 unseen (counts as 0)
    d.observe([_group(ps[i], 4 - i, 4) for i in range(5)], RunState(step=0))
    assert [p.id for p in d.hardest(ps, 4)] == ["p4", "p5", "p3", "p2"]
    d.select(RunState(step=0))
    assert d.stage == 1 and d.plan([ps[0]], RunState(step=0)).requests[0].n == 4
    first = d.select(RunState(step=1))
    assert d.stage == 2 and {p.id for p in d.stream.prompts} == {"p2", "p3", "p4", "p5"}
    assert d.plan(first, RunState(step=1)).requests[0].n == 8  # stage2_rollouts default 2 x 4
    for step in range(2, 5):  # the rest of the first stage-2 epoch (4 prompts, one per step)
        d.select(RunState(step=step))
    d.select(RunState(step=5))  # the epoch ended: keep round(4 * 0.5) = 2 hardest, p4 and p5
    assert {p.id for p in d.stream.prompts} == {"p4", "p5"} and d.metrics["control/drive_pool"] == 2.0


def test_state_round_trip():
    ps, d = _drive(stage2_step=0, stage2_pool=3)
    d.observe([_group(ps[0], 1, 4)], RunState(step=0))
    d.select(RunState(step=0))
    ps2, e = _drive(stage2_step=0, stage2_pool=3)
    e.load_state_dict(d.state_dict())
    assert e.stage == 2 and [p.id for p in e.stream.prompts] == [p.id for p in d.stream.prompts]
    assert [p.id for p in e.select(RunState(step=1))] == [p.id for p in d.select(RunState(step=1))]


def test_registered_and_options_validated():
    cfg = load_config(data={"task": {"name": "pyfunc"}, "control": {"name": "drive", "options": {"stage2_step": 10}}})
    assert cfg.control.name == "drive"
    import pytest

    from rollwise.registry import UserError

    with pytest.raises(UserError, match="retain"):
        load_config(data={"control": {"name": "drive", "options": {"retain": 0}}})
