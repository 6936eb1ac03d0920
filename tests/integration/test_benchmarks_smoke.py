"""Every script under ``benchmarks/`` runs at the current commit (issue #47, item 3): each one at its
smallest size (a step or two, the tiny model), as a user runs it (a subprocess of this Python with
this tree's ``src`` first on the path), writing into the test's temp dir, never over
``benchmarks/results``. A change that breaks a benchmark fails here, not months later when someone
tries to reproduce a committed figure.

Scripts that need what a CPU test machine lacks (a CUDA GPU, vLLM's engine, a Ray cluster, torchrun,
SmolLM2's weights, a second source tree) are run as far as they go here: their argument parsing and
imports (``--help``), plus the part that runs on a CPU where they have one (named in each test).
``test_every_benchmark_script_has_a_smoke_test`` keeps the table below complete.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
HAS_TRL = __import__("importlib").util.find_spec("trl") is not None

pytestmark = pytest.mark.slow


def _env(tmp_path) -> dict:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        "HF_HUB_OFFLINE": "1",
        "ROLLWISE_CACHE": str(tmp_path / "cache"),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }


def bench(tmp_path, script: str, *args: str, timeout: int = 180) -> str:
    """Run ``benchmarks/<script>`` with ``args`` in ``tmp_path``; its output, after asserting exit 0."""
    p = subprocess.run(
        [sys.executable, str(BENCH / script), *map(str, args)],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        cwd=tmp_path,
        timeout=timeout,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"{script} {' '.join(map(str, args))} exited {p.returncode}:\n{out[-3000:]}"
    return out


# ---------------------------------------------------------------- vs_trl.py


@pytest.mark.skipif(not HAS_TRL, reason="TRL is not installed (the 'trl' extra)")
def test_vs_trl_runs_both_sides(tmp_path):
    """The forced-length mode, TRL included (the natural mode differs only in not forcing lengths)."""
    out = tmp_path / "vs_trl.json"
    bench(
        tmp_path,
        "vs_trl.py",
        *("--model", "tiny-s", "--warm-start-steps", "0", "--threads", "1", "--steps", "1", "--warmup", "0"),
        *("--prompts", "2", "--group", "2", "--max-new-tokens", "4", "--lengths", "forced"),
        *("--profile", "never", "--out", out),
    )
    res = json.loads(out.read_text())
    assert set(res["modes"]) == {"forced"}
    forced = res["modes"]["forced"]
    assert forced["same_initial_weights"] is True
    # forced: 2 x 2 completions of exactly 4 tokens on each side
    assert forced["rollwise"]["generated_tokens_per_step_mean"] == forced["trl"]["generated_tokens_per_step_mean"] == 16


def _pretrained_profile_model(dir_: Path) -> str:
    """The tiny model saved as a Hugging Face directory: rollwise gives a model named by a directory
    the ``pretrained`` profile (rollwise.defaults), whose step-0 probe stops a run with most
    completions cut, as it does for ``--model smollm2-135m`` (benchmarks/results/vs_trl_smollm2.json)."""
    from rollwise.trainer.tiny import build_tiny

    model, tok = build_tiny("tiny-s")
    model.save_pretrained(dir_)
    tok.save_pretrained(dir_)
    return str(dir_)


def test_vs_trl_forced_mode_trains_a_pretrained_model_through_the_truncation_probe(tmp_path):
    """Forced lengths cut every completion at max_new_tokens by design: the rollwise side says so with
    run.force instead of being stopped at step 0 ('100% of step 0's completions were cut')."""
    from rollwise import defaults

    model = _pretrained_profile_model(tmp_path / "model")
    assert defaults.profile(model).truncation_stop
    spec = {
        **dict(model=model, warm_start_steps=0, prompts=1, group=2, max_new_tokens=4, steps=1, warmup=0),
        **dict(lr=2e-4, seed=0, threads=1, work=str(tmp_path), model_dir=model, mode="forced", settings="same"),
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    bench(tmp_path, "vs_trl.py", "--child", "rollwise", "--spec", "spec.json", "--child-out", "res.json")
    steps = json.loads((tmp_path / "res.json").read_text())["steps"]
    assert [(s["rollouts"], s["tokens"]) for s in steps] == [(2, 8)]  # 1 x 2 completions, each cut at 4 tokens
