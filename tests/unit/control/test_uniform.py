from rollwise.config import load_config
from rollwise.control.uniform import PromptStream, Uniform, cap_plan
from rollwise.types import Prompt, Request


def _prompts(n):
    return [Prompt(f"p{i}", "t", f"{i}", "0") for i in range(n)]


def test_stream_covers_each_epoch_once_and_resumes_exactly():
    s = PromptStream(_prompts(5), seed=0)
    first = [p.id for p in s.take(5)]
    assert sorted(first) == [f"p{i}" for i in range(5)]
    saved = s.state_dict()
    nxt = [p.id for p in s.take(7)]
    t = PromptStream(_prompts(5), seed=99)
    t.load_state_dict(saved)
    assert [p.id for p in t.take(7)] == nxt


def test_uniform_plan_respects_budget():
    cfg = load_config(
        overrides=["control.prompts_per_step=3", "control.rollouts_per_prompt=4", "control.budget_rollouts=10"]
    ).control
    u = Uniform(_prompts(10), cfg, None, seed=0)
    plan = u.plan(u.select(None), None)
    assert [r.n for r in plan.requests] == [4, 4, 2] and plan.total == 10
    assert not u.next_round([], None)


def test_cap_plan_drops_empty_requests():
    ps = _prompts(2)
    plan = cap_plan([Request(ps[0], 3), Request(ps[1], 3)], 3)
    assert [(r.prompt.id, r.n) for r in plan.requests] == [("p0", 3)]
