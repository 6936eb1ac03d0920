"""Fixtures of the tree-sampler tests (test_latr.py, test_etmr.py, test_ec_tree.py, test_forks.py), which
import them by name (a module, not a conftest.py: a second conftest would shadow tests/conftest.py's
helpers for every test module that imports ``from conftest`` in the same process): the tiny model
with random weights (seed 1, eval mode, built once per test module), an hf backend over it and two
arithmetic prompts."""

from __future__ import annotations

import pytest

from rollwise.backends.hf import HFBackend
from rollwise.trainer.tiny import build_tiny


@pytest.fixture(scope="module")
def tiny():
    """(model, tokenizer) of ``tiny-s``."""
    model, tok = build_tiny("tiny-s", seed=1)
    return model.eval(), tok


@pytest.fixture
def hf_backend(tiny):
    """``hf_backend(seed=0)``: a fresh hf backend over the tiny model (64 rows per forward); the seed
    is its sampler's generator, so two backends with one seed sample alike."""
    model, tok = tiny

    def make(seed: int = 0) -> HFBackend:
        return HFBackend(model, [tok.eos_token_id], tok.pad_token_id, max_batch=64, seed=seed)

    return make


@pytest.fixture
def arith_prompts(tiny) -> list[list[int]]:
    """Two prompts of different lengths, as token ids: ``12+34=`` and ``7+8=`` after BOS."""
    _, tok = tiny
    return [[tok.bos_token_id] + tok.encode("12+34="), [tok.bos_token_id] + tok.encode("7+8=")]
