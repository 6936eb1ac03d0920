"""Experiment trackers (``run.report_to``), as Hugging Face ``TrainingArguments.report_to``:
``tensorboard``, ``wandb``, ``mlflow``, ``trackio``, any subset (default none).

Contract:

- Each tracker is an optional extra (``pip install 'rollwise[track]'``) imported only when
  named; ``check(names)`` (called at config load) rejects a tracker whose package is missing,
  naming ``run.report_to`` and the package, before any model is loaded.
- The ledger feeds every line it writes (``Ledger.sinks``): each ``metrics.jsonl`` line's numeric
  values, and each ``eval.jsonl`` line's ``eval/*`` values, are logged against the line's
  ``step`` and against ``cost/generated_tokens`` (the run's generated training tokens then).
  How each tracker shows the token axis:

  * tensorboard: two event directories under ``<run>/tensorboard/``: ``step/`` (x = step)
    and ``tokens/`` (x = generated tokens), same tags; the config as text ``config``.
  * mlflow: each metric at step = step and, as ``by_tokens/<key>``, at step = tokens; the
    config flattened to params (``section.key``). Metric names have ``@`` written ``_at_``
    (``eval/pass_at_1``): MLflow refuses ``@``. Store: ``$MLFLOW_TRACKING_URI`` or
    ``<run>/mlruns`` (a local file store; MLflow 3 wants ``MLFLOW_ALLOW_FILE_STORE=true`` for it,
    which rollwise sets when it picks this default), experiment ``rollwise``.
  * wandb: ``wandb.log(values, step=step)``; ``by_tokens/<key>`` series are declared with
    ``define_metric(step_metric="cost/generated_tokens")``. Mode ``$WANDB_MODE``, else
    ``offline`` unless ``WANDB_API_KEY`` is set; files under ``<run>/wandb``; project
    ``$WANDB_PROJECT`` or ``rollwise``.
  * trackio: ``trackio.log(values, step=step)`` (values include ``cost/generated_tokens``,
    selectable as x axis in its UI), stored where trackio stores (``$TRACKIO_DIR``).

- Resuming: a resumed run continues the same tracker run (ids kept in
  ``<run>/trackers.json``); tensorboard purges the events at or after the resumed step (and
  above the resumed token count), so the training curves have no duplicate points; points the others got after the
  checkpoint are logged again at the same step (W&B keeps its first value of a step).
- A tracker that raises (at start or mid-run) is reported once through ``log`` and dropped;
  training never stops for a tracker.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import uuid
from pathlib import Path

from rollwise.registry import UserError

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}
NAMES = tuple(PACKAGES)


def check(names) -> None:
    """UserError naming ``run.report_to`` if a named tracker's package is not installed."""
    for name in names:
        if importlib.util.find_spec(PACKAGES[name]) is None:
            raise UserError(
                f"run.report_to names {name!r}, but its package {PACKAGES[name]!r} is not installed: "
                f"pip install 'rollwise[track]' (or pip install {PACKAGES[name]})"
            )


def scalars(kind: str, line: dict) -> dict[str, float]:
    """The values of a ledger line that trackers log: numbers (not bools) other than ``step``;
    for an eval line only ``eval/*`` (its cost and wall-clock values repeat the train lines')."""
    out = {}
    for k, v in line.items():
        if k == "step" or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        if kind == "eval" and not k.startswith("eval/"):
            continue
        out[k] = float(v)
    return out


def flatten(d: dict, prefix: str = "") -> dict[str, str]:
    """``{"run": {"seed": 0}}`` -> ``{"run.seed": "0"}`` (leaves as JSON text, strings as is)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v if isinstance(v, str) else json.dumps(v)
    return out


class Trackers:
    """The run's trackers behind one call: ``trackers(kind, line)`` (a ``Ledger`` sink)."""

    def __init__(
        self, names, run_dir: Path, config: dict, config_toml: str, start_step: int, start_tokens: int, log=print
    ):
        self.log, self.active = log, []
        self.dir = Path(run_dir)
        ids_path = self.dir / "trackers.json"
        ids = json.loads(ids_path.read_text()) if ids_path.exists() else {}
        for name in names:
            try:
                self.active.append((name, _CLASSES[name](self.dir, config, config_toml, start_step, start_tokens, ids)))
            except Exception as e:  # noqa: BLE001 - a tracker never stops training
                self._report(name, "start", e)
        tmp = ids_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(ids))
        os.replace(tmp, ids_path)

    def _report(self, name: str, when: str, e: Exception) -> None:
        self.log(f"tracker {name!r} failed at {when} ({type(e).__name__}: {e}); training continues without it")

    def __call__(self, kind: str, line: dict) -> None:
        values = scalars(kind, line)
        step, tokens = int(line["step"]), int(line.get("cost/generated_tokens", 0))
        for entry in list(self.active):
            try:
                entry[1].log(values, step, tokens)
            except Exception as e:  # noqa: BLE001
                self.active.remove(entry)
                self._report(entry[0], f"step {step}", e)

    def close(self) -> None:
        for name, t in self.active:
            try:
                t.close()
            except Exception as e:  # noqa: BLE001
                self._report(name, "finish", e)
        self.active = []


