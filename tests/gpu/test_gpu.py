"""GPU checks: skipped without a CUDA device."""

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


def test_hf_backend_generates_on_gpu():
    from rollwise.backends.hf import HFBackend
    from rollwise.trainer.tiny import build_tiny
    from rollwise.types import Sampling

    model, tok = build_tiny("tiny-s")
    model = model.cuda()
    b = HFBackend(model, [tok.eos_token_id], tok.pad_token_id)
    out = b.generate([[1, 20, 21]], Sampling(1.0, 1.0, 4))
    assert len(out[0].token_ids) >= 1
