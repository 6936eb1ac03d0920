"""FAPO's judge preset (configs/fapo_judge.toml, arXiv 2510.22543) trains the tiny model through the
real loop on the fapo_judge task and saves a run that loads back as a flaw detector ("genrm:<dir>")."""

import json
from pathlib import Path

import pytest

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.config import load_config

PRESET = Path(__file__).parents[2] / "configs" / "fapo_judge.toml"


def test_preset_trains_the_judge(tmp_path):
    o = tiny_overrides(tmp_path, name="judge", steps=2, **{"eval.at_start": False})
    cfg = load_config(PRESET, overrides=as_sets(o))
    assert cfg.task.name == "fapo_judge"
    res = rollwise.train(cfg, log=lambda m: None)
    lines = [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    for m in lines:  # rewards live in [-1, 2]: invalid -1, exact step 2
        assert -1.0 <= m["reward/mean"] <= 2.0
