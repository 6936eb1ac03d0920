"""The presets of issue #44 (configs/hgpo.toml, configs/salt.toml, configs/turn_budget.toml on guess the
number; on the calculator: configs/cleaner.toml, configs/ui_s1.toml, configs/aepo.toml, configs/portool.toml)
train a few steps of episodes on the tiny model, at small sizes."""

import json
from pathlib import Path

import pytest

import rollwise
from conftest import as_sets
from rollwise.config import load_config

CONFIGS = Path(__file__).parents[2] / "configs"


def small(tmp_path, name, **extra):
    o = {
        "run.dir": str(tmp_path),
        "run.name": name,
        "run.progress": False,
        "run.checkpoint_every": 0,
        "model.warm_start.steps": 10,
        "model.warm_start.batch_size": 8,
        "task.options": {"n_train": 32, "n_heldout": 4},
        "task.max_turns": 4,
        "train.steps": 2,
        "control.prompts_per_step": 2,
        "control.rollouts_per_prompt": 4,
        "eval.every": 0,
        **extra,
    }
    return as_sets(o)


def lines(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("preset", ["hgpo", "salt"])
def test_step_credit_presets_train(tmp_path, preset):
    cfg = load_config(CONFIGS / f"{preset}.toml", small(tmp_path, preset))
    assert cfg.advantage.name == preset and cfg.task.name == "guess_number"
    res = rollwise.train(cfg, log=lambda m: None)
    got = lines(res.run_dir)
    assert len(got) == 2 and all(m["episodes/count"] == 8 for m in got)
    assert all(0.0 <= m["reward/mean"] <= 1.0 for m in got)


def test_turn_budget_preset_trains_and_caps_after_its_warm_up(tmp_path):
    """Warm-up of 8 episodes (step 1), then step 2 runs under a cap read from step 1's turns."""
    extra = {"task.turn_budget": {"enabled": True, "warmup_episodes": 8, "max_extensions": 1}, "train.steps": 3}
    cfg = load_config(CONFIGS / "turn_budget.toml", small(tmp_path, "turn_budget", **extra))
    res = rollwise.train(cfg, log=lambda m: None)
    got = lines(res.run_dir)
    assert len(got) == 3 and got[0]["turn_budget/cap"] == 4  # warm-up: task.max_turns
    assert all(1 <= m["turn_budget/cap"] <= 4 for m in got)
    for m in got:
        assert m["turn_budget/capped"] == m.get("episodes/end_turn_cap", 0)
        assert m["turn_budget/saved_tokens_est"] >= 0.0 and m["turn_budget/saved_s_est"] >= 0.0
        assert m["episodes/turns"] <= 8 * m["turn_budget/cap"] + m["turn_budget/extensions"]


@pytest.mark.parametrize("preset", ["cleaner", "ui_s1"])
def test_calculator_presets_train(tmp_path, preset):
    extra = {"sampling.max_new_tokens": 24, "task.max_turns": 3}
    cfg = load_config(CONFIGS / f"{preset}.toml", small(tmp_path, preset, **extra))
    assert cfg.task.name == "calculator" and (cfg.task.cleaner.enabled or cfg.task.semi_online.enabled)
    res = rollwise.train(cfg, log=lambda m: None)
    got = lines(res.run_dir)
    assert len(got) == 2 and all(m["episodes/count"] == 8 for m in got)
    assert all(0.0 <= m["reward/mean"] <= 1.0 and "episodes/end_error" not in m for m in got)
    if preset == "ui_s1":  # the replay runs no tool: every call shown is the expert's output, replayed
        assert all(m.get("episodes/tool_ok", 0) == 0 and m["episodes/turns"] >= 8 for m in got)


@pytest.mark.parametrize("preset", ["aepo", "portool"])
def test_branching_presets_train_and_grow_trees(tmp_path, preset):
    """Calculator episodes grown as trees (sampling.branching): every group still has its 4 episodes,
    counted as fresh starts plus branches."""
    extra = {"model.warm_start.steps": 30, "sampling.max_new_tokens": 16}
    cfg = load_config(CONFIGS / f"{preset}.toml", small(tmp_path, preset, **extra))
    assert cfg.sampling.branching.mode == preset and cfg.task.name == "calculator"
    res = rollwise.train(cfg, log=lambda m: None)
    got = lines(res.run_dir)
    assert len(got) == 2 and all(m["episodes/count"] == 8 for m in got)
    assert all(m["branching/fresh"] + m["branching/branches"] == 8 for m in got)
    assert all(0.0 <= m["reward/mean"] <= 1.0 for m in got)


def test_dart_preset_trains_rollout_wise_with_its_pool_and_high_entropy_turns(tmp_path):
    """configs/dart.toml (issue #44 item 5): 8 episodes a step through 4 environment slots, rollout-wise; half
    the turns (rounded up) trained; the success pool and the capped token ratio (tis_cap = 1) on."""
    extra = {"sampling.max_new_tokens": 24, "task.max_turns": 3, "task.env_slots": 4, "task.tool_workers": 4}
    cfg = load_config(CONFIGS / "dart.toml", small(tmp_path, "dart", **extra))
    assert cfg.task.episode_schedule == "rollout_wise" and cfg.replay.name == "success_pool"
    assert cfg.objective.options == {"tis_level": "token", "tis_cap": 1.0}
    res = rollwise.train(cfg, log=lambda m: None)
    got = lines(res.run_dir)
    assert len(got) == 2 and all(m["episodes/count"] == 8 for m in got)
    for m in got:
        assert 0.0 < m["episodes/env_utilisation"] <= 1.0 and 0.0 < m["episodes/sampler_utilisation"] <= 1.0
        assert m["episodes/slot_s"] == pytest.approx(4 * m["episodes/wall_s"])
        scored = m["entropy_turns/kept"] + m["entropy_turns/dropped"]
        assert scored == m["episodes/turns"] and m["entropy_turns/kept"] == -(-scored // 2)
        assert "replay/injected" in m and 0.0 <= m["reward/mean"] <= 1.0


def test_dart_preset_runs_on_the_asynchronous_pool(tmp_path):
    """DART's decoupling (issue #44 item 5): the slots and their rollout-wise schedule under train.async, whose
    pool plans the next step's episodes while the trainer updates (the slot pool is its engine)."""
    extra = {"sampling.max_new_tokens": 24, "task.max_turns": 3, "task.env_slots": 4, "task.tool_workers": 4}
    extra.update({"train.async.max_staleness": 1, "train.async.on_new_weights": "finish"})
    cfg = load_config(CONFIGS / "dart.toml", small(tmp_path, "dart_async", **extra))
    assert cfg.train.async_.on
    res = rollwise.train(cfg, log=lambda m: None)
    got = lines(res.run_dir)
    assert len(got) == 2 and all(m["episodes/count"] == 8 and m["episodes/rows_per_call"] > 0 for m in got)
    assert all(m["entropy_turns/kept"] + m["entropy_turns/dropped"] == m["episodes/turns"] for m in got)
