"""The per-step budget shared by every controller (control/budget.py): rollout and token caps,
the length estimate, trimming and proportional scaling, and every registered controller kept
within the budget over several steps."""

import pytest

from rollwise.config import ControlConfig, load_config
from rollwise.control import REGISTRY
from rollwise.control.budget import LENGTH_WINDOW, StepBudget, cap_plan, scale_plan
from rollwise.control.history import PromptHistory
from rollwise.control.uniform import Uniform
from rollwise.registry import UserError
from rollwise.session import percentile, step_metrics
from rollwise.types import Group, Prompt, Request, Rollout, RunState, Services, Verdict


def _prompts(n):
    return [Prompt(f"p{i}", "t", f"{i}", "0") for i in range(n)]


def _group(prompt, scores, length=3):
    rs = tuple(Rollout(prompt.id, (1,), (2,) * length, (-1.0,) * length, "stop", 0, "", Verdict(s)) for s in scores)
    return Group(prompt, rs)


def test_cap_plan_trims_last_first_and_keeps_prefix_fields():
    ps = _prompts(3)
    cont = Request(ps[2], 5, prefix=(7, 8), prefix_logprobs=(-0.1, -0.2), prefix_versions=(3, 3))
    plan = cap_plan([Request(ps[0], 4), Request(ps[1], 4), cont], 10)
    assert [r.n for r in plan.requests] == [4, 4, 2]
    assert plan.requests[2].prefix_logprobs == (-0.1, -0.2) and plan.requests[2].prefix_versions == (3, 3)
    assert not cap_plan([Request(ps[0], 4)], 0)


def test_scale_plan_largest_remainders():
    ps = _prompts(3)
    reqs = [Request(ps[0], 24), Request(ps[1], 11), Request(ps[2], 3)]
    # total 38 > 19: shares 12, 5.5, 1.5 -> floors 12, 5, 1 = 18; the 1 left goes to the first .5
    assert [r.n for r in scale_plan(reqs, 19).requests] == [12, 6, 1]
    # 5 of 38: shares 3.16, 1.45, 0.39 -> 3, 1, 0 = 4; the 1 left goes to .45 -> (3, 2), p2 left out
    assert [(r.prompt.id, r.n) for r in scale_plan(reqs, 5).requests] == [("p0", 3), ("p1", 2)]
    assert scale_plan(reqs, 100).total == 38 and not scale_plan(reqs, 0)


def test_rollout_cap_counts_what_this_step_already_generated():
    b = StepBudget(rollouts=20, tokens=None, prior_tokens=8)
    ps = _prompts(2)
    assert b.remaining() == 20
    assert b.remaining(groups=[_group(ps[0], [1] * 8), _group(ps[1], [0] * 5)]) == 20 - 13
    assert b.remaining(groups=[_group(ps[0], [1] * 25)]) == 0
    assert StepBudget(None, None, 8).remaining() is None
    assert StepBudget(None, None, 8).cap([Request(ps[0], 1000)]).total == 1000


def test_token_cap_uses_prior_then_running_mean_length():
    ps = _prompts(4)
    h = PromptHistory()
    b = StepBudget(rollouts=None, tokens=100, prior_tokens=8)
    assert b.tokens_per_rollout(h) == 8.0 and b.remaining(h) == 12  # no data: floor(100 / max_new_tokens 8)
    # step 0: 4 rollouts of 2 tokens and 4 of 6 -> mean 4 -> floor(100 / 4) = 25
    h.record([_group(ps[0], [1, 0, 1, 0], length=2), _group(ps[1], [1, 0, 1, 0], length=6)], step=0)
    assert b.tokens_per_rollout(h) == 4.0 and b.remaining(h) == 25
    # this step's rollouts count exactly and join the estimate: 5 rollouts x 10 tokens used;
    # mean (32 + 50) / (8 + 5) = 6.31 -> floor((100 - 50) / 6.31) = 7
    g = [_group(ps[2], [1] * 5, length=10)]
    assert b.tokens_per_rollout(h, g) == pytest.approx(82 / 13) and b.remaining(h, g) == 7
    # only the last LENGTH_WINDOW steps count: after that many steps of length 1, L = 1
    for s in range(1, LENGTH_WINDOW + 1):
        h.record([_group(ps[3], [1, 0], length=1)], step=s)
    assert b.tokens_per_rollout(h) == 1.0 and b.remaining(h) == 100
    # both caps: the smaller wins
    assert StepBudget(rollouts=30, tokens=100, prior_tokens=8).remaining(h) == 30


def test_lengths_survive_a_state_round_trip():
    h = PromptHistory()
    h.record([_group(p, [1, 0], length=i + 1) for i, p in enumerate(_prompts(3))], step=0)
    other = PromptHistory()
    other.load_state_dict(h.state_dict())
    assert other.recent_lengths(4) == h.recent_lengths(4) == (6, 2 * (1 + 2 + 3))


def test_config_hands_max_new_tokens_to_the_control_section():
    cfg = load_config(
        overrides=[
            "sampling.max_new_tokens=10",
            "control.budget_tokens=45",
            "control.prompts_per_step=3",
            "control.rollouts_per_prompt=4",
        ]
    )
    b = StepBudget.from_config(cfg.control, 12)
    assert b == StepBudget(rollouts=12, tokens=45, prior_tokens=10)
    u = Uniform(_prompts(10), cfg.control, None, seed=0)
    assert [r.n for r in u.plan(u.select(None), None).requests] == [4]  # floor(45 / 10) = 4 rollouts
    assert StepBudget.from_config(ControlConfig(), None).prior_tokens == 8  # alone: the sampling default
    assert "budget_tokens" in ControlConfig.model_fields and "_max_new_tokens" not in cfg.control.model_dump()


