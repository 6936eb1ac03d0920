"""With stdout not a terminal (nohup, cluster jobs, pytest's capture) a run prints a plain line
per step through its log, with the budget's progress when a budget ends the run."""

from __future__ import annotations

import rollwise
from rollwise.config import load_config

from conftest import as_sets, tiny_overrides


def test_plain_line_per_step_with_budget_progress(tmp_path):
    # 4 prompts x 4 rollouts = 16 rollouts per step; a budget of 48 rollouts ends the run after step 3
    cfg = load_config(overrides=as_sets(tiny_overrides(tmp_path, steps=10, **{"run.progress": True, "train.budget_rollouts": 48})))
    logs = []
    rollwise.train(cfg, log=logs.append)
    steps = [m for m in logs if m.startswith("step ")]
    assert [s.split()[1] for s in steps] == ["1/10", "2/10", "3/10"]
    assert "rollouts 16/48 (33%)" in steps[0] and "rollouts 48/48 (100%)" in steps[-1]
    assert all("reward" in s and "pass@1" in s for s in steps)


def test_no_lines_with_progress_off(tmp_path):
    cfg = load_config(overrides=as_sets(tiny_overrides(tmp_path, steps=2)))
    logs = []
    rollwise.train(cfg, log=logs.append)
    assert not [m for m in logs if m.startswith("step ")]
