"""``rollwise swarm``: start N SAPO peers (rollwise.replay.sapo) on this machine and summarise them.

Each peer is an ordinary ``rollwise train`` run in its own process, with its own policy, prompt
stream and sampling seed (``run.seed = base seed + k``), named ``peer-<k>`` in the run directory
``<run.dir>/<run.name or "swarm">/``, and with ``replay.name = "sapo"`` publishing to and reading
from the shared directory ``<that directory>/shared`` (or ``replay.options.swarm_dir`` when the
config sets it). The peers run at once and do not wait for each other (SAPO's rounds are
asynchronous); every peer's output goes to ``peer-<k>.log`` beside its run directory. After the
last peer ends, ``swarm.json`` records per peer its exit status, steps, generated and received
rollouts and tokens, and first and last held-out pass@1.

Layout::

    runs/<swarm>/peer-0/   ... peer-<N-1>/   the peers' run directories (metrics.jsonl, eval.jsonl, ...)
    runs/<swarm>/shared/peer-<k>/step-<step>.jsonl   what each peer published (text only)
    runs/<swarm>/peer-<k>.toml, peer-<k>.log, swarm.json

The config's replay section must be ``on_policy`` (the default; it becomes ``sapo`` with default
options) or ``sapo`` (its options are kept; ``peer`` and, unless set, ``swarm_dir`` are filled
in). ``replay.options.external = 0`` gives the isolated baseline: the same peers, no sharing.
Peers get ``run.threads = max(1, cores // N)`` unless the config sets it. The built-in tiny
model's warm start is computed once in this process before the peers start, so they load it from
the cache instead of training it N times at once.

On a Ray cluster (``--ray``, optionally ``--address host:port``; Ray started locally without
it): each peer is a Ray task of ``run.threads`` CPUs that runs the same ``rollwise train`` process on
whichever node Ray picks. The swarm directory (configs, logs, run directories, ``shared/``) must
then be on a filesystem every node sees, as for peers started by hand with the same ``swarm_dir``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rollwise.registry import UserError


def peer_configs(config: Path | None, overrides: list[str], peers: int) -> tuple[Path, list]:
    """(swarm directory, one validated ``Config`` per peer); refuses bad input before anything runs."""
    import copy

    from rollwise.config import apply_overrides, load_config, read_toml

    if peers < 1:
        raise UserError(f"--peers must be at least 1 (got {peers})")
    raw = apply_overrides(read_toml(config) if config is not None else {}, list(overrides))
    replay = dict(raw.get("replay") or {})
    name, options = replay.get("name", "sapo"), dict(replay.get("options") or {})  # unnamed: SAPO, options and all
    if name not in ("on_policy", "sapo") or (name == "on_policy" and options):
        raise UserError(
            f"rollwise swarm trains SAPO peers (replay.name = 'sapo'); the config sets replay.name = {name!r}"
            f"{' with options' if options else ''}: remove it or set replay.name = 'sapo'"
        )
    base = load_config(data={**raw, "replay": {"name": "on_policy"}})  # everything but the replay section
    root = Path(base.run.dir) / (base.run.name or "swarm")
    shared = Path(options.get("swarm_dir") or root / "shared")
    threads = base.run.threads or max(1, (os.cpu_count() or 1) // peers)
    cfgs = []
    for k in range(peers):
        data = copy.deepcopy(raw)
        data.setdefault("run", {}).update(
            {"dir": str(root), "name": f"peer-{k}", "seed": base.run.seed + k, "threads": threads, "progress": False}
        )
        data["replay"] = {"name": "sapo", "options": {**options, "swarm_dir": str(shared), "peer": f"peer-{k}"}}
        cfgs.append(load_config(data=data))
    return root, cfgs


def _train_command(config_path) -> list[str]:
    """A peer's command line: ``rollwise train --config config_path`` in this interpreter."""
    return [sys.executable, "-m", "rollwise.cli", "train", "--config", str(config_path)]


def _peer_process(config_path: str, log_path: str, env: dict) -> int:
    """One peer: ``rollwise train --config config_path``, output to ``log_path``; its exit status."""
    with open(log_path, "w") as out:
        return subprocess.run(_train_command(config_path), stdout=out, stderr=subprocess.STDOUT, env=env).returncode