def test_p90_metric():
    # nearest rank: sizes 1..10 -> 9; (4, 4, 4, 28) -> ceil(3.6) = 4th = 28; one group -> itself
    assert percentile(list(range(1, 11)), 0.9) == 9
    assert percentile([28, 4, 4, 4], 0.9) == 28 and percentile([5], 0.9) == 5
    ps = _prompts(4)
    m = step_metrics([_group(p, [1, 0] * (k // 2)) for p, k in zip(ps, (4, 4, 4, 28))], {}, [16, 24])
    assert m["control/rollouts_per_prompt_p90"] == 28 and m["control/budget_used"] == 40


# ------------------------------------------------------------------ every controller, several steps


def _drive(ctrl, steps, length):
    """Run ``steps`` steps without a model; rollout j of prompt i is right when (i + j) % 3 == 0
    (so some groups are hard and multi-round controllers top up). Returns rollouts per step."""
    out = []
    for step in range(steps):
        st = RunState(step=step)
        plan = ctrl.plan(ctrl.select(st), st)
        groups: dict[str, Group] = {}
        total, rounds = 0, 0
        while plan and rounds < 20:
            total += plan.total
            for r in plan.requests:
                i = int(r.prompt.id[1:])
                old = groups.get(r.prompt.id, Group(r.prompt, ()))
                new = _group(r.prompt, [float((i + old.size + j) % 3 == 0) for j in range(r.n)], length=length)
                groups[r.prompt.id] = Group(r.prompt, old.rollouts + new.rollouts)
            plan = ctrl.next_round(list(groups.values()), st)
            rounds += 1
        ctrl.observe(list(groups.values()), st)
        out.append(total)
    return out


NAMES = sorted(n.split(":")[0] for n in REGISTRY.names())
# options a controller needs at rollouts_per_prompt = 4 (SPEED screens with n_init < the group size)
# and config it requires (SPEED's filter)
OPTIONS = {"speed": {"n_init": 2}, "wise": {"n_init": 2}}
NEEDS = {
    "speed": ['filter.names=["speed_complete"]'],
    "wise": ['filter.names=["speed_complete"]'],
    "adhint": ["advantage.name=adhint"],
    "mssr": ["advantage.name=mssr"],
    "wise2": ["value.enabled=true"],
    "cog_rethinker": ["advantage.name=cog_rethinker"],
}


class _Tok:
    eos_token_id = 0


class _Codec:  # for controllers that build token prefixes (bind): one character per token
    tokenizer = _Tok()

    def encode_text(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class _Task:
    def target(self, prompt):
        return "0,1=1,=1"


class _Value:  # the pass-rate predictor (wise2): every prompt a coin
    def predict(self, prompts, version):
        return {p.id: 0.5 for p in prompts}


def _options(name, cls):
    return cls.Options(**OPTIONS.get(name, {})) if hasattr(cls, "Options") else None


def _bound(ctrl):
    # ADHint hints, R3L retries, SCOPE guides: the run binds its task and codec; wise2 its predictor
    ctrl.bind(Services(_Task(), _Codec(), value=_Value()))
    return ctrl


# Controllers whose extra stages need more than one step's base rollouts (3 x 4 here): refused below
# that, naming the key, and held to a budget above it.
ABOVE_BASE = {"cog_rethinker": 20}


@pytest.mark.parametrize("name", NAMES)
def test_every_registered_controller_stays_within_the_rollout_budget(name):
    cls = REGISTRY.get(name)

    def control(budget):
        return load_config(
            overrides=[
                "control.prompts_per_step=3",
                "control.rollouts_per_prompt=4",
                f"control.budget_rollouts={budget}",
                f"control.name={name}",
                *NEEDS.get(name, []),
            ]
        ).control

    budget = 10
    if name in ABOVE_BASE:
        with pytest.raises(UserError, match=r"control\.budget_rollouts \(10\)"):
            cls(_prompts(30), control(10), _options(name, cls), 0)
        budget = ABOVE_BASE[name]
    ctrl = _bound(cls(_prompts(30), control(budget), _options(name, cls), 0))
    used = _drive(ctrl, 4, length=3)
    assert all(0 < u <= budget for u in used), used


@pytest.mark.parametrize("name", NAMES)
def test_every_registered_controller_stays_within_the_token_budget(name):
    # max_new_tokens 8, every completion 8 tokens long: budget 40 tokens = 5 rollouts per step
    cls = REGISTRY.get(name)
    cfg = load_config(
        overrides=[
            "control.prompts_per_step=3",
            "control.rollouts_per_prompt=4",
            "sampling.max_new_tokens=8",
            "control.budget_tokens=40",
            f"control.name={name}",
            *NEEDS.get(name, []),
        ]
    ).control
    ctrl = _bound(cls(_prompts(30), cfg, _options(name, cls), 0))
    used = _drive(ctrl, 4, length=8)
    assert all(0 < u * 8 <= 40 for u in used), used
