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

from conftest import as_sets, tiny_overrides

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


# ---------------------------------------------------------------- scripts that run whole on a CPU


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def test_april_throughput(tmp_path):
    bench(
        tmp_path,
        "april_throughput.py",
        *("--levels", "1", "2", "--warm-steps", "2", "--groups", "2", "--n", "2", "--max-new-tokens", "8"),
        *("--steps", "1", "--threads", "1", "--out", tmp_path / "april.json"),
    )
    assert {"sync", "april"} <= set(_json(tmp_path / "april.json")["arms"])


def test_code_sandbox(tmp_path):
    bench(
        tmp_path,
        "code_sandbox.py",
        *("--throughput-only", "--calls", "2", "--repeats", "1", "--modes", "rlimit", "--out", tmp_path / "sb.json"),
    )
    rates = _json(tmp_path / "sb.json")["modes"]["rlimit"]["calls_per_s"]
    assert rates["workers_1"]["median"] > 0 and rates["workers_2"]["median"] > 0


def test_code_sandbox_ab_with_this_tree_on_both_sides(tmp_path):
    src = str(ROOT / "src")
    bench(
        tmp_path,
        "code_sandbox_ab.py",
        *("--before", src, "--after", src, "--modes", "rlimit", "--calls", "2", "--rounds", "1"),
        *("--out", tmp_path / "ab.json"),
    )
    assert (tmp_path / "ab.json").stat().st_size > 0


def test_compute_dtype_auto(tmp_path):
    out = bench(
        tmp_path,
        "compute_dtype_auto.py",
        *("--steps", "1", "--threads", "1", "--warm-start-steps", "0", "--dtypes", "float32"),
        *("--out", tmp_path / "cdt.json"),
    )
    res = _json(tmp_path / "cdt.json")
    assert [d["model"] for d in res["decisions"]] == ["tiny (embedded default)", "smollm2-135m"]
    assert list(res["embedded_default"]["arms"]) == ["float32"]
    assert "warm start (cached for the arms)" not in out  # no warm start to cache: no process run for it


def test_episode_tools(tmp_path):
    bench(
        tmp_path,
        "episode_tools.py",
        *("--episodes", "4", "--turns", "1", "--tokens", "8", "--warm-steps", "2", "--out", tmp_path / "ept.json"),
    )
    assert (tmp_path / "ept.json").stat().st_size > 0


def test_gen_throughput(tmp_path):
    bench(
        tmp_path,
        "gen_throughput.py",
        *("--batch-sizes", "1", "--new-tokens", "2", "--repeats", "1", "--matmul-sizes", "64", "--threads", "1"),
        *("--out", tmp_path / "gen.json"),
    )
    assert _json(tmp_path / "gen.json")["models"]


def test_regime_probes_a_sweep_at_step_0(tmp_path):
    bench(
        tmp_path,
        "regime.py",
        *(BENCH / "arith_quick.toml", "--prompts", "2", "--group-size", "2", "--batch", "2"),
        *("--set", "model.warm_start.steps=0", "--out", tmp_path / "regime.json"),
    )
    assert "step0" in _json(tmp_path / "regime.json")


def test_tree_tokens(tmp_path):
    bench(
        tmp_path,
        "tree_tokens.py",
        *("--prompts", "1", "--etmr-roots", "1", "--ec-leaves", "2", "--set", "model.warm_start.steps=0"),
        *("--out", tmp_path / "tree.json"),
    )
    res = _json(tmp_path / "tree.json")
    assert set(res["samplers"]) == {"etmr", "ec_tree"} and res["machine"]
    assert res["samplers"]["etmr"]["leaves_per_prompt"] == 5 and res["samplers"]["etmr"]["paper_ratio"] == 0.6


def test_simulate_async(tmp_path):
    bench(
        tmp_path,
        "simulate_async.py",
        *("--steps", "5", "--warmup", "1", "--workers", "1", "2", "--eta", "1", "--no-comparison"),
        *("--out", tmp_path / "sim.json"),
    )
    assert _json(tmp_path / "sim.json")["sweep"]


def test_table_of_a_committed_compare_result(tmp_path):
    out = bench(tmp_path, "table.py", BENCH / "results" / "arith_quick" / "compare.json")
    assert out.startswith("| arm |") and "Target: held-out pass@1" in out


def test_ledger_fingerprint_runs_and_compares(tmp_path):
    bench(tmp_path, "ledger_fingerprint.py", "--only", "grpo", "--out", tmp_path / "a.json")
    data = json.loads((tmp_path / "a.json").read_text())
    assert len(data["grpo"]) == 4 and not any(k.startswith("metrics.jsonl:time/") for k in data["grpo"][0])
    assert (
        bench(tmp_path, "ledger_fingerprint.py", "--compare", tmp_path / "a.json", tmp_path / "a.json").strip()
        == "equal"
    )
    data["grpo"][1]["metrics.jsonl:reward/mean"] = -1.0
    (tmp_path / "b.json").write_text(json.dumps(data))
    p = subprocess.run(
        [sys.executable, str(BENCH / "ledger_fingerprint.py"), "--compare", tmp_path / "a.json", tmp_path / "b.json"],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        timeout=60,
    )
    assert p.returncode == 1 and "grpo line 1 metrics.jsonl:reward/mean" in p.stdout


