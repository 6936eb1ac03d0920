"""MSSR: the Beta tracker with KL-adaptive forgetting (control/mssr.py) and the single-rollout
advantage with entropy shaping (objectives/mssr.py), with the spec's numbers (guidance.md §2.5)."""

import math
from types import SimpleNamespace

import pytest
import torch

from rollwise.control.mssr import MSSR, BetaTracker, MssrOptions, forgetting
from rollwise.objectives.mssr import MssrOptions as AdvOptions
from rollwise.objectives.mssr import entropy_bonus, mssr, normalise_batch
from rollwise.types import Group, Prompt, Rollout, RunState, Verdict

O = MssrOptions()


def test_n0_and_tracker_worked_example():
    tr = BetaTracker(1.0 / (1.0 - 0.875), 0.5)
    assert tr.n0 == 8.0 and tr.get("new") == [4.0, 4.0]  # unseen: v_init 0.5 -> alpha = beta = 4
    tr.init("x", 1.0)  # init with one correct outcome -> alpha 8, beta 0, v = 1
    assert tr.get("x") == [8.0, 0.0] and tr.value("x") == 1.0
    tr.update("x", 0.0, 0.9175)  # r = 0 with rho 0.9175 -> alpha 7.34, beta 1 -> v = 0.880
    a, b = tr.get("x")
    assert abs(a - 7.34) < 1e-9 and b == 1.0 and abs(tr.value("x") - 0.880) < 1e-3


@pytest.mark.parametrize(
    "kl, rho", [(0.0, 0.875), (0.005, 0.9175), (0.01, 0.96), (0.0101, 0.875), (0.05, 0.875), (None, 0.9175)]
)
def test_rho_rule_as_written(kl, rho):
    assert abs(forgetting(kl, O) - rho) < 1e-9


def test_monotone_rule_and_bounds():
    m = MssrOptions(rule="monotone")
    assert forgetting(0.0, m) == 0.96 and forgetting(0.05, m) == 0.875 and abs(forgetting(0.005, m) - 0.9175) < 1e-9
    for kl in (0.0, 0.003, 0.01, 0.02, 1.0):
        for o in (O, m):
            assert 0.875 <= forgetting(kl, o) <= 0.96


def test_batch_normalisation():
    out = normalise_batch(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0]), 1e-6)
    assert abs(float(out.mean())) < 1e-6 and abs(float(out.var(unbiased=False)) - 1) < 1e-5
    assert torch.equal(normalise_batch(torch.tensor([0.3, 0.3]), 1e-6), torch.zeros(2))  # var below the floor: 0 / 1e-3


def test_entropy_shaping_worked_numbers():
    h = -0.5 * math.log(0.5)  # p = 0.5 -> -p log p = 0.3466, 0.4 H = 0.1386
    adv = torch.tensor([1.2, -0.1, -1.2, 0.0])
    out = entropy_bonus(adv, torch.full((4, 2), h), torch.tensor([[True, False]] * 4), 0.4, 2.0)
    assert torch.allclose(out[:, 0], torch.tensor([1.3386, -0.05, -1.0614, 0.0]), atol=1e-4)
    assert torch.equal(out[:, 1], torch.zeros(4))  # padding gets nothing
    neg = entropy_bonus(torch.tensor([-0.3]), torch.tensor([[10.0]]), torch.tensor([[True]]), 0.4, 2.0)
    assert float(neg) == pytest.approx(-0.15)  # psi <= |A|/2: never flips the sign


def test_mssr_advantage_with_the_code_proxy_is_bounded():
    r, base = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0.5, 0.5, 0.9])
    lps = [(math.log(1 / math.e),), (-0.1, -2.0), (-0.7,)]
    adv = mssr(r, torch.arange(3), AdvOptions(), prompt_baseline=base, completion_logprobs=lps)
    a = normalise_batch(r - base, 1e-6)
    assert torch.allclose(adv.values, a)
    psi = adv.token_values[:, :1] - a[:, None]
    assert bool((psi >= 0).all()) and float(psi.max()) <= 0.4 / math.e + 1e-6
    assert torch.equal(mssr(r, torch.arange(3), AdvOptions(entropy_coef=0), prompt_baseline=base).values, a)  # MVSR
    with pytest.raises(ValueError, match="mssr"):
        mssr(r, torch.arange(3), AdvOptions())


def group(pid, *scores):
    p = Prompt(pid, "t", pid, "1")
    return Group(p, tuple(Rollout(pid, (1,), (2,), (0.0,), "stop", 0, "", Verdict(s)) for s in scores))


def controller(**o):
    prompts = [Prompt(f"p{i}", "t", str(i), "1") for i in range(6)]
    cfg = SimpleNamespace(
        prompts_per_step=2, rollouts_per_prompt=1, budget_rollouts=None, budget_tokens=None, _max_new_tokens=8
    )
    return MSSR(prompts, cfg, MssrOptions(**o), seed=0)


def test_controller_baselines_are_taken_before_the_update_and_kl_drives_rho():
    c = controller()
    prompts = c.select(RunState())
    assert c.plan(prompts, RunState()).total == 2  # one rollout per prompt
    c.observe([group("p0", 1.0)], RunState(step=0))
    rows = [group("p0", 1.0).rollouts[0]]
    assert float(c.baselines(rows)[0]) == 0.5  # before the update: the prior
    assert c.metrics["control/mssr_rho"] == pytest.approx(0.9175)  # no KL yet: midpoint
    assert c.tracker.get("p0") == pytest.approx([0.9175 * 4 + 1, 0.9175 * 4])
    c.after_update(None, rows, {"train/kl": 0.005}, None)
    assert c.rho() == pytest.approx(0.9175)  # KL_s = 0.005
    c.after_update(None, rows, {"train/kl": 0.015}, None)
    assert c.rho() == pytest.approx(0.96)  # KL_s = 0.01 = target


def test_controller_state_round_trip():
    c = controller()
    c.select(RunState())
    c.observe([group("p0", 1.0), group("p3", 0.0)], RunState(step=0))
    c.after_update(None, [], {"train/kl": 0.002}, None)
    d = controller()
    d.load_state_dict(c.state_dict())
    assert d.tracker.ab == c.tracker.ab and d.kl == c.kl and d.step_baselines == c.step_baselines
    assert [p.id for p in d.select(RunState())] == [p.id for p in c.select(RunState())]
    d.observe([group("p0", 0.0)], RunState(step=1))
    c.observe([group("p0", 0.0)], RunState(step=1))
    assert d.tracker.ab == c.tracker.ab
