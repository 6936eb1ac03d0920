"""With stdout not a terminal (nohup, cluster jobs, pytest's capture) a run prints a plain line
per step through its log, with the budget's progress when a budget ends the run."""

from __future__ import annotations

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.config import load_config


def test_plain_line_per_step_with_budget_progress(tmp_path):
    # 4 prompts x 4 rollouts = 16 rollouts per step; a budget of 48 rollouts ends the run after step 3
    cfg = load_config(
        overrides=as_sets(tiny_overrides(tmp_path, steps=10, **{"run.progress": True, "train.budget_rollouts": 48}))
    )
    logs = []
    rollwise.train(cfg, log=logs.append)
    steps = [m for m in logs if m.startswith("step ")]
    assert [s.split()[1:3] for s in steps] == [["0", "(1/10"], ["1", "(2/10"], ["2", "(3/10"]]
    # one step numbering (README "Step numbers"): the console's step k is metrics.jsonl's line k; eval.jsonl's
    # step k and checkpoint step-k hold the policy at the start of step k (after k steps)
    import json

    run = tmp_path / "t"
    ledger = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert ledger == [int(s.split()[1]) for s in steps] == [0, 1, 2]
    assert [json.loads(x)["step"] for x in (run / "eval.jsonl").read_text().splitlines()] == [0, 3]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-3"]
    from rollwise.eval.plots import timeline_spans

    assert sorted({s["step"] for s in timeline_spans(run)[0]}) == ledger  # the timeline's bars: the same numbers
    assert "rollouts 16/48 (33%)" in steps[0] and "rollouts 48/48 (100%)" in steps[-1]
    assert all("reward" in s and "pass@1" in s for s in steps)


def test_no_lines_with_progress_off(tmp_path):
    cfg = load_config(overrides=as_sets(tiny_overrides(tmp_path, steps=2)))
    logs = []
    rollwise.train(cfg, log=logs.append)
    assert not [m for m in logs if m.startswith("step ")]
