"""benchmarks/mismatch_summary.py: per-arm means of the sampler/trainer gap over steps, then seeds."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[3] / "benchmarks" / "mismatch_summary.py"


def _module():
    spec = importlib.util.spec_from_file_location("mismatch_summary", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(root, name, gaps):
    d = root / name
    d.mkdir()
    lines = [{"step": i, "mismatch/abs_mean": g, "mismatch/k3_kl": g / 10} for i, g in enumerate(gaps)]
    lines.append({"step": len(gaps)})  # a line without the metric (a skipped step) is not counted
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_means_over_steps_then_seeds(tmp_path):
    # arm a: seed 0 steps [0.1, 0.3] -> 0.2, seed 1 [0.4] -> 0.4; arm mean 0.3 (3e5 in millionths)
    _run(tmp_path, "a-s0", [0.1, 0.3])
    _run(tmp_path, "a-s1", [0.4])
    _run(tmp_path, "b_x-s0", [0.002])
    out = _module().summary(tmp_path)
    assert set(out) == {"a", "b_x"}
    assert out["a"]["seeds"]["0"]["mismatch/abs_mean"] == pytest.approx(0.2)
    assert out["a"]["mismatch/abs_mean"] == pytest.approx(0.3)
    assert out["a"]["mismatch/abs_mean x1e6"] == pytest.approx(300000.0)
    assert out["b_x"]["mismatch/k3_kl x1e6"] == pytest.approx(200.0)


def test_sol_rl_gap_and_steps_only_where_logged(tmp_path):
    _run(tmp_path, "u-s0", [0.1, 0.3])  # no sol_rl/* metric: no such key for the arm
    d = tmp_path / "sol-s0"
    d.mkdir()
    rows = [{"mismatch/abs_mean": 1e-7, "mismatch/k3_kl": 0.0, "sol_rl/fp8_gap_abs_mean": g} for g in (0.002, 0.004)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    out = _module().summary(tmp_path)
    assert "sol_rl/fp8_gap_abs_mean" not in out["u"] and out["u"]["seeds"]["0"]["steps"] == 3
    assert out["sol"]["sol_rl/fp8_gap_abs_mean x1e6"] == pytest.approx(3000.0)
    assert out["sol"]["seeds"]["0"]["steps"] == 2


def test_fapo_detector_shares(tmp_path):
    # FAPO's detector: the share of checked rollouts called flawed / undecided, averaged over steps then seeds
    for seed, flawed in ((0, (0.1, 0.3)), (1, (0.0, 0.0))):
        d = tmp_path / f"judge-s{seed}"
        d.mkdir()
        rows = [{"fapo/flawed_frac": f, "fapo/undecided_frac": 0.5} for f in flawed]
        (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    out = _module().summary(tmp_path)["judge"]
    assert out["fapo/flawed_frac"] == pytest.approx(0.1) and out["fapo/undecided_frac"] == pytest.approx(0.5)
