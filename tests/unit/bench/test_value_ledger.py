"""benchmarks/value_ledger.py: the pass-rate predictor's figures of docs/results.md ("Predicting
before generating") derived from runs' ledgers, on hand-written ledger lines."""

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCH))

import value_ledger as vl  # noqa: E402


def _step(zv, reward, brier=None, auc=None, tokens=None, fwd=None, fit=None):
    line = {"groups/degenerate_frac": zv, "reward/mean": reward}
    if brier is not None:
        line.update(
            {
                "value/train_brier": brier,
                "value/train_auc_degenerate": auc,
                "value/forward_tokens": tokens,
                "time/value_forward_s": fwd,
                "time/value_fit_s": fit,
            }
        )
    return line


def _eval(step, brier=None, auc=None):
    line = {"step": step, "eval/pass@1": 0.5}
    if brier is not None:
        line.update({"value/heldout_brier": brier, "value/heldout_auc_degenerate": auc})
    return line


def _write(run_dir: Path, metrics, evals):
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (run_dir / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))


@pytest.fixture
def sweep(tmp_path):
    # wise2 seed 0: two steps; its first step's AUC is None (all groups alike) and is left out
    _write(
        tmp_path / "wise2-s0",
        [_step(0.5, 0.6, 0.1, None, 100, 0.25, 0.5), _step(0.25, 0.8, 0.05, 0.7, 50, 0.25, 0.25)],
        [_eval(0, 0.25, 0.5), _eval(5, 0.125, 0.75), _eval(6, 0.2, None)],
    )
    # wise2 seed 1: one step, its last evaluation at step 5
    _write(
        tmp_path / "wise2-s1",
        [_step(0.5, 0.5, 0.125, 0.5, 200, 1.0, 0.25)],
        [_eval(0, 0.25, 0.5), _eval(5, 0.175, 0.65)],
    )
    # uniform: no predictor, so no value/* keys
    _write(tmp_path / "uniform-s0", [_step(0.5, 0.75), _step(0.75, 0.5)], [_eval(0), _eval(5)])
    return tmp_path


def test_run_figures_by_hand(sweep):
    r = vl.summarise(sweep)["runs"]["wise2-s0"]
    assert r["steps"] == 2
    assert r["zero_variance_share"] == pytest.approx(0.375)  # (0.5 + 0.25) / 2
    assert r["train_reward"] == pytest.approx(0.7)
    assert r["train_brier"] == pytest.approx(0.075)
    assert r["train_auc_degenerate"] == pytest.approx(0.7)  # the None step is left out
    assert (r["forward_tokens"], r["forward_s"], r["fit_s"]) == (150, 0.5, 0.75)  # summed over steps
    assert [h["step"] for h in r["heldout"]] == [0, 5, 6]


def test_arm_figures_average_seeds_at_common_steps_and_at_each_runs_last_evaluation(sweep):
    a = vl.summarise(sweep)["arms"]["wise2"]
    assert a["runs"] == 2 and a["steps"] == [1, 2]
    assert a["zero_variance_share"] == pytest.approx(0.4375)  # (0.375 + 0.5) / 2
    assert a["train_reward"] == pytest.approx(0.6)
    # step 6 was evaluated by seed 0 only: not on the curve
    assert [c["step"] for c in a["heldout_curve"]] == [0, 5]
    assert a["heldout_curve"][1]["brier"] == pytest.approx(0.15)  # (0.125 + 0.175) / 2
    assert a["heldout_curve"][1]["auc_degenerate"] == pytest.approx(0.7)
    # last evaluations: seed 0 at step 6 (0.2, None), seed 1 at step 5 (0.175, 0.65)
    assert a["heldout_final"]["brier"] == pytest.approx(0.1875)
    assert a["heldout_final"]["auc_degenerate"] == pytest.approx(0.65)
    assert a["train_brier"] == pytest.approx([0.075, 0.125])
    assert a["train_auc_degenerate"] == pytest.approx([0.5, 0.7])
    assert a["forward_tokens"] == [150, 200]
    assert a["forward_s"] == [0.5, 1.0] and a["fit_s"] == [0.25, 0.75]


def test_an_arm_without_the_predictor_has_none_for_its_figures(sweep):
    a = vl.summarise(sweep)["arms"]["uniform"]
    assert a["zero_variance_share"] == pytest.approx(0.625)
    assert a["heldout_curve"] == [] and a["heldout_final"] is None
    assert a["train_brier"] is None and a["forward_tokens"] is None


def test_main_writes_the_json(sweep, tmp_path):
    out = tmp_path / "out" / "value_ledger.json"
    vl.main(str(sweep), str(out))
    doc = json.loads(out.read_text())
    assert set(doc["arms"]) == {"wise2", "uniform"}
    assert doc["arms"]["wise2"]["forward_tokens"] == [150, 200]
    assert "machine" in doc and "created" in doc
