import torch

from rollwise.components import build_task
from rollwise.config import load_config
from rollwise.tokens import Codec
from rollwise.trainer.tiny import build_tiny
from rollwise.trainer.warm_start import warm_start


def test_second_warm_start_is_loaded_from_cache():
    cfg = load_config(
        overrides=[
            "model.warm_start.steps=3",
            "model.warm_start.batch_size=4",
            "task.options={n_train=50, n_heldout=10}",
        ]
    )
    task = build_task(cfg)
    m1, tok = build_tiny("tiny-s", seed=0)
    before = [p.clone() for p in m1.parameters()]
    assert (
        warm_start(m1, Codec(tok, use_chat=False), task, cfg.model.warm_start, 0, {"k": "test"}, episodes=False)
        == "trained"
    )
    assert any(not torch.equal(a, b) for a, b in zip(before, m1.parameters()))
    m2, _ = build_tiny("tiny-s", seed=0)
    assert (
        warm_start(m2, Codec(tok, use_chat=False), task, cfg.model.warm_start, 0, {"k": "test"}, episodes=False)
        == "cached"
    )
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a, b)


def _interrupting(monkeypatch, at_step: int, inside_update: bool = False):
    """Ctrl-C at ``at_step``: in the progress report after that step's update, or inside the update."""
    import rollwise.trainer.warm_start as ws

    if inside_update:
        real_step = torch.optim.AdamW.step
        calls = {"n": 0}

        def step(self, *a, **k):
            calls["n"] += 1
            if calls["n"] == at_step:
                raise KeyboardInterrupt
            return real_step(self, *a, **k)

        monkeypatch.setattr(torch.optim.AdamW, "step", step)
        return
    real = ws.Progress.__call__

    def report(self, step, loss):
        real(self, step, loss)
        if step == at_step:
            raise KeyboardInterrupt

    monkeypatch.setattr(ws.Progress, "__call__", report)


def test_interrupted_warm_start_continues_to_the_uninterrupted_weights(monkeypatch):
    import pytest

    cfg = load_config(
        overrides=[
            "model.warm_start.steps=12",
            "model.warm_start.batch_size=4",
            "task.options={n_train=50, n_heldout=10}",
        ]
    )
    task, ws_cfg = build_task(cfg), cfg.model.warm_start
    full, tok = build_tiny("tiny-s", seed=0)
    codec = Codec(tok, use_chat=False)
    warm_start(full, codec, task, ws_cfg, 0, {"k": "whole"}, log=lambda m: None, episodes=False)

    with monkeypatch.context() as m:
        _interrupting(m, 5)
        logs = []
        first, _ = build_tiny("tiny-s", seed=0)
        with pytest.raises(KeyboardInterrupt):
            warm_start(first, codec, task, ws_cfg, 0, {"k": "cut"}, log=logs.append, episodes=False)
    assert any("interrupted after 5 of 12 steps; saved" in x and "continues it from step 5" in x for x in logs)
    with monkeypatch.context() as m:  # a second interrupt, inside an update: the saved step-5 state stays
        _interrupting(m, 3, inside_update=True)
        logs = []
        second, _ = build_tiny("tiny-s", seed=0)
        with pytest.raises(KeyboardInterrupt):
            warm_start(second, codec, task, ws_cfg, 0, {"k": "cut"}, log=logs.append, episodes=False)
    assert any("continuing from step 5" in x for x in logs)
    assert any(
        "interrupted after 7 of 12 steps: this session's steps are not kept" in x and "continues from step 5" in x
        for x in logs
    )
    logs = []
    resumed, _ = build_tiny("tiny-s", seed=0)
    assert warm_start(resumed, codec, task, ws_cfg, 0, {"k": "cut"}, log=logs.append, episodes=False) == "trained"
    assert any("continuing from step 5 of 12" in x for x in logs)
    for a, b in zip(full.parameters(), resumed.parameters()):
        assert torch.equal(a, b)  # bit for bit: the same examples, optimizer state and RNG from step 5 on
    again, _ = build_tiny("tiny-s", seed=0)  # finished: cached, and the saved partial state is gone
    assert warm_start(again, codec, task, ws_cfg, 0, {"k": "cut"}, log=lambda m: None, episodes=False) == "cached"
    from rollwise.trainer.warm_start import cache_root

    assert not list((cache_root() / "warm_start").glob("*.partial"))
