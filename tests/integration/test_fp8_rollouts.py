"""FP8 rollouts (configs/fp8_rollouts.toml; Jet-RL, arXiv 2601.14243) train through the real loop with
the hf sampler, and the sampler/trainer gap is smaller with the matched trainer than without."""

import json
from pathlib import Path

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.config import load_config

PRESET = Path(__file__).parents[2] / "configs" / "fp8_rollouts.toml"


def _run(tmp_path, name, matched):
    extra = {"eval.at_start": False, "train.matched_quantisation": matched, "sampling.max_new_tokens": 8}
    cfg = load_config(PRESET, overrides=as_sets(tiny_overrides(tmp_path, name=name, steps=2, **extra)))
    res = rollwise.train(cfg, log=lambda m: None)
    return [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]


def test_fp8_preset_trains_and_the_matched_trainer_closes_the_gap(tmp_path):
    matched, unmatched = _run(tmp_path, "matched", True), _run(tmp_path, "unmatched", False)
    # every step ran the trainer's forward and backward over its loss tokens (nothing skipped)
    assert len(matched) == 2 and all("train/skipped" not in x and "mismatch/abs_mean" in x for x in matched)
    for m, u in zip(matched, unmatched):  # seen once: ~2e-7 matched (rounding) against ~4e-3 unmatched
        assert u["mismatch/abs_mean"] > 100 * m["mismatch/abs_mean"]
