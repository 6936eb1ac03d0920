"""The pass-rate predictor in real runs of the tiny model (issue #31): its cost and held-out scores
in the ledger, its calibration plot, resume that continues it exactly, and the refusals at load."""

import json

import pytest
import torch

import rollwise
from conftest import tiny_overrides
from rollwise.config import load_config
from rollwise.registry import UserError

VALUE = {"value.enabled": True, "control.name": "wise2", "advantage.name": "poise"}


def _cfg(tmp_path, name, steps, **extra):
    o = tiny_overrides(tmp_path, name=name, steps=steps, **{**VALUE, **extra})
    return load_config(
        data={},
        overrides=[f"{k}={json.dumps(v)}" for k, v in o.items() if not isinstance(v, dict)]
        + ["task.options={n_train = 200, n_heldout = 20}"],
    )


def _lines(path):
    return [
        {k: v for k, v in json.loads(x).items() if not k.startswith(("time/", "wall_s"))}
        for x in path.read_text().splitlines()
    ]


def test_predictor_cost_scores_and_plot(tmp_path):
    r = rollwise.train(_cfg(tmp_path, "v", 3, **{"eval.every": 3}), log=lambda m: None)
    metrics = _lines(r.run_dir / "metrics.jsonl")
    assert all(m["value/forward_tokens"] > 0 for m in metrics)  # candidates' prefills and trajectories, charged
    assert metrics[-1]["value/bank"] == 12  # 3 steps x 4 groups observed
    evals = _lines(r.run_dir / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 3]
    assert all(0.0 <= e["value/heldout_brier"] <= 1.0 and e["value/heldout_prompts"] == 8 for e in evals)
    assert evals[0]["value/heldout_pred_mean"] == 0.5  # nothing observed yet: the empty bank's 0.5
    assert (r.run_dir / "plots" / "value_calibration.png").stat().st_size > 0


def test_resume_continues_the_predictor_exactly(tmp_path):
    full = rollwise.train(_cfg(tmp_path, "full", 4, **{"run.checkpoint_every": 2}), log=lambda m: None)
    rollwise.train(_cfg(tmp_path, "cut", 2, **{"run.checkpoint_every": 2}), log=lambda m: None)
    resumed = rollwise.train(_cfg(tmp_path, "cut", 4, **{"run.checkpoint_every": 2}), resume=True, log=lambda m: None)
    assert _lines(resumed.run_dir / "metrics.jsonl") == _lines(full.run_dir / "metrics.jsonl")


@pytest.mark.parametrize(
    "sets, match",
    [
        (['advantage.name="poise"'], "advantage.name = 'poise' reads the pass-rate predictor: set value.enabled"),
        (
            ['control.name="cures"', 'control.options={probe_rollouts = 0, rates = "predicted"}'],
            "control.options.rates = 'predicted' reads",
        ),
        (
            ["value.enabled=true", "train.async.max_staleness=1", "train.async.allow_uncorrected=true"],
            "does not run with train.async",
        ),
        (["value.enabled=true", "distributed.workers=1"], "does not run with distributed.workers"),
    ],
)
def test_refused_at_load(sets, match):
    with pytest.raises(UserError, match=match):
        load_config(overrides=sets)


@pytest.mark.parametrize("replay, kept", [("rollout_replay", True), ("on_policy", False)])
def test_poise_keeps_row_baselines_only_when_the_replay_source_trains_rows_again(tmp_path, replay, kept):
    """POISE's baselines frozen for replayed rows (objectives/inputs.value_baseline, issue #40): with
    rollout replay every fresh row's baseline is in the checkpoint (2 steps x 4 groups x 4 rows); with
    on-policy training, where no row comes back, none is kept."""
    cfg = _cfg(tmp_path, replay, 2, **{"replay.name": replay, "run.checkpoint_every": 2, "control.name": "uniform"})
    r = rollwise.train(cfg, log=lambda m: None)
    state = torch.load(r.run_dir / "checkpoints" / "step-2" / "state.pt", weights_only=False)
    assert len(state["value"]["frozen"]) == (32 if kept else 0)
