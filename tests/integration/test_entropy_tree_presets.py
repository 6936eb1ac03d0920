"""The entropy-tree presets (issue #45) train through the real loop: configs/etmr.toml and
configs/ec_tree.toml for two steps on the tiny model, every group of the configured size, the tree
sampler's metrics in the ledger and tree tokens charged once."""

import json
from pathlib import Path

import pytest

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.config import load_config

CONFIGS = Path(__file__).parents[2] / "configs"


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.parametrize("preset, prefix", [("etmr.toml", "etmr"), ("ec_tree.toml", "ec_tree")])
def test_preset_trains_with_its_tree_sampler(tmp_path, preset, prefix):
    extra = {"eval.at_start": False, "control.rollouts_per_prompt": 5, "control.prompts_per_step": 2}
    cfg = load_config(CONFIGS / preset, overrides=as_sets(tiny_overrides(tmp_path, name=prefix, steps=2, **extra)))
    res = rollwise.train(cfg, log=lambda m: None)
    rows = lines(res.run_dir / "metrics.jsonl")
    assert len(rows) == 2
    key = next(k for k in rows[0] if k.endswith(f"{prefix}/tree_rollouts"))  # the sampler made the groups
    assert [row[key] for row in rows] == [10, 10]  # 2 prompts x 5 rollouts, each step
    assert all(row["train/grad_norm"] >= 0 for row in rows)
