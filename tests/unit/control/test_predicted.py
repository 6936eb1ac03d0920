"""Controllers that read the pass-rate predictor (issue #31): ``wise2`` (rollwise's own, v2), GRESO
skipping first visits on the prediction, CurES quotas from predicted rates and V0.5's learned prior.
A fake predictor with a fixed pass rate per prompt makes every choice worked out by hand."""

import json
from collections import Counter

import pytest

from rollwise.config import load_config
from rollwise.control.cures import CurES, CuresOptions
from rollwise.control.greso import GRESO, GRESOOptions
from rollwise.control.v05 import V05
from rollwise.control.v05 import Options as V05Options
from rollwise.control.wise2 import Wise2, Wise2Options
from rollwise.registry import UserError
from rollwise.types import Prompt, RunState, Services


class FakeValue:
    """Predicted pass rate per prompt id; counts the prompts it was asked about."""

    def __init__(self, rates):
        self.rates, self.asked = rates, Counter()

    def predict(self, prompts, version):
        self.asked.update(p.id for p in prompts)
        return {p.id: self.rates[p.id] for p in prompts}


def prompts(n):
    return [Prompt(f"p{i}", "t", f"{i}+{i}=", str(2 * i)) for i in range(n)]


def control_cfg(**over):
    return load_config(overrides=[f"control.{k}={json.dumps(v)}" for k, v in over.items()]).control


def bound(ctrl, rates):
    ctrl.bind(Services(value=FakeValue(rates)))
    return ctrl


def test_wise2_trains_the_most_likely_mixed_prompts_at_uniform_step_shape():
    ps = prompts(6)
    # G = 4: d(p) = p^4 + (1-p)^4; p 0.5 -> 0.125 (mixed 0.875), 0.7 -> 0.2482, 0.9 -> 0.6562, 1.0 -> 1 (skip)
    rates = {"p0": 1.0, "p1": 0.9, "p2": 0.5, "p3": 0.0, "p4": 0.7, "p5": 1.0}
    cfg = control_cfg(prompts_per_step=2, rollouts_per_prompt=4)
    c = bound(Wise2(ps, cfg, Wise2Options(oversample=3.0, skip_above=0.8, keep_floor=0.0), seed=0), rates)
    chosen = c.select(RunState())
    assert sorted(p.id for p in chosen) == ["p2", "p4"]  # the two largest 1 - d among the 6 candidates
    assert c.metrics["control/wise2_candidates"] == 6 and c.metrics["control/wise2_skipped"] == 3  # p0, p3, p5
    plan = c.plan(chosen, RunState())
    assert [r.n for r in plan.requests] == [4, 4]  # uniform's shape: prompts_per_step x rollouts_per_prompt


def test_wise2_fills_the_step_from_the_skipped_when_too_few_remain():
    ps = prompts(3)
    cfg = control_cfg(prompts_per_step=2, rollouts_per_prompt=4)
    c = bound(Wise2(ps, cfg, Wise2Options(oversample=1.5, keep_floor=0.0), seed=0), {p.id: 1.0 for p in ps})
    assert len(c.select(RunState())) == 2  # every candidate predicted solved: the step still trains 2 prompts


def test_wise2_needs_the_predictor():
    with pytest.raises(UserError, match="value.enabled = true"):
        load_config(overrides=['control.name="wise2"'])
    load_config(overrides=['control.name="wise2"', "value.enabled=true"])


def test_greso_first_visit_predicted_skips_confident_first_visits_only():
    ps = prompts(400)
    rates = {p.id: (1.0 if i % 2 == 0 else 0.5) for i, p in enumerate(ps)}  # even: solved, odd: a coin
    cfg = control_cfg(prompts_per_step=8, rollouts_per_prompt=8)
    c = bound(GRESO(ps, cfg, GRESOOptions(first_visit="predicted", keep_floor=0.05), seed=0), rates)
    out = c.draw(100)
    solved = sum(int(p.id[1:]) % 2 == 0 for p in out)
    # a solved first visit is kept with 1 - min(1, 0.95) = 0.05, a coin with 1 - (0.5^8 + 0.5^8) = 0.992
    assert solved <= 10 and len(out) == 100
    assert c._skipped_predicted > 80
    plain = GRESO(ps, cfg, GRESOOptions(), seed=0)
    plain.bind(Services(value=None))  # the default never asks the predictor
    assert len(plain.draw(100)) == 100


def test_cures_predicted_rates_split_the_budget_by_sqrt_p_1_minus_p():
    ps = prompts(2)
    cfg = control_cfg(prompts_per_step=2, rollouts_per_prompt=8)
    c = bound(CurES(ps, cfg, CuresOptions(probe_rollouts=0, rates="predicted"), seed=0), {"p0": 0.5, "p1": 0.9})
    plan = c.plan(ps, RunState())
    # sigma = 0.5 and 0.3; 16 rollouts split 10 : 6 (largest remainders)
    assert {r.prompt.id: r.n for r in plan.requests} == {"p0": 10, "p1": 6}


def test_v05_learned_prior_is_the_prediction_for_the_plan():
    ps = prompts(3)
    cfg = control_cfg(prompts_per_step=3, rollouts_per_prompt=4)
    fake = FakeValue({"p0": 0.2, "p1": 0.5, "p2": 0.9})
    c = V05(ps, cfg, V05Options(prior="learned"), seed=0)
    c.bind(Services(value=fake))
    chosen = c.select(RunState())
    c.plan(chosen, RunState())
    assert c._priors == {p.id: fake.rates[p.id] for p in chosen}
    assert c.metrics["control/v05_prior_mean"] == pytest.approx(sum(fake.rates.values()) / 3)


def test_dars_predicted_rates_send_n_plus_the_schedules_top_up_in_one_round():
    from rollwise.control.dars import DARS, DARSOptions

    ps = prompts(2)
    cfg = control_cfg(prompts_per_step=2, rollouts_per_prompt=4)
    c = bound(DARS(ps, cfg, DARSOptions(rates="predicted"), seed=0), {"p0": 0.25, "p1": 0.75})
    chosen = c.select(RunState())
    plan = c.plan(chosen, RunState())
    # ET, no std, N = 4: S(0.25) = 2 * 0.25 * 0.75 = 0.375, A_peak = N / 2 = 2 -> ceil(2 / 0.375 - 4) = 2 more;
    # p >= 0.5 gets none
    assert {r.prompt.id: r.n for r in plan.requests} == {"p0": 6, "p1": 4}
    assert not c.next_round([], RunState())  # no stage 2


def test_wise2_without_ranking_keeps_stream_order_minus_the_skipped():
    ps = prompts(6)
    rates = {"p0": 1.0, "p1": 0.9, "p2": 0.5, "p3": 0.0, "p4": 0.7, "p5": 1.0}
    cfg = control_cfg(prompts_per_step=2, rollouts_per_prompt=4)
    c = bound(Wise2(ps, cfg, Wise2Options(oversample=3.0, skip_above=0.8, keep_floor=0.0, rank=False), seed=0), rates)
    order = [p.id for p in Wise2(ps, cfg, Wise2Options(), seed=0).source.take(6)]  # the same seeded stream
    kept = [pid for pid in order if pid not in ("p0", "p3", "p5")]
    assert [p.id for p in c.select(RunState())] == kept[:2]
