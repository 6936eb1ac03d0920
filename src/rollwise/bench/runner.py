"""Running a sweep's arm × seed runs and turning them into ``compare.json`` and a report.

Each run lives in ``<out_dir>/<arm>-s<seed>/`` (a normal run directory, docs/architecture.md §7). After a
run finishes, ``done.json`` is written there (atomically) with its totals, why it stopped, the
machine and the git commit. A later ``rollwise compare`` on the same sweep

- skips a run whose ``done.json`` is present,
- resumes a run that has a ``config.resolved.toml`` but no ``done.json`` (interrupted) with
  ``train(cfg, resume=True)``, from its latest checkpoint (or step 0 if it has none),
- starts the others,

and refuses, before anything trains, a run directory whose saved config differs from the one the
sweep now asks for (a changed sweep never silently reuses stale runs). Runs go one after another,
or ``jobs`` at a time in spawned processes (each with ``cores // jobs`` torch threads unless
``run.threads`` is set).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import tomllib

from rollwise import storage
from rollwise.bench.sweep import RunSpec, flatten, load_sweep, plan
from rollwise.ledger import REUSE_KEYS
from rollwise.registry import UserError

DONE = "done.json"
# config keys that may differ between sessions of one run (or sweeps sharing it: where it lives)
VOLATILE = {"run": ("progress", "threads", "dir")}


# ---------------------------------------------------------------- run status


def fingerprint(cfg_dict: dict) -> dict:
    d = json.loads(json.dumps(cfg_dict))
    for section, keys in VOLATILE.items():
        for k in keys:
            d.get(section, {}).pop(k, None)
    return d


def config_fingerprint(cfg) -> dict:
    from rollwise.config import to_toml

    return fingerprint(tomllib.loads(to_toml(cfg)))


def saved_fingerprint(path: Path) -> dict:
    """Fingerprint of a run's saved config, re-validated so that options added since it ran
    appear with their defaults (a new option's default keeps the old behaviour)."""
    from rollwise.config import load_config, to_toml

    data = tomllib.loads(path.read_text())
    try:
        return fingerprint(tomllib.loads(to_toml(load_config(data=data))))
    except UserError:  # a key this version no longer knows: compare as saved (it will differ)
        return fingerprint(data)


def status(spec: RunSpec) -> str:
    """'done', 'resume' or 'new'; raises UserError if the directory holds a run of another config."""
    d = spec.dir
    saved = d / "config.resolved.toml"
    if not saved.is_file():
        if (d / DONE).exists():
            raise UserError(f"{d} has {DONE} but no config.resolved.toml; delete the directory to run it again")
        return "new"
    from rollwise import defaults  # the saved config holds the derived defaults (issue #32): compare like with like

    old, new = (
        flatten(saved_fingerprint(saved)),
        flatten(config_fingerprint(defaults.resolve(spec.cfg, log=lambda m: None))),
    )
    if old != new:
        keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        raise UserError(
            f"{d} holds a run made with a different config than this sweep asks for (differs in "
            f"{', '.join(keys[:6])}{', ...' if len(keys) > 6 else ''}); delete it (or choose another out_dir) to run "
            "it again"
        )
    return "done" if (d / DONE).is_file() else "resume"


def read_done(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / DONE).read_text())


def session(done: dict) -> dict:
    """The wall-clock interval {"start", "end", "jobs"} (unix seconds) of the session that finished a
    run, from its ``done.json``; older records (no ``started_unix``) give it from ``finished_at``
    minus ``session_s`` (to the second), and None where that is missing too."""
    end, start = done.get("finished_unix"), done.get("started_unix")
    if start is None and done.get("finished_at") and done.get("session_s") is not None:
        from datetime import datetime

        try:
            end = datetime.strptime(done["finished_at"], "%Y-%m-%dT%H:%M:%S%z").timestamp()
        except ValueError:
            end = None
        start = None if end is None else end - float(done["session_s"])
    return {"start": start, "end": end, "jobs": done.get("jobs", 1)}


# ---------------------------------------------------------------- machine


def machine_info() -> dict:
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu or platform.processor() or None,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "gpu": None,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def git_info() -> dict | None:
    """Commit of the rollwise source tree (and whether tracked files differ from it), if it is a git checkout."""
    here = Path(__file__).resolve().parent

    def git(*args):
        return subprocess.run(["git", *args], cwd=here, capture_output=True, text=True, timeout=10)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip()) if dirty.returncode == 0 else None}
    except (OSError, subprocess.SubprocessError):
        return None


# ---------------------------------------------------------------- running


