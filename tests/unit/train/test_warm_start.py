import torch

from rollwise.config import load_config
from rollwise.components import build_task
from rollwise.tokens import Codec
from rollwise.train.tiny import build_tiny
from rollwise.train.warm_start import warm_start


def test_second_warm_start_is_loaded_from_cache():
    cfg = load_config(overrides=["model.warm_start.steps=3", "model.warm_start.batch_size=4", "task.options={n_train=50, n_heldout=10}"])
    task = build_task(cfg)
    m1, tok = build_tiny("tiny-s", seed=0)
    before = [p.clone() for p in m1.parameters()]
    assert warm_start(m1, Codec(tok, use_chat=False), task, cfg.model.warm_start, 0, {"k": "test"}) == "trained"
    assert any(not torch.equal(a, b) for a, b in zip(before, m1.parameters()))
    m2, _ = build_tiny("tiny-s", seed=0)
    assert warm_start(m2, Codec(tok, use_chat=False), task, cfg.model.warm_start, 0, {"k": "test"}) == "cached"
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a, b)
