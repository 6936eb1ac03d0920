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


def test_the_pool_stack_is_a_record_a_reader_can_print(tmp_path):
    """Which pools a step runs through is one typed record (issue #41 item 2), not attributes spread
    over the run: the wrappers in the order they wrap, the base pool and the engine."""
    from rollwise.distributed.local import SeededPool

    a, _ = _assemble(
        tmp_path, **{"sampling.arrol.enabled": True, "reward.ttrl.enabled": True, "distributed.request_seeds": True}
    )
    stack = a.stack
    assert [name for name, _ in stack.wrappers] == ["arrol", "ttrl"]
    assert stack.top is a.pool and stack.wrappers[0][1] is a.arrol and stack.base is a.base_pool
    assert type(stack.base) is SeededPool and stack.backend is a.backend
    layers = "ttrl TtrlPool -> arrol ArrolPool -> base SeededPool -> backend HFBackend"
    assert str(stack) == f"pool stack (the loop calls the first): {layers}"


def test_a_ray_worker_builds_its_engine_with_the_assemblers_builder(tmp_path):
    """A rollout worker (run here, without Ray) gets its backend and pool from the assembler's builder:
    an environment task's episodes run in the worker's EpisodePool, as in the trainer's process, with
    an empty model of the policy's architecture on the worker's device."""
    import torch

    from rollwise.backends.hf import HFBackend
    from rollwise.distributed.ray_pool import RolloutWorker
    from rollwise.distributed.weights import plain_config
    from rollwise.generate.episodes import EpisodePool

    guess = {"task.name": "guess_number", "task.options": {"n_train": 8, "n_heldout": 4}, "task.max_turns": 3}
    a, task = _assemble(tmp_path, **guess)
    assert type(a.base_pool) is EpisodePool
    spec = {
        "cfg": load_config(overrides=as_sets(tiny_overrides(tmp_path, **guess))).model_dump(mode="json"),
        "config": plain_config(a.model),
        "tokenizer": a.codec.tokenizer,
        "use_chat": a.codec.use_chat,
        "threads": torch.get_num_threads(),
        "gpus": 0,
        "sampling": a.sampling,
        "build": components.worker_engine,
    }
    worker = RolloutWorker(spec)
    assert type(worker.pool) is EpisodePool and type(worker.backend) is HFBackend
    assert worker.backend.model is worker.model and worker.model is not a.model
    assert next(worker.model.parameters()).device.type == "cpu"
    assert worker.pool.limits == a.base_pool.limits and worker.pool.limits.max_turns == 3


UNDECLARED = """
from rollwise.envs.guess import make as guess


def make(arg=None, options=None):
    return guess(arg, options)  # builds an environment task, but this factory declares no episodes


make.Options = guess.Options
"""


def test_a_task_that_makes_environments_without_declaring_episodes_is_refused(tmp_path, monkeypatch):
    """Issue #41 item 3: whether a task runs episodes is read from its factory's compatibility record
    (``Compat(episodes=True)``), never probed from the built task; the assembler refuses a factory whose
    task makes environments without declaring them, naming the key, before any model loads."""
    from rollwise.registry import UserError

    (tmp_path / "userpkg").mkdir()
    (tmp_path / "userpkg" / "__init__.py").write_text("")
    (tmp_path / "userpkg" / "undeclared.py").write_text(UNDECLARED)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(overrides=as_sets(tiny_overrides(tmp_path, **{"task.name": "userpkg.undeclared:make"})))
    with pytest.raises(UserError, match=r"task.name = 'userpkg.undeclared:make' makes environments.*episodes=True"):
        components.open_run(cfg, resume=False)
    assert not cfg.run_dir().exists()
