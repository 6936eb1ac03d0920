"""Sol-RL's preset (configs/sol_rl.toml; arXiv 2604.06916) trains through the real loop with the FP8
sampler: every candidate's tokens are charged, the trainer sees groups of the configured size, and
the sampler/trainer gap the trainer measures is the full-precision re-score's (rounding only), not
the FP8 sampler's."""

import json
from pathlib import Path

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.config import load_config

PRESET = Path(__file__).parents[2] / "configs" / "sol_rl.toml"


def test_sol_rl_preset_trains_on_rescored_rows_and_charges_the_pool(tmp_path):
    extra = {"eval.at_start": False, "sampling.max_new_tokens": 8}
    cfg = load_config(PRESET, overrides=as_sets(tiny_overrides(tmp_path, steps=2, **extra)))
    res = rollwise.train(cfg, log=lambda m: None)
    lines = [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all("train/skipped" not in x for x in lines)
    fp8_tokens = 0
    for x in lines:
        # 4 prompts x 4 rollouts kept from 4 x 16 candidates, all of them verified
        assert (x["sol_rl/candidates"], x["sol_rl/kept"]) == (64, 16)
        fp8_tokens += x["sol_rl/fp8_tokens"]
        assert x["cost/generated_tokens"] == fp8_tokens  # cumulative: every candidate's tokens charged
        # the kept rows' log-probs are the trainer's own forward: the gap left is rounding (~1e-7),
        # far below the FP8 sampler's (~3e-3 when seen)
        assert x["mismatch/abs_mean"] < 1e-5 and x["sol_rl/fp8_gap_abs_mean"] > 100 * x["mismatch/abs_mean"]
    assert lines[-1]["cost/rollouts"] == 128 and lines[-1]["cost/verifier_calls"] == 128
