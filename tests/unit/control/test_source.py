"""The prompt source shared by the stream-based controllers (rollwise.control.source)."""

from rollwise.config import load_config
from rollwise.control.drive import DRIVE
from rollwise.control.source import PromptSource, PromptStream
from rollwise.control.uniform import Uniform
from rollwise.types import Group, Prompt, Request, Rollout, Verdict


def _prompts(n):
    return [Prompt(f"p{i}", "t", f"{i}", "0") for i in range(n)]


def _group(prompt, scores, length=3):
    return Group(
        prompt,
        tuple(Rollout(prompt.id, (1,), (2,) * length, (-1.0,) * length, "stop", 0, "", Verdict(s)) for s in scores),
    )


def _control(*overrides):
    return load_config(overrides=["control.prompts_per_step=3", "control.rollouts_per_prompt=4", *overrides]).control


def test_budget_counts_the_steps_groups_and_the_history_dates_them_by_epoch():
    ps = _prompts(4)
    src = PromptSource(ps, 0, _control("control.budget_rollouts=10"), default_rollouts=12)
    # 10 rollouts allowed: 4 + 4 + 2, the last request trimmed
    assert [r.n for r in src.cap([Request(p, 4) for p in ps[:3]]).requests] == [4, 4, 2]
    groups = [_group(ps[0], [1.0, 0.0, 0.0]), _group(ps[1], [1.0, 1.0, 1.0])]  # 6 rollouts spent this step
    assert src.remaining(groups) == 4
    # "scale": 4 left shared in proportion between requests of 6 and 2: 3 and 1
    assert [r.n for r in src.cap([Request(ps[2], 6), Request(ps[3], 2)], groups, how="scale").requests] == [3, 1]
    src.take(5)  # past the first epoch of 4 prompts
    src.record(groups, step=7)
    rec = src.history.last("p0")
    assert (rec.step, rec.epoch, rec.n, rec.k) == (7, 1, 3, 1)


def test_state_keeps_the_checkpoint_keys_and_resumes_the_stream():
    ps = _prompts(5)
    u = Uniform(ps, _control(), None, seed=3)
    first = u.select(None)
    u.observe([_group(first[0], [1.0, 0.0])], type("S", (), {"step": 0})())
    saved = u.state_dict()
    assert list(saved) == ["stream", "history"]  # the keys checkpoints written before the helper hold
    assert saved["history"][first[0].id][0]["n"] == 2
    v = Uniform(ps, _control(), None, seed=99)
    v.load_state_dict(saved)
    assert [p.id for p in v.select(None)] == [p.id for p in u.select(None)]
    assert v.history.totals(first[0].id) == (2, 1)


def test_a_controller_names_its_sources_parts_and_assigning_one_replaces_the_sources():
    d = DRIVE(_prompts(6), _control(), None, seed=0)
    assert d.stream is d.source.stream and d.history is d.source.history and d.step_budget is d.source.step_budget
    d.stream = PromptStream(_prompts(2), 1)  # DRIVE's stage-2 pool
    assert d.source.stream is d.stream and len(d.source.stream.prompts) == 2
