"""``rollwise runs DIR``: one row per run directory under ``DIR`` (a directory holding a
``config.resolved.toml``), read from its ledger and checkpoints only (no model is loaded).

Row fields: ``name``; ``steps`` (training steps recorded in ``metrics.jsonl``) of
``train.steps``; ``tokens`` (``cost/generated_tokens`` of the last line); ``pass@1`` (the last
``eval.jsonl`` line's, None before any); ``eval_step``; ``checkpoint`` (newest step in place,
None if none); ``state``: ``running`` (another process holds the run's lock), ``done`` (the
steps or a budget reached and ``final/`` written), else ``stopped`` (resumable with
``--resume``).
"""

from __future__ import annotations

import json
from pathlib import Path

import tomllib

from rollwise.registry import UserError


def _last_line(path: Path) -> dict | None:
    if not path.exists():
        return None
    for ln in reversed(path.read_text().splitlines()):
        try:
            return json.loads(ln)
        except ValueError:  # a line cut short by a kill
            continue
    return None


def _locked(run_dir: Path) -> bool:
    try:
        import fcntl
    except ImportError:
        return False
    lock = run_dir / ".lock"
    if not lock.exists():
        return False
    with open(lock) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


def list_runs(root: str | Path) -> list[dict]:
    from rollwise.trainer.checkpoint import latest_step

    root = Path(root)
    if not root.is_dir():
        raise UserError(f"runs directory not found: {root}")
    rows = []
    for cfg_path in sorted(root.glob("**/config.resolved.toml")):
        d = cfg_path.parent
        try:
            cfg = tomllib.loads(cfg_path.read_text())
        except (OSError, tomllib.TOMLDecodeError):
            cfg = {}
        last, ev = _last_line(d / "metrics.jsonl"), _last_line(d / "eval.jsonl")
        steps = last["step"] + 1 if last else 0
        state = "running" if _locked(d) else ("done" if (d / "final").is_dir() else "stopped")
        rows.append(
            {
                "name": str(d.relative_to(root)),
                "steps": steps,
                "max_steps": cfg.get("train", {}).get("steps"),
                "tokens": last.get("cost/generated_tokens", 0) if last else 0,
                "pass@1": ev.get("eval/pass@1") if ev else None,
                "eval_step": ev.get("step") if ev else None,
                "checkpoint": latest_step(d),
                "state": state,
            }
        )
    return rows