def execute(cfg, resume: bool, train_fn: Callable | None = None, log=print, jobs: int = 1) -> dict:
    """Train one run (or finish an interrupted one) and write its ``done.json``; returns that record.
    It records the session's wall-clock interval (``started_unix``, ``finished_unix``) and ``jobs``
    (runs trained at once), from which compare tells whether runs shared the machine."""
    if train_fn is None:
        from rollwise.loop import train as train_fn
    t0 = time.time()
    result = train_fn(cfg, resume=resume, log=log)
    tc = cfg.train
    budget = tc.budget_generated_tokens or tc.budget_rollouts
    spent = result.totals.get("generated_tokens" if tc.budget_generated_tokens else "rollouts", 0)
    # the reuse totals (SPEC-RL) are 0, not absent, for other strategies and for runs of no step
    record = {
        "steps": result.steps,
        "totals": {**{k: 0 for k in REUSE_KEYS}, **result.totals},
        "stopped_by": "budget" if budget is not None and spent >= budget else "steps",
        "final_eval": result.last_eval,
        "session_s": round(time.time() - t0, 3),
        "started_unix": round(t0, 3),
        "finished_unix": round(time.time(), 3),
        "jobs": jobs,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "git": git_info(),
    }
    tmp = Path(result.run_dir) / (DONE + ".tmp")
    with storage.guard(f"{DONE} in {result.run_dir}", result.run_dir, cleanup=[tmp]):
        tmp.write_text(json.dumps(record, indent=1))
        tmp.rename(Path(result.run_dir) / DONE)
    return record


def _execute_in_child(cfg_dict: dict, resume: bool, jobs: int) -> dict:
    from rollwise.config import Config

    cfg = Config.model_validate(cfg_dict)
    name = cfg.run_name()
    os.environ["ROLLWISE_PROGRESS"] = "plain"  # runs share the terminal: progress as log lines labelled by run
    return execute(cfg, resume, log=lambda m: print(f"[{name}] {m}", flush=True), jobs=jobs)


