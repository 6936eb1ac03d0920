"""benchmarks/skip_cap.py: the skip lever's cap (issue #43's goal), re-costing a DAPO arm's curve at
the tokens it trained on, on hand-written ledger lines worked out by hand."""

import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCH))

import skip_cap as sc  # noqa: E402


def _eval(step, tokens, p1):
    return {"step": step, "cost/generated_tokens": tokens, "eval/pass@1": p1, "wall_s": float(step), "time/eval_s": 0.0}


def _metrics(gen, trained, surplus=0):
    """One line per step, cumulative costs; 52 groups generated, 15 + 6 dropped (+ surplus)."""
    return [
        {
            "step": i,
            "cost/generated_tokens": g,
            "cost/trained_tokens": t,
            "filter/surplus": surplus,
            "control/rounds": 2,
            "groups/count": 52,
            "filter/all_correct": 15,
            "filter/all_wrong": 6,
        }
        for i, (g, t) in enumerate(zip(gen, trained))
    ]


def test_recost_moves_each_evaluation_to_the_trained_tokens_of_the_steps_before_it():
    evals = [_eval(0, 0, 0.3), _eval(2, 250, 0.4), _eval(4, 900, 0.5)]
    metrics = _metrics([100, 250, 600, 900], [60, 100, 180, 420])
    # step 2 follows steps 0 and 1 (trained 100 cumulative), step 4 follows 0..3 (420)
    assert [e["cost/generated_tokens"] for e in sc.recost(evals, metrics)] == [0.0, 100.0, 420.0]
    assert [e["eval/pass@1"] for e in sc.recost(evals, metrics)] == [0.3, 0.4, 0.5]


def test_recost_refuses_an_evaluation_after_a_step_the_ledger_lacks():
    with pytest.raises(SystemExit, match="step 5 follows step 4"):
        sc.recost([_eval(5, 10, 0.5)], _metrics([100], [50]))


def test_of_cap_is_the_share_of_the_cap_on_a_log_scale():
    assert sc.of_cap(2.0, 4.0) == pytest.approx(0.5)
    assert sc.of_cap(1.0, 4.0) == 0.0
    assert sc.of_cap(4.0, 4.0) == pytest.approx(1.0)
    assert sc.of_cap(2.0, 1.0) is None and sc.of_cap(None, 3.0) is None


def test_figures_on_two_seeds_worked_by_hand():
    # uniform: seed 0 crosses 0.5 between (200, 0.4) and (400, 0.6) at 300; seed 1 at (200, 0.5) = 200
    # dapo: seed 0 (0, 0.3) -> (400 generated, 0.7): crosses at 200; seed 1 (0, 0.3) -> (400, 0.5): at 400
    # re-costed at trained tokens (step 2 follows steps 0, 1): seed 0 x = 100 -> crossing 50; seed 1 x = 100 -> 100
    evals = {
        "uniform": {
            0: [_eval(0, 0, 0.3), _eval(2, 200, 0.4), _eval(4, 400, 0.6)],
            1: [_eval(0, 0, 0.3), _eval(2, 200, 0.5), _eval(4, 400, 0.7)],
        },
        "filter": {0: [_eval(0, 0, 0.3), _eval(2, 400, 0.7)], 1: [_eval(0, 0, 0.3), _eval(2, 400, 0.5)]},
    }
    metrics = {0: _metrics([200, 400], [60, 100]), 1: _metrics([250, 400], [40, 100])}
    out = sc.figures(evals, metrics, "uniform", "filter", 400, 0.5)
    oracle = out["arms"]["oracle:filter"]
    assert out["target"]["value"] == 0.5
    # savings 300 / 50 = 6 and 200 / 100 = 2: geometric mean sqrt(12)
    assert oracle["paired_saving"]["per_seed"] == {"0": pytest.approx(6.0), "1": pytest.approx(2.0)}
    assert oracle["paired_saving"]["value"] == pytest.approx(math.sqrt(12))
    # charged for every group: 300 / 200 = 1.5 and 200 / 400 = 0.5, geometric mean sqrt(0.75)
    dapo = out["arms"]["filter"]
    assert dapo["paired_saving"]["value"] == pytest.approx(math.sqrt(0.75))
    assert dapo["of_cap"] == pytest.approx(math.log(math.sqrt(0.75)) / math.log(math.sqrt(12)))
    assert out["arms"]["uniform"]["paired_saving"] is None and oracle["of_cap"] is None
    # the bill a perfect predictor avoids: 400 / 100 generated per trained token in both runs
    assert out["dapo_runs"]["0"]["generated_per_trained"] == 4.0
    assert out["dapo_mean_over_runs"] == {
        "steps": 2.0,
        "generated_per_trained": 4.0,
        "rounds_mean": 2.0,
        "kept_groups_mean": 31.0,
    }
    assert out["dapo_runs"]["1"]["steps"] == 2 and out["dapo_runs"]["1"]["rounds_mean"] == 2.0
    assert out["dapo_runs"]["1"]["kept_groups_mean"] == 52 - 15 - 6


def test_kept_groups_count_the_surplus_as_dropped():
    assert sc.run_facts(_metrics([10], [5], surplus=3))["kept_groups_mean"] == 52 - 15 - 6 - 3
