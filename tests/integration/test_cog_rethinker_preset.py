"""Cog-Rethinker's preset (configs/cog_rethinker.toml) trains through the real loop: a scripted backend
answers every direct and decomposition prompt wrong and every refinement prompt right, so each prompt
goes through both extra stages and its refined answer trains the plain prompt as an SFT row."""

import json
import re
from pathlib import Path

import torch

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.backends.scripted import ScriptedBackend
from rollwise.config import load_config
from rollwise.trainer.tiny import char_tokenizer

PRESET = Path(__file__).parents[2] / "configs" / "cog_rethinker.toml"


def _backend():
    tok = char_tokenizer()

    def respond(seq, i):
        text = tok.decode(seq, skip_special_tokens=True)
        a, op, b = re.search(r"(-?\d+)([+-])(\d+)=$", text).groups()  # the plain problem ends every prompt
        ans = int(a) + int(b) if op == "+" else int(a) - int(b)
        return tok.encode(str(ans if "Wrong:" in text else ans + 1))  # only refinements are right

    return ScriptedBackend(respond, tok.eos_token_id)


def test_preset_runs_both_stages_and_trains_the_refined_answers(tmp_path):
    o = tiny_overrides(tmp_path, name="cog", steps=2, **{"eval.at_start": False})
    cfg = load_config(PRESET, overrides=as_sets(o))
    res = rollwise.train(cfg, backend=_backend(), log=lambda m: None)
    lines = [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    for m in lines:  # 4 prompts x 4 rollouts, all wrong: every prompt gets 4 decompositions, then 4 refinements
        assert m["control/cog_zero_prompts"] == 4.0
        assert m["control/cog_decompose_rollouts"] == 16.0 and m["control/cog_decompose_solved"] == 0.0
        assert m["control/cog_refine_rollouts"] == 16.0 and m["control/cog_refine_solved"] == 4.0
        assert m["control/cog_sft_rows"] == 4.0  # one distinct right answer per prompt
        assert m["cost/rollouts"] - (lines[0]["cost/rollouts"] if m is lines[1] else 0) == 48
        # the only rows with an advantage are the SFT rows (lambda 0.5): the surrogate -A r at r = 1
        assert torch.isfinite(torch.tensor(m["train/loss"])) and m["train/loss"] < 0
