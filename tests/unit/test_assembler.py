"""The assembler (rollwise.components.open_run / assemble): the rollout wrappers wrap the base pool
in the table's order, the backend comes through the registry, and the strategies are bound to the
run's services (issue #27)."""

import pytest

from conftest import as_sets, tiny_overrides
from rollwise import components
from rollwise.config import load_config
from rollwise.types import RunState


def _assemble(tmp_path, **extra):
    cfg = load_config(overrides=as_sets(tiny_overrides(tmp_path, **{"model.warm_start.steps": 0, **extra})))
    run_dir, task, parts = components.open_run(cfg, resume=False)
    state = RunState()
    wiring = components.Wiring(lambda: state, run_dir, lambda m: None)
    return components.assemble(cfg, task, parts, wiring), task


def test_rollout_wrappers_wrap_the_base_pool_in_table_order(tmp_path):
    from rollwise.backends.hf import HFBackend
    from rollwise.distributed.local import LocalPool
    from rollwise.generate.arrol import ArrolPool
    from rollwise.reward.ttrl import TtrlPool

    a, task = _assemble(tmp_path, **{"sampling.arrol.enabled": True, "reward.ttrl.enabled": True})
    assert type(a.pool) is TtrlPool and a.pool.pool is a.arrol and type(a.arrol) is ArrolPool
    assert type(a.arrol.pool) is LocalPool and a.arrol.pool.backend is a.backend and type(a.backend) is HFBackend
    assert a.async_pool is None and a.receivers == []  # the hf sampler shares the trainer's module
    assert a.services.task is task and a.services.codec is a.codec and a.services.trainer is a.trainer
    assert a.trainer.gap_guard is None


def test_a_replay_source_that_schedules_generation_wraps_the_pool(tmp_path):
    from rollwise.generate.april import AprilPool

    a, _ = _assemble(tmp_path, **{"replay.name": "april"})
    assert type(a.pool) is AprilPool and a.parts.replay.schedules_generation


def test_a_refused_strategy_leaves_no_new_run_directory(tmp_path):
    from rollwise.registry import UserError

    cfg = load_config(overrides=as_sets(tiny_overrides(tmp_path, name="refused")))
    cfg = cfg.model_copy(update={"task": cfg.task.model_copy(update={"options": {"n_train": 0}})})
    with pytest.raises(UserError):
        components.open_run(cfg, resume=False)
    assert not cfg.run_dir().exists()