class TensorBoard:
    def __init__(self, run_dir, config, config_toml, start_step, start_tokens, ids):
        from torch.utils.tensorboard import SummaryWriter

        root = Path(run_dir) / "tensorboard"
        self.by_step = SummaryWriter(str(root / "step"), purge_step=start_step or None)
        # the line of the last step before the checkpoint sits at start_tokens and stays
        self.by_tokens = SummaryWriter(str(root / "tokens"), purge_step=start_tokens + 1 if start_step else None)
        if not start_step:
            self.by_step.add_text("config", "```\n" + config_toml + "\n```", 0)

    def log(self, values, step, tokens):
        for k, v in values.items():
            self.by_step.add_scalar(k, v, step)
            self.by_tokens.add_scalar(k, v, tokens)
        self.by_step.flush()
        self.by_tokens.flush()

    def close(self):
        self.by_step.close()
        self.by_tokens.close()


def mlflow_key(key: str) -> str:
    """MLflow metric names allow letters, digits and ``_ - . / space``: ``eval/pass@1`` ->
    ``eval/pass_at_1``, anything else -> ``_``."""
    return re.sub(r"[^0-9A-Za-z_\-./ ]", "_", key.replace("@", "_at_"))


class MLflow:
    def __init__(self, run_dir, config, config_toml, start_step, start_tokens, ids):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # the local file store, which MLflow 3 keeps behind an opt-in
            uri = (Path(run_dir).resolve() / "mlruns").as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        run_id = ids.get("mlflow")
        if run_id is None:
            exp = self.client.get_experiment_by_name("rollwise")
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment("rollwise")
            run_id = self.client.create_run(exp_id, run_name=Path(run_dir).name).info.run_id
            params = [Param(k, v[:6000]) for k, v in flatten(config).items()]
            for i in range(0, len(params), 100):
                self.client.log_batch(run_id, params=params[i : i + 100])
            ids["mlflow"] = run_id
        self.run_id = run_id

    def log(self, values, step, tokens):
        import time

        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        metrics = [Metric(mlflow_key(k), v, ts, step) for k, v in values.items()]
        metrics += [Metric("by_tokens/" + mlflow_key(k), v, ts, tokens) for k, v in values.items()]
        for i in range(0, len(metrics), 500):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 500])

    def close(self):
        self.client.set_terminated(self.run_id)


class WandB:
    def __init__(self, run_dir, config, config_toml, start_step, start_tokens, ids):
        import wandb

        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        ids.setdefault("wandb", uuid.uuid4().hex[:12])
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "rollwise"),
            name=Path(run_dir).name,
            id=ids["wandb"],
            dir=str(run_dir),
            config=config,
            mode=mode,
            resume="allow",
            reinit="create_new",
        )
        self.run.define_metric("cost/generated_tokens")
        self.run.define_metric("by_tokens/*", step_metric="cost/generated_tokens")

    def log(self, values, step, tokens):
        data = dict(values, **{f"by_tokens/{k}": v for k, v in values.items() if k != "cost/generated_tokens"})
        data["cost/generated_tokens"] = float(tokens)
        self.run.log(data, step=step)

    def close(self):
        self.run.finish()


class Trackio:
    def __init__(self, run_dir, config, config_toml, start_step, start_tokens, ids):
        import trackio

        self.trackio = trackio
        self.run = trackio.init(
            project=os.environ.get("TRACKIO_PROJECT", "rollwise"),
            name=Path(run_dir).name,
            config=config,
            resume="allow",
            embed=False,
            auto_log_cpu=False,
            auto_log_gpu=False,
        )

    def log(self, values, step, tokens):
        self.run.log(dict(values, **{"cost/generated_tokens": float(tokens)}), step=step)

    def close(self):
        self.run.finish()


_CLASSES = {"tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow, "trackio": Trackio}