def test_train_profile(tmp_path):
    bench(
        tmp_path,
        "train_profile.py",
        *("--model", "tiny-s", "--rows", "2", "--completion-len", "4", "--repeats", "1", "--threads", "1"),
        *("--out", tmp_path / "tp.json"),
    )
    assert set(_json(tmp_path / "tp.json")["modes"]) == {"forced", "natural"}


def test_train_packing(tmp_path):
    bench(
        tmp_path,
        "train_packing.py",
        *("--cases", "default", "--rows", "8", "--repeats", "1", "--threads", "1", "--out", tmp_path / "tp.json"),
    )
    case = _json(tmp_path / "tp.json")["cases"]["default"]
    assert case["rows"] == 8 and len(case["seconds_off"]) == len(case["seconds_on"]) == 1
    assert case["layout"]["padded_rows"] == 8 and case["layout"]["packed_rows"] == 1  # 8 short rows share one


def test_value_ceiling(tmp_path):
    bench(
        tmp_path,
        "value_ceiling.py",
        *("--prompts", "4", "--max-new-tokens", "8", "--warm-start-steps", "0", "--out", tmp_path / "vc.json"),
    )
    assert _json(tmp_path / "vc.json")["prompts"] == 4


def test_episode_runs_summarises_a_real_episode_run(tmp_path):
    import rollwise
    from rollwise.config import load_config

    small = {"model.warm_start.steps": 2, "control.prompts_per_step": 1, "control.rollouts_per_prompt": 2}
    small.update({"eval.n_prompts": 1, "eval.samples": 1, "eval.k": [1], "eval.at_start": False})
    o = tiny_overrides(tmp_path / "sweep", name="calc-s0", steps=1, **{"task.name": "calculator", **small})
    del o["task.options"]
    rollwise.train(load_config(overrides=as_sets(o)), log=lambda m: None)
    slots = {"task.env_slots": 1, "task.episode_schedule": "rollout_wise", "task.high_entropy_turns": 0.5}
    o = tiny_overrides(tmp_path / "sweep", name="slots-s0", steps=1, **{"task.name": "calculator", **small, **slots})
    del o["task.options"]
    rollwise.train(load_config(overrides=as_sets(o)), log=lambda m: None)
    bench(tmp_path, "episode_runs.py", tmp_path / "sweep", tmp_path / "runs.json")
    runs = _json(tmp_path / "runs.json")["runs"]
    run = runs["calc-s0"]
    assert run["episodes"] == 2 and sum(run["ends"].values()) == 2  # how every episode ended (issue #44)
    assert "turn_budget" not in run and "schedule" not in run  # only runs with these keys report them
    s = runs["slots-s0"]["schedule"]  # one slot: the two episodes ran one after the other
    assert s["slot_s"] == s["wall_s"] > 0 and 0 < s["env_utilisation"] <= 1 and 0 < s["sampler_utilisation"] <= 1
    assert s["rows_per_call"] == 1.0  # one episode in the slot at a time: a row per call
    cur = runs["slots-s0"]["curation"]
    assert cur["entropy_turns/kept"] == -(-runs["slots-s0"]["turns"] // 2)


def test_schedule_probe(tmp_path):
    bench(
        tmp_path,
        "schedule_probe.py",
        "--prompts",
        "1",
        "--samples",
        "2",
        "--warm-steps",
        "2",
        "--out",
        tmp_path / "s.json",
    )
    rows = _json(tmp_path / "s.json")["rows"]
    assert [r["variant"] for r in rows] == ["one_call", "one_row_per_call", "slots_lockstep", "slots_rollout_wise"]
    assert all(len(r["pass@1_eval_seeds_0_1"]) == 2 for r in rows)
    # a call's rows are decoded independently: one row per call draws what the batched call draws
    assert rows[0]["pass@1_eval_seeds_0_1"] == rows[1]["pass@1_eval_seeds_0_1"]


# ---------------------------------------------------------------- scripts that need what a CPU test lacks


def test_static_decode_cpu(tmp_path):
    bench(
        tmp_path,
        "static_decode_cpu.py",
        *("--models", "tiny-s", "--groups", "2", "--group-size", "2", "--new-tokens", "3", "--repeats", "2"),
        *("--threads", "1", "--out", tmp_path / "sd.json"),
    )
    (row,) = _json(tmp_path / "sd.json")["models"]
    assert set(row["paths"]) == {"eager", "static"} and row["static_speedup_cpu"] > 0


def test_gpu_check_smoke_decode_on_a_cpu(tmp_path):
    """The GPU check's decode comparison (eager, static, transformers' static cache) and FP8 products at toy sizes."""
    bench(tmp_path, "gpu_check.py", "--smoke", "--out", tmp_path / "gc.json", timeout=600)
    rows = _json(tmp_path / "gc.json")["decode"]["rows"]
    assert [(r["batch"], r["path"]) for r in rows] == [(b, p) for b in (2, 4) for p in ("eager", "static", "library")]
    assert all("error" not in r and r["tokens_per_s"] > 0 and r["launches_per_step"]["cpu_ops"] > 0 for r in rows)
    (fp8,) = _json(tmp_path / "gc.json")["fp8_gemm"]["rows"]  # the real FP8 products agree with the emulated ones
    assert fp8["max_rel_diff_real_vs_emulated"] < 1e-5 and fp8["scaled_mm_blocks_s"] > 0
    # the static path decodes on its generation copy: fp32 here, so it shares every master tensor
    assert [r.get("generation_copy") for r in rows if r["path"] == "static"] == [
        {"linear_dtype": "float32", "own_mib": 0.0, "own_tensors": 0}
    ] * 2
    assert all("generation_copy" not in r for r in rows if r["path"] != "static")


# script -> what it needs beyond this machine; here: its imports and argument parsing
NEEDS = {
    "async_steps.py": "a Ray cluster of rollout workers, 4 whole runs per task",
    "data_parallel.py": "torchrun with 2 ranks, 3 whole runs",
    "sapo.py": "swarms of 2-4 peers, each a whole run",
    "scale_out.py": "vLLM's engine and SmolLM2's weights, Ray",
    "gen_throughput_vllm.py": "vLLM's engine and SmolLM2's weights",
    "gen_compile.py": "SmolLM2's weights and torch.compile's minutes of compilation",
    "fapo_judge.py": "a judge trained for 300 supervised and 20 GRPO steps (~18 minutes) before it is scored",
    "pretrained_lengths.py": "SmolLM2's weights",
    "gpu_check.py": "a CUDA GPU (its decode comparison runs on a CPU: test_gpu_check_smoke_decode_on_a_cpu)",
    "gpu_bundle.py": "SmolLM2's 94 MiB GGUF split into parts (its logic: tests/unit/bench/test_gpu_bundle.py)",
}


@pytest.mark.parametrize("script", sorted(NEEDS))
def test_scripts_that_need_more_parse_their_arguments(tmp_path, script):
    assert "usage:" in bench(tmp_path, script, "--help")


# ---------------------------------------------------------------- the compare configurations


@pytest.mark.parametrize("toml", sorted(p.name for p in BENCH.glob("*.toml")))
def test_every_arm_of_a_compare_config_loads(toml):
    """``rollwise compare --config benchmarks/<toml>`` builds every arm x seed config (load_config and
    the compatibility check) before it runs any."""
    from conftest import skip_without_judge_runs
    from rollwise.bench.sweep import load_sweep, plan

    skip_without_judge_runs(BENCH / toml)
    specs = plan(load_sweep(BENCH / toml))
    assert specs and all(s.cfg.train.steps >= 1 for s in specs)


# ---------------------------------------------------------------- the table is complete

SMOKED = {
    "benchinfo.py": "imported by every script here; its helpers: tests/unit/bench/test_bench_scripts.py",
    "vs_trl.py": "test_vs_trl_runs_both_sides, test_vs_trl_forced_mode_trains_a_pretrained_model_through_the_...",
    "april_throughput.py": "test_april_throughput",
    "tree_tokens.py": "test_tree_tokens",
    "code_sandbox.py": "test_code_sandbox",
    "code_sandbox_ab.py": "test_code_sandbox_ab_with_this_tree_on_both_sides",
    "compute_dtype_auto.py": "test_compute_dtype_auto",
    "episode_runs.py": "test_episode_runs_summarises_a_real_episode_run",
    "schedule_probe.py": "test_schedule_probe",
    "episode_tools.py": "test_episode_tools",
    "gen_throughput.py": "test_gen_throughput",
    "static_decode_cpu.py": "test_static_decode_cpu",
    "regime.py": "test_regime_probes_a_sweep_at_step_0",
    "simulate_async.py": "test_simulate_async",
    "table.py": "test_table_of_a_committed_compare_result",
    "train_profile.py": "test_train_profile",
    "train_packing.py": "test_train_packing",
    "value_ceiling.py": "test_value_ceiling",
    "value_ledger.py": "its derivations on hand-worked ledgers: tests/unit/bench/test_value_ledger.py",
    "mismatch_summary.py": "its summary of hand-written ledgers: tests/unit/bench/test_mismatch_summary.py",
    "skip_cap.py": "its figures on hand-worked ledgers: tests/unit/bench/test_skip_cap.py",
    "ledger_fingerprint.py": "test_ledger_fingerprint_runs_and_compares",
    **{k: "test_scripts_that_need_more_parse_their_arguments" for k in NEEDS},
}


def test_every_benchmark_script_has_a_smoke_test():
    assert sorted(p.name for p in BENCH.glob("*.py")) == sorted(SMOKED)
    assert not list(BENCH.glob("*.sh"))  # a shell script would need its own smoke test here
