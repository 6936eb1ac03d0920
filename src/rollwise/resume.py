"""What a resumed run may change (``rollwise train --resume``; ``Run(cfg, resume=True)``).

A run directory is one run's history: its ledger, checkpoints and ``config.resolved.toml`` say
what was trained and how. Resuming with a different configuration must not rewrite that history,
so before anything in the directory is touched the requested configuration is compared with the
saved one, key by key (dotted paths, strategy options included):

- ``IGNORED`` keys say where the run lives or how it shows progress; they may differ and are not
  recorded.
- ``SAFE`` keys decide only how long the run goes on and how often it evaluates or checkpoints;
  a change is allowed and recorded (``changes.jsonl``: the step it took effect at, old and new
  values), and ``config.resolved.toml`` then holds the new values.
- Any other difference (task, model, controller, objective, seeds, learning rate, sampling, ...)
  would make the run incoherent (its first steps trained one way, the rest another, with one
  config claiming both), so the resume is refused with a ``UserError`` naming the keys.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import tomllib

from rollwise.registry import UserError

CHANGES = "changes.jsonl"
IGNORED = frozenset(
    {"run.dir", "run.name", "run.progress", "run.threads", "run.overwrite", "run.force", "eval.at_start"}
)
SAFE = frozenset(
    {
        "train.steps",
        "train.budget_generated_tokens",
        "train.budget_rollouts",
        "eval.every",
        "run.checkpoint_every",
        "run.keep_checkpoints",
    }
)


def flat(cfg) -> dict[str, Any]:
    """``{"train.lr": 2e-4, "task.options.n_train": 200, ...}`` of a config (unset keys absent)."""
    from rollwise.config import to_toml

    out: dict[str, Any] = {}

    def walk(node: dict, prefix: str) -> None:
        for k, v in node.items():
            if isinstance(v, dict) and v:
                walk(v, f"{prefix}{k}.")
            else:
                out[prefix + k] = v

    walk(tomllib.loads(to_toml(cfg)), "")
    return out


def saved_config(run_dir: Path):
    """The run's saved configuration, validated by this version (``None`` if there is none)."""
    from rollwise.config import load_config

    path = Path(run_dir) / "config.resolved.toml"
    if not path.is_file():
        return None
    try:
        return load_config(path)
    except UserError as e:
        raise UserError(f"cannot resume {run_dir}: its saved config no longer validates ({e})") from None


def differences(saved, requested) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved value, requested value)}`` for every key that differs, ignored keys left out
    (``None`` for a key unset on one side)."""
    a, b = flat(saved), flat(requested)
    keys = sorted((a.keys() | b.keys()) - IGNORED)
    return {k: (a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)}


def check(requested, run_dir: Path) -> dict[str, tuple[Any, Any]]:
    """The safe changes a resume of ``run_dir`` with ``requested`` makes; ``UserError`` naming
    every other changed key. Reads only: nothing in the directory is written."""
    saved = saved_config(run_dir)
    if saved is None:
        return {}
    diff = differences(saved, requested)
    refused = {k: v for k, v in diff.items() if k not in SAFE}
    if refused:
        shown = "; ".join(f"{k}: {_show(old)} -> {_show(new)}" for k, (old, new) in refused.items())
        raise UserError(
            f"cannot resume {run_dir} with a changed {', '.join(refused)} ({shown}): the run's history "
            f"was made with the saved values. Start a new run for that (another run.name), or resume "
            f"changing only {', '.join(sorted(SAFE))}"
        )
    return diff


def record(run_dir: Path, step: int, changes: dict[str, tuple[Any, Any]]) -> dict:
    """Append ``{"step", "time", "changes": {key: [old, new]}}`` to ``changes.jsonl``."""
    line = {
        "step": step,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "changes": {k: [old, new] for k, (old, new) in changes.items()},
    }
    with open(Path(run_dir) / CHANGES, "a") as f:
        f.write(json.dumps(line) + "\n")
    return line


def _show(v: Any) -> str:
    return "(unset)" if v is None else repr(v)