def run_all(specs: list[RunSpec], jobs: int = 1, log=print, train_fn: Callable | None = None) -> dict[str, str]:
    """Bring every run to done; returns {run name: 'skipped' | 'resumed' | 'trained'}. Statuses are
    checked for all runs before the first one starts."""
    states = {s.name: status(s) for s in specs}
    todo = [s for s in specs if states[s.name] != "done"]
    outcome = {s.name: "skipped" for s in specs if states[s.name] == "done"}
    for name in outcome:
        log(f"{name}: already done, skipped")
    if not todo:
        return outcome
    cores = os.cpu_count() or 1
    jobs = max(1, min(jobs, len(todo), cores))
    if jobs == 1 or train_fn is not None:
        for i, s in enumerate(todo, 1):
            resume = states[s.name] == "resume"
            log(f"[{i}/{len(todo)}] {s.name}: {'resuming' if resume else 'training'} ({s.dir})")
            execute(s.cfg, resume, train_fn, log=lambda m, n=s.name: log(f"[{n}] {m}"))
            outcome[s.name] = "resumed" if resume else "trained"
        return outcome
    import multiprocessing as mp

    threads = max(1, cores // jobs)
    log(f"{len(todo)} runs, {jobs} at a time ({threads} torch threads each unless run.threads is set)")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
        futures = {}
        for s in todo:
            cfg = (
                s.cfg
                if s.cfg.run.threads
                else s.cfg.model_copy(update={"run": s.cfg.run.model_copy(update={"threads": threads})})
            )
            futures[s.name] = pool.submit(
                _execute_in_child, cfg.model_dump(mode="json"), states[s.name] == "resume", jobs
            )
        for name, fut in futures.items():
            fut.result()  # re-raises a run's error
            outcome[name] = "resumed" if states[name] == "resume" else "trained"
            log(f"{name}: done")
    return outcome


# ---------------------------------------------------------------- the comparison


def collect(specs: list[RunSpec]) -> dict[str, dict[int, list[dict]]]:
    from rollwise.ledger import read_jsonl

    out: dict[str, dict[int, list[dict]]] = {}
    for s in specs:
        evals = read_jsonl(s.dir / "eval.jsonl")
        if not evals:
            raise UserError(f"run {s.dir} has no eval.jsonl lines")
        out.setdefault(s.arm, {})[s.seed] = evals
    return out


def compare(
    sweep_path: str | Path,
    overrides: list[str] | None = None,
    out_dir: str | Path | None = None,
    jobs: int | None = None,
    log=print,
    train_fn: Callable | None = None,
) -> dict:
    """``rollwise compare``: validate the sweep and every run's config, run what is not done, write
    ``compare.json``, the plot and ``report.html`` under the output directory; returns compare.json's dict."""
    from rollwise.bench import analysis, report
    from rollwise.config import to_toml

    sweep = load_sweep(sweep_path, overrides)
    out = Path(out_dir) if out_dir is not None else sweep.default_out_dir()
    specs = plan(sweep, out)  # every config validated before anything runs
    for s in specs:
        status(s)
    out.mkdir(parents=True, exist_ok=True)
    log(
        f"sweep {sweep.sweep_name()!r}: {len(sweep.arms)} arms x {len(sweep.seeds)} seeds, budget "
        f"{sweep.budget.amount:,} {sweep.budget.unit.replace('_', ' ')}, runs in {out}"
    )
    run_all(specs, jobs if jobs is not None else sweep.jobs, log=log, train_fn=train_fn)

    evals = collect(specs)
    done = {s.name: read_done(s.dir) for s in specs}
    if sweep.budget.generated_tokens is not None:
        x_max = float(sweep.budget.generated_tokens)
    else:  # a rollouts budget: AUC over the largest token count any run reached
        x_max = float(max(d["totals"]["generated_tokens"] for d in done.values())) or 1.0
    ks = specs[0].cfg.eval.k
    shared = analysis.shared_machine({s.name: session(done[s.name]) for s in specs})
    result = analysis.analyse(evals, sweep.baseline_arm, x_max, ks, sweep.target, shared=shared)
    machine = machine_info()
    arms = {}
    for arm in sweep.arms:
        a = result["arms"][arm.name]
        runs = {}
        for s in (s for s in specs if s.arm == arm.name):
            d = done[s.name]
            fe = d.get("final_eval", {})
            run = {
                "dir": s.dir.as_posix(),
                "steps": d["steps"],
                "stopped_by": d["stopped_by"],
                "generated_tokens": d["totals"].get("generated_tokens"),
                "rollouts": d["totals"].get("rollouts"),
                # rollout-stage work besides generation (SPEC-RL's reuse and verification pass)
                **{k: d["totals"].get(k, 0) for k in REUSE_KEYS},
                "wall_s": fe.get("wall_s"),
                "train_s": analysis.train_seconds(sorted(evals[s.arm][s.seed], key=lambda e: e["step"]))[-1],
                "final_pass@1": fe.get("eval/pass@1"),
                "finished_at": d.get("finished_at"),
                "git": d.get("git"),
            }
            if {k: d.get("machine", {}).get(k) for k in ("cpu", "torch", "gpu")} != {
                k: machine[k] for k in ("cpu", "torch", "gpu")
            }:
                run["machine"] = d.get("machine")
            runs[str(s.seed)] = run
        arms[arm.name] = {
            "description": arm.description,
            "set": arm.set,
            "runs": runs,
            "metrics": a["metrics"],
            "ratios": a["ratios"],
            "separation": a["separation"],
            "confounded": a["confounded"],
            "paired": a["paired"],
            "curve": a["curve"],
        }
    compare_json = {
        "schema": 1,
        "sweep": {
            "name": sweep.sweep_name(),
            "file": Path(sweep_path).as_posix(),
            "out_dir": out.as_posix(),
            "arms": [a.name for a in sweep.arms],
            "baseline": sweep.baseline_arm,
            "seeds": sweep.seeds,
            "budget": {sweep.budget.unit: sweep.budget.amount},
            "jobs": jobs if jobs is not None else sweep.jobs,
        },
        "target": result["target"],
        "auc_tokens": result["auc_tokens"],
        "wall_clock": result["wall_clock"],
        "ci": analysis.BOOTSTRAP,
        "paired": analysis.PAIRED,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine,
        "git": git_info(),
        "arms": arms,
        "warnings": result["warnings"],
    }
    configs = {arm.name: to_toml(next(s.cfg for s in specs if s.arm == arm.name)) for arm in sweep.arms}
    tmp = out / "compare.json.tmp"  # atomic: a failed write leaves the previous compare.json or none
    with storage.guard(
        f"compare.json in {out}",
        out,
        then="run the same rollwise compare again (finished runs are skipped)",
        cleanup=[tmp],
    ):
        tmp.write_text(json.dumps(compare_json, indent=1))
        tmp.replace(out / "compare.json")
        paths = report.write(out, compare_json, configs)
    log(f"wrote {out / 'compare.json'}, {', '.join(str(p) for p in paths)}")
    return compare_json  # its warnings are printed by the caller (the CLI prints each once)