def _run_on_ray(paths: list[tuple[Path, Path]], cpus: int, address: str | None, env: dict, log=print) -> list[int]:
    """Each (config, log) pair as a Ray task of ``cpus`` CPUs (module docstring); exit statuses."""
    from types import SimpleNamespace

    from rollwise.distributed.ray_pool import connect, shutdown

    ray = connect(
        SimpleNamespace(workers=len(paths), cpus_per_worker=cpus, gpus_per_worker=0, address=address), log=log
    )
    try:
        task = ray.remote(num_cpus=cpus, max_retries=0)(_peer_process)
        refs = [task.remote(str(c), str(lg), env) for c, lg in paths]
        for (c, _), _ref in zip(paths, refs):
            log(f"{c.stem}: submitted to Ray ({cpus} CPU)")
        return ray.get(refs)
    finally:  # the Ray started here stopped, its tasks with it (a joined cluster keeps running)
        shutdown()


def run_swarm(
    config: Path | None,
    overrides: list[str],
    peers: int,
    log=print,
    poll_s: float = 1.0,
    ray: bool = False,
    address: str | None = None,
) -> dict:
    """Train ``peers`` SAPO peers at once (module docstring); returns the ``swarm.json`` summary.
    A peer that fails does not stop the others (a swarm tolerates a lost node); its exit status
    is in the summary. Ctrl-C stops every peer. ``ray``: the peers as Ray tasks (``address``: the
    cluster to join)."""
    from rollwise.config import to_toml

    root, cfgs = peer_configs(config, overrides, peers)
    shared = Path(cfgs[0].replay.options["swarm_dir"])
    overwrite = cfgs[0].run.overwrite
    for cfg in cfgs:  # the peers' own check (train refuses it too, but only after the others started)
        if cfg.run_dir().exists() and any(cfg.run_dir().iterdir()) and not overwrite:
            raise UserError(f"run directory {cfg.run_dir()} already exists; use another run.name or run.overwrite=true")
    if shared.exists() and any(shared.iterdir()):
        if not overwrite:
            raise UserError(
                f"swarm directory {shared} holds an earlier swarm's rollouts; use another run.name, "
                "replay.options.swarm_dir, or run.overwrite=true"
            )
        shutil.rmtree(shared)
    root.mkdir(parents=True, exist_ok=True)
    from rollwise import components

    components.warm_cache(cfgs[0], log=log)  # the peers load it instead of each training it (and racing to write it)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    paths = []
    for cfg in cfgs:
        path = root / f"{cfg.run.name}.toml"
        path.write_text(to_toml(cfg))
        paths.append((path, root / f"{cfg.run.name}.log"))
    if ray or address is not None:
        codes = _run_on_ray(paths, cfgs[0].run.threads or 1, address, env, log=log)
    else:
        codes = _run_here(paths, cfgs, env, poll_s, log=log)
    summary = summarise(root, cfgs, codes)
    (root / "swarm.json").write_text(json.dumps(summary, indent=1))
    return summary


def _run_here(paths: list[tuple[Path, Path]], cfgs: list, env: dict, poll_s: float, log=print) -> list[int]:
    """Each (config, log) pair as a ``rollwise train`` process on this machine, all at once; exit
    statuses. Ctrl-C stops every peer."""
    procs = []
    try:
        for (path, log_path), cfg in zip(paths, cfgs):
            with open(log_path, "w") as out:
                procs.append(subprocess.Popen(_train_command(path), stdout=out, stderr=subprocess.STDOUT, env=env))
            log(f"{cfg.run.name}: started (seed {cfg.run.seed}, log {log_path})")
        while any(p.poll() is None for p in procs):
            time.sleep(poll_s)
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            p.wait()
        raise
    return [p.returncode for p in procs]


def summarise(root: Path, cfgs: list, codes: list[int]) -> dict:
    """Per peer: exit status, steps, costs (generated and received), first and last pass@1."""
    from rollwise.ledger import read_jsonl

    out = {"swarm_dir": cfgs[0].replay.options["swarm_dir"], "peers": {}}
    for cfg, rc in zip(cfgs, codes):
        lines, evals = read_jsonl(cfg.run_dir() / "metrics.jsonl"), read_jsonl(cfg.run_dir() / "eval.jsonl")
        last = lines[-1] if lines else {}
        out["peers"][cfg.run.name] = {
            "returncode": rc,
            "seed": cfg.run.seed,
            "run_dir": str(cfg.run_dir()),
            "steps": len(lines),
            **{
                k: last.get(f"cost/{k}", 0)
                for k in ("generated_tokens", "rollouts", "received_rollouts", "received_tokens")
            },
            "first_pass@1": evals[0]["eval/pass@1"] if evals else None,
            "last_pass@1": evals[-1]["eval/pass@1"] if evals else None,
        }
    return out
