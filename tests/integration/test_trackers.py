"""run.report_to: TensorBoard, W&B (offline), MLflow (local file store) and trackio (local) get
every metrics.jsonl / eval.jsonl scalar against step and generated tokens, plus the config; all
read back here. A tracker that fails mid-run is reported once and training goes on."""

import glob
import json
import os
import struct
import subprocess
import sys

import pytest

from conftest import as_sets, tiny_overrides

pytest.importorskip("tensorboard")
pytest.importorskip("wandb")
pytest.importorskip("mlflow")
pytest.importorskip("trackio")


def _lines(path):
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def _wandb_records(path):
    """Records of a W&B offline ``.wandb`` file: a 7-byte file header, then LevelDB-log chunks
    (crc32 4 bytes, length 2, type 1: 1 full, 2 first, 3 middle, 4 last) in 32 KiB blocks."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, buf, out = open(path, "rb").read(), 7, b"", []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:
            pos += 32768 - pos % 32768
            continue
        _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and n == 0:
            break
        buf, pos = buf + data[pos + 7 : pos + 7 + n], pos + 7 + n
        if kind in (1, 4):
            r = pb.Record()
            r.ParseFromString(buf)
            out.append(r)
            buf = b""
    return out


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trackers")
    o = tiny_overrides(
        tmp, name="tr", steps=3, **{"eval.every": 2, "run.report_to": ["tensorboard", "wandb", "mlflow", "trackio"]}
    )
    env = dict(
        os.environ, WANDB_MODE="offline", WANDB_SILENT="true", TRACKIO_DIR=str(tmp / "trackio"), HF_HUB_OFFLINE="1"
    )
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(
        [sys.executable, "-m", "rollwise.cli", "train", *sum((["--set", s] for s in as_sets(o)), [])],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "failed at" not in proc.stdout, proc.stdout  # no tracker reported a failure
    run = tmp / "tr"
    return run, _lines(run / "metrics.jsonl"), _lines(run / "eval.jsonl"), tmp


def test_tensorboard_event_files_read_back(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, metrics, evals, _ = tracked
    by_step = EventAccumulator(str(run / "tensorboard" / "step"), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    by_tokens = EventAccumulator(str(run / "tensorboard" / "tokens"), size_guidance={"scalars": 0}).Reload()
    got = [(e.step, pytest.approx(e.value)) for e in by_step.Scalars("reward/mean")]
    assert got == [(m["step"], m["reward/mean"]) for m in metrics]
    assert [e.step for e in by_tokens.Scalars("reward/mean")] == [m["cost/generated_tokens"] for m in metrics]
    assert [(e.step, pytest.approx(e.value)) for e in by_step.Scalars("eval/pass@1")] == [
        (e["step"], e["eval/pass@1"]) for e in evals
    ]
    assert [e.step for e in by_tokens.Scalars("eval/pass@1")] == [e["cost/generated_tokens"] for e in evals]
    # every number is a scalar; flags and the run's text facts (device/name, precision/reason) are not
    assert set(metrics[0]) - {"step"} <= set(by_step.Tags()["scalars"]) | {
        k for k, v in metrics[0].items() if isinstance(v, (bool, str))
    }
    assert {"device/name", "precision/compute_dtype"} <= {k for k, v in metrics[0].items() if isinstance(v, str)}
    assert "train" in by_step.Tags()["tensors"][0] or "config" in str(by_step.Tags()["tensors"])


def test_mlflow_local_store_read_back(tracked):
    from mlflow.tracking import MlflowClient

    run, metrics, evals, _ = tracked
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
    run_id = json.loads((run / "trackers.json").read_text())["mlflow"]
    hist = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "reward/mean"))
    assert hist == [(m["step"], pytest.approx(m["reward/mean"])) for m in metrics]
    acc = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "by_tokens/eval/pass_at_1"))
    assert acc == [(e["cost/generated_tokens"], pytest.approx(e["eval/pass@1"])) for e in evals]
    params = client.get_run(run_id).data.params
    assert params["train.steps"] == "3" and params["model.name"] == "tiny-s"
    assert client.get_run(run_id).info.status == "FINISHED"


def test_wandb_offline_run_read_back(tracked):
    run, metrics, evals, _ = tracked
    (path,) = glob.glob(str(run / "wandb" / "offline-run-*" / "run-*.wandb"))
    history, config = [], {}
    for r in _wandb_records(path):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
        elif kind == "run":
            config.update({i.key: json.loads(i.value_json) for i in r.run.config.update})
    train = [h for h in history if "reward/mean" in h]
    assert [(h["_step"], pytest.approx(h["reward/mean"])) for h in train] == [
        (m["step"], m["reward/mean"]) for m in metrics
    ]
    assert [h["cost/generated_tokens"] for h in train] == [m["cost/generated_tokens"] for m in metrics]
    got_eval = [h["eval/pass@1"] for h in history if "eval/pass@1" in h]
    assert got_eval == [pytest.approx(e["eval/pass@1"]) for e in evals]
    assert config["train"]["steps"] == 3


def test_trackio_local_read_back(tracked):
    run, metrics, evals, tmp = tracked
    import sqlite3

    (db,) = glob.glob(str(tmp / "trackio" / "*.db"))
    con = sqlite3.connect(db)
    tables = [r[0] for r in con.execute("select name from sqlite_master where type='table'")]
    assert "metrics" in tables
    rows = con.execute("select step, metrics from metrics where run_name = 'tr' order by step").fetchall()
    logged = [(s, json.loads(m)) for s, m in rows]
    train = [(s, m["reward/mean"]) for s, m in logged if "reward/mean" in m]
    assert train == [(m["step"], pytest.approx(m["reward/mean"])) for m in metrics]
    assert [m["eval/pass@1"] for _, m in logged if "eval/pass@1" in m] == [
        pytest.approx(e["eval/pass@1"]) for e in evals
    ]


def test_a_tracker_failing_mid_run_is_reported_once_and_training_goes_on(tmp_path, monkeypatch):
    import rollwise
    from rollwise import trackers
    from rollwise.config import load_config

    calls = []

    def flaky(self, values, step, tokens):
        calls.append(step)
        if len(calls) >= 2:
            raise RuntimeError("tracker server went away")

    monkeypatch.setattr(trackers.TensorBoard, "log", flaky)
    messages = []
    cfg = load_config(overrides=as_sets(tiny_overrides(tmp_path, steps=3, **{"run.report_to": ["tensorboard"]})))
    result = rollwise.train(cfg, log=messages.append)
    assert result.steps == 3
    failed = [m for m in messages if "tracker 'tensorboard' failed" in m]
    assert len(failed) == 1 and "tracker server went away" in failed[0] and "training continues" in failed[0]
    assert calls == [0, 0]  # eval at start (step 0), then step 0 raised; never called again


def test_missing_tracker_package_is_a_config_error(monkeypatch):
    import importlib.util

    from rollwise.config import load_config
    from rollwise.registry import UserError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(UserError, match=r"run.report_to names 'wandb'.*rollwise\[track\]"):
        load_config(overrides=['run.report_to=["wandb"]'])
    with pytest.raises(UserError, match="run.report_to"):
        load_config(overrides=['run.report_to=["comet"]'])
