"""rollwise.trackers without a training run: which values are logged, MLflow names, and a resumed
run's TensorBoard curves without duplicate points."""

import pytest

from rollwise import trackers


def test_scalars_of_train_and_eval_lines():
    line = {"step": 3, "reward/mean": 0.5, "cost/generated_tokens": 120, "flag": True, "note": "x", "bad": float("nan")}
    assert trackers.scalars("train", line) == {"reward/mean": 0.5, "cost/generated_tokens": 120.0}
    ev = {"step": 4, "eval/pass@1": 0.25, "cost/generated_tokens": 150, "wall_s": 9.0}
    assert trackers.scalars("eval", ev) == {"eval/pass@1": 0.25}  # cost and wall time repeat the train lines


def test_mlflow_names_and_flattened_config():
    assert trackers.mlflow_key("eval/pass@1") == "eval/pass_at_1"
    assert trackers.mlflow_key("filter/zero:var") == "filter/zero_var"
    assert trackers.flatten({"run": {"seed": 0, "report_to": ["wandb"]}, "task": {"name": "x", "options": {}}}) == {
        "run.seed": "0",
        "run.report_to": '["wandb"]',
        "task.name": "x",
        "task.options": "{}",
    }


def test_resumed_run_purges_tensorboard_points_after_the_checkpoint(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def session(start, values):
        t = trackers.Trackers(["tensorboard"], tmp_path, {}, "", start, 100 * start, log=print)
        for step, v in values:
            t("train", {"step": step, "reward/mean": v, "cost/generated_tokens": 100 * (step + 1)})
        t.close()

    session(0, [(0, 0.0), (1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)])  # killed after step 4; checkpoint at step 3
    session(3, [(3, 0.35), (4, 0.45), (5, 0.55)])  # resumed: steps 3 and 4 are redone
    acc = EventAccumulator(str(tmp_path / "tensorboard" / "step")).Reload()
    got = [(e.step, round(e.value, 2)) for e in acc.Scalars("reward/mean")]
    assert got == [(0, 0.0), (1, 0.1), (2, 0.2), (3, 0.35), (4, 0.45), (5, 0.55)]
    # token axis: resumed at 300 tokens, so points at 400 and 500 tokens were purged and re-logged
    tok = EventAccumulator(str(tmp_path / "tensorboard" / "tokens")).Reload()
    assert [(e.step, round(e.value, 2)) for e in tok.Scalars("reward/mean")] == [
        (100, 0.0),
        (200, 0.1),
        (300, 0.2),
        (400, 0.35),
        (500, 0.45),
        (600, 0.55),
    ]


def test_a_tracker_that_cannot_start_is_reported_and_skipped(tmp_path, monkeypatch):
    class Broken:
        def __init__(self, *a):
            raise ConnectionError("no server")

    monkeypatch.setitem(trackers._CLASSES, "wandb", Broken)
    messages = []
    t = trackers.Trackers(["wandb"], tmp_path, {}, "", 0, 0, log=messages.append)
    t("train", {"step": 0, "reward/mean": 1.0})
    t.close()
    assert (
        t.active == []
        and len(messages) == 1
        and "tracker 'wandb' failed at start (ConnectionError: no server)" in messages[0]
    )
