"""Resuming a run with a KL reference restores the reference (not the freshly built model)."""

import json

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.config import load_config


def _stable(path):
    return [
        {k: v for k, v in json.loads(x).items() if not k.startswith(("wall_s", "time/"))}
        for x in path.read_text().splitlines()
    ]


def test_stop_and_resume_with_kl_matches_uninterrupted(tmp_path):
    # 100 warm-start steps: with 20 every sampled answer can be wrong, no update happens and the
    # KL to the reference stays 0, so the test would not test the reference
    extra = {
        "objective.options": {"kl_coef": 0.5},
        "run.checkpoint_every": 1,
        "run.threads": 1,
        "model.warm_start.steps": 100,
    }
    full = load_config(overrides=as_sets(tiny_overrides(tmp_path, "full", steps=4, **extra)))
    rollwise.train(full, log=lambda m: None)
    part = load_config(overrides=as_sets(tiny_overrides(tmp_path, "part", steps=2, **extra)))
    rollwise.train(part, log=lambda m: None)
    more = load_config(overrides=as_sets(tiny_overrides(tmp_path, "part", steps=4, **extra)))
    rollwise.train(more, resume=True, log=lambda m: None)
    a, b = _stable(tmp_path / "full" / "metrics.jsonl"), _stable(tmp_path / "part" / "metrics.jsonl")
    assert a == b and any(m.get("train/kl", 0) > 0 for m in a)
