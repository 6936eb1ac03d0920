"""FAPO's judge preset (configs/fapo_judge.toml, arXiv 2510.22543) trains the tiny model through the
real loop on the fapo_judge task and saves a run that loads back as a flaw detector ("genrm:<dir>")."""

import json
from pathlib import Path

import pytest

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.config import load_config
from rollwise.flaws import DETECTORS
from rollwise.registry import UserError
from rollwise.tasks.fapo_judge import parse

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


def test_trained_judge_is_a_flaw_detector_and_bad_paths_are_refused(tmp_path):
    o = tiny_overrides(tmp_path, name="judge", steps=1, **{"eval.at_start": False, "run.checkpoint_every": 1})
    res = rollwise.train(load_config(PRESET, overrides=as_sets(o)), log=lambda m: None)
    fapo = Path(__file__).parents[2] / "configs" / "fapo.toml"
    cfg = load_config(fapo, overrides=[f'reward.fapo.detector="genrm:{res.run_dir}"'])
    detect = DETECTORS.get(cfg.reward.fapo.detector)
    assert detect is DETECTORS.get(cfg.reward.fapo.detector)  # the model is loaded once
    answer = detect.answer("7+5+0=12,4+8+1=14,=132")
    step = detect(None, "7+5+0=12,4+8+1=14,=132")
    assert step == parse(answer, 3)  # the judge's own answer, parsed: a step, -1 (none) or None (invalid)
    with pytest.raises(UserError, match="reward.fapo.detector.*not a run directory"):
        load_config(fapo, overrides=[f'reward.fapo.detector="genrm:{tmp_path / "nowhere"}"'])
    for task, why in (("arithmetic", "task 'arithmetic', not a judge"), ("fapo_judge", "has no checkpoint")):
        fake = tmp_path / f"fake-{task}"
        fake.mkdir()
        (fake / "config.resolved.toml").write_text(f'[task]\nname = "{task}"\n')
        with pytest.raises(UserError, match=f"reward.fapo.detector.*{why}"):
            load_config(fapo, overrides=[f'reward.fapo.detector="genrm:{fake}"'])
