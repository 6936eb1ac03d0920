"""The stale-weight alarm (train.gap_guard, rollwise.trainer.mismatch.GapGuard): its rule on hand-made
gaps, and a run whose separate sampler is pushed wrong weights on purpose stops with the message."""

import pytest

from rollwise.trainer.mismatch import GapGuard, StaleWeightsError


def test_rule_by_hand():
    g = GapGuard(ceiling=1.0, jump=5.0, floor=0.05)
    for gap in (0.010, 0.015, 0.012):  # rounding-level gaps pass and build the history
        assert g.check(gap) is None
    assert g.check(0.04) is None  # 0.04 > 5 x 0.012 = 0.06? no: below both the jump and the floor
    assert (
        g.check(0.055) is None
    )  # above the floor but 0.055 < 5 x median(0.010, 0.012, 0.015, 0.04) = 5 x 0.015 = 0.075
    msg = g.check(0.201)  # the TRL report's jump: 0.201 > 5 x 0.015 and > 0.05
    assert msg is not None and "0.2010 nats per token" in msg and "stale weights" in msg
    assert "train.gap_guard.jump = 5.0" in msg


def test_floor_keeps_tiny_gaps_quiet_and_ceiling_fires_without_history():
    g = GapGuard(ceiling=1.0, jump=5.0, floor=0.05)
    assert g.check(1e-7) is None
    assert g.check(0.03) is None  # 300000x the median, but under the floor: rounding noise never stops a run
    assert "train.gap_guard.ceiling = 1.0" in GapGuard(1.0, 5.0, 0.05).check(1.5)


class SeparateEngine:
    """An ``hf`` sampler on its own copy of the model (as vLLM or a Ray worker holds one), whose
    weight push delivers wrong weights from ``bad_from`` on (a broken sync, on purpose)."""

    def __init__(self, bad_from: int):
        from rollwise.backends.hf import HFBackend
        from rollwise.trainer.tiny import build_tiny

        model, tok = build_tiny("tiny-s", seed=0)
        self.inner = HFBackend(model, [tok.eos_token_id], tok.pad_token_id, 64, seed=0)
        self.bad_from, self.pushes = bad_from, []
        self.wrong = build_tiny("tiny-s", seed=99)[0].state_dict()

    def load_weights(self, version, weights):
        self.pushes.append(version)
        self.inner.model.load_state_dict(self.wrong if version >= self.bad_from else weights, strict=False)
        return 0.0

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _cfg(tmp_path, name, **extra):
    import rollwise
    from conftest import as_sets, tiny_overrides

    return rollwise.load_config(
        overrides=as_sets(
            tiny_overrides(
                tmp_path, name=name, steps=4, **{"model.warm_start.steps": 0, "run.checkpoint_every": 1, **extra}
            )
        )
    )


def test_wrong_weights_pushed_on_purpose_stop_the_run(tmp_path):
    import rollwise
    from rollwise.trainer import checkpoint

    engine = SeparateEngine(bad_from=2)
    with pytest.raises(StaleWeightsError, match="stale weights"):
        rollwise.train(_cfg(tmp_path, "stale"), backend=engine, log=lambda m: None)
    assert engine.pushes[:3] == [0, 1, 2]
    assert checkpoint.list_steps(tmp_path / "stale") == [1, 2]  # stopped at step 3's update, before training on them


def test_right_weights_train_through_and_the_guard_can_be_turned_off(tmp_path):
    import rollwise

    fine = rollwise.train(_cfg(tmp_path, "fine"), backend=SeparateEngine(bad_from=10**9), log=lambda m: None)
    off = rollwise.train(
        _cfg(tmp_path, "off", **{"train.gap_guard.enabled": False}),
        backend=SeparateEngine(bad_from=2),
        log=lambda m: None,
    )
    assert fine.steps == 4 and off.steps == 4
