"""Building a run's parts from a validated ``Config``: names -> registry entries -> objects.

``rollwise.compat.check(cfg)`` resolves every strategy name, validates its options and refuses
parts that cannot be combined, without loading a model (called by ``load_config``).

The assembler builds a whole run in stage order: ``start_data_parallel``, ``open_run`` (run
directory, task, strategies), then ``assemble`` (policy, backend through ``rollwise.backends.build``,
base pool, the rollout wrappers of ``ROLLOUT_WRAPPERS``, trainer, weight receivers, the
``Services`` bound to the strategies). Everything that can reject user input comes before the
model is loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollwise import tasks
from rollwise.compat import (  # noqa: F401 (here since #27)
    _registries,
    build_filters,
    declares_episodes,
    engine_kind,
    objective_options,
    resolve,
)
from rollwise.registry import UserError
from rollwise.types import Backend, Pool, Sampling, Services, Task, WeightReceiver

if TYPE_CHECKING:  # the Assembly's field types; the modules load on use, when the assembler builds them
    import torch

    from rollwise.batches import Batches
    from rollwise.distributed.async_pool import AsyncPool
    from rollwise.distributed.data_parallel import DataParallel
    from rollwise.generate.arrol import ArrolPool
    from rollwise.hardware.precision import Precision
    from rollwise.tokens import Codec
    from rollwise.trainer.streaming import StreamingTrainer
    from rollwise.trainer.trainer import Trainer
    from rollwise.value.model import ValueModel

build_task = tasks.build  # the task stage (rollwise.tasks.build; Ray workers call it too)


@dataclass
class Strategies:
    controller: Any
    filters: list[tuple[str, Callable]]
    replay: Any
    advantage: Callable
    advantage_options: Any
    objective: Callable
    objective_options: Any
    keep_at_most: int | None = None  # dynamic sampling's target_groups (control/rounds.py)
    extra: dict = field(default_factory=dict)


def build_strategies(cfg, task) -> Strategies:
    ctrl_cls, ctrl_opts, _ = resolve(cfg, "control")
    rep_cls, rep_opts, _ = resolve(cfg, "replay")
    adv, adv_opts, _ = resolve(cfg, "advantage")
    obj, _, _ = resolve(cfg, "objective")
    from rollwise.control.rounds import DynamicSampling, target_groups

    seed = cfg.run.seed
    controller = ctrl_cls(task.train_prompts(), cfg.control, ctrl_opts, seed)
    filters = build_filters(cfg)
    if cfg.control.dynamic_sampling.enabled:  # DAPO refill rounds around any stream-based controller
        controller = DynamicSampling(controller, filters, cfg.control)
    return Strategies(
        controller=controller,
        filters=filters,
        replay=rep_cls(cfg.replay, rep_opts, seed),
        advantage=adv,
        advantage_options=adv_opts if adv_opts is not None else adv.Options(),
        objective=obj,
        objective_options=objective_options(cfg),
        keep_at_most=target_groups(cfg.control),
    )


def prepare_run_dir(cfg, resume: bool) -> Path:
    """Create (or reuse when resuming) the run directory; fail early if it is not writable or
    another process holds its lock (``checkpoint.lock_run_dir``, taken before anything in it
    is touched)."""
    from rollwise.trainer.checkpoint import LOCK, lock_run_dir

    run_dir = cfg.run_dir()
    if run_dir.exists():
        lock_run_dir(run_dir)
    if run_dir.exists() and not resume:
        if cfg.run.overwrite:
            import shutil

            for child in run_dir.iterdir():  # the held lock file stays
                if child.name != LOCK:
                    shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        elif any(p.name != LOCK for p in run_dir.iterdir()):
            raise UserError(
                f"run directory {run_dir} already exists; use --resume {run_dir}, "
                "another run.name, or run.overwrite=true"
            )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise UserError(f"run directory {run_dir} is not writable: {e.strerror or e}") from None
    lock_run_dir(run_dir)  # a new directory
    return run_dir


def build_policy(cfg, task, log=print):
    """Load (or build and warm-start) the policy; returns (model, codec)."""
    import torch

    from rollwise.distributed.data_parallel import env_world_size
    from rollwise.hardware.device import check_model_fits, resolve_device
    from rollwise.tokens import Codec
    from rollwise.trainer import tiny
    from rollwise.trainer.warm_start import fit_warnings, warm_start

    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    device = resolve_device(cfg.model.device)
    name, ws = cfg.model.name, cfg.model.warm_start
    builtin = name in tiny.NAMES
    episodes = declares_episodes(cfg)
    if builtin:
        model, tok = tiny.build_tiny(name, seed=ws.seed)
        codec = Codec(tok, use_chat=False)
        warnings = fit_warnings(
            task,
            codec,
            cfg.sampling.max_new_tokens,
            model.config.max_position_embeddings,
            builtin=True,
            episodes=episodes,
        )
    else:
        from rollwise.trainer.hf_models import load_pretrained

        model, tok = load_pretrained(name, dtype=cfg.model.dtype)
        codec = Codec(tok, use_chat=True)
        warnings = fit_warnings(task, codec, cfg.sampling.max_new_tokens, episodes=episodes)
    for w in warnings:
        log(f"warning: {w}")  # before the warm start: a run that cannot score should not spend it first
    from rollwise.compat import check_engine_length

    check_engine_length(cfg, task, codec, getattr(model.config, "max_position_embeddings", None))  # vLLM: prompts fit
    engine = cfg.model.vllm.gpu_memory_utilization if engine_kind(cfg) == "vllm" else 0.0
    check_model_fits(
        model,
        device,
        dtype_bytes=2 if cfg.model.dtype == "bfloat16" else 4,
        lora=cfg.model.lora.enabled,
        reference=cfg.reward.kl.coef > 0,
        engine_share=engine,
        shards=env_world_size() if cfg.train.fsdp else 1,
    )  # before the weights move there
    model = model.to(device)  # the warm start, the reference copy, the sampler and the trainer follow it
    if builtin or (ws.pretrained and ws.steps > 0):  # a pretrained model only on request (model.warm_start.pretrained)
        reward_only = getattr(
            task, "REWARD_ONLY_OPTIONS", ()
        )  # options that leave the SFT examples unchanged share a cache
        key = {
            "model": tiny.canonical(name) if builtin else name,
            "task": cfg.task.name,
            "task_options": {k: v for k, v in cfg.task.options.items() if k not in reward_only},
        }
        if digest := getattr(task, "data_digest", None):  # a user's data file: its rows, not only its name
            key["data"] = digest
        if device.type != "cpu":  # a warm start trained on a GPU is another model (CPU cache keys unchanged)
            key["device"] = device.type
        cut = None
        if episodes:  # episodes are laid out with the observation cut (single-turn keys unchanged)
            cut = key["max_observation_tokens"] = cfg.task.max_observation_tokens
        how = warm_start(model, codec, task, ws, ws.seed, key, log=log, max_observation_tokens=cut, episodes=episodes)
        if not builtin:
            model.eval()  # as load_pretrained returns it
        log(f"warm start: {how}")
    if cfg.model.dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    if cfg.model.lora.enabled:
        from rollwise.trainer.hf_models import apply_lora

        lc = cfg.model.lora
        model = apply_lora(model, r=lc.r, alpha=lc.alpha, dropout=lc.dropout, target_modules=list(lc.target_modules))
    return model, codec


def warm_cache(cfg, log=print) -> None:
    """Fill the warm-start cache once (built-in tiny models; ``rollwise swarm`` before its peers start), so
    that N processes starting together load it instead of each training it (and racing to write it)."""
    from rollwise.trainer import tiny

    if cfg.model.name in tiny.NAMES and cfg.model.warm_start.steps > 0 and cfg.model.warm_start.cache:
        build_policy(cfg, build_task(cfg), log=log)


# ---------------------------------------------------------------- generation (docs/architecture.md §8)


def check_runtime(cfg, log=print) -> None:
    """Checks that need the machine, not only the config, made before the model is loaded: the Ray
    cluster (``distributed.address`` reachable, enough CPUs for ``distributed.workers``) and the
    device ``model.device`` names (a CUDA request on a machine without CUDA is refused here)."""
    from rollwise.hardware.device import describe, resolve_device, summary

    device = resolve_device(cfg.model.device)
    log(summary(describe(device)))
    if engine_kind(cfg) == "vllm":
        from rollwise.backends.vllm import check_device

        check_device(cfg.model.vllm, device)
    if cfg.distributed.workers > 0:
        from rollwise.distributed.ray_pool import connect

        connect(cfg.distributed, log=log)


def release_runtime(cfg) -> None:
    """What ``check_runtime`` started, stopped: the Ray of ``distributed.workers > 0`` (``ray_pool.shutdown``:
    a Ray this process started; a joined cluster keeps running). Called once the run's pools are closed
    (``Run.close``), on success, error, Ctrl-C and SIGTERM alike (issue #47)."""
    if cfg.distributed.workers > 0:
        from rollwise.distributed import ray_pool

        ray_pool.shutdown()


def build_backend(cfg, model, codec, seed: int, compute_dtype=None):
    """The rollout engine in this process (``model.backend``, through ``rollwise.backends.build``), or
    None when rollout workers (``distributed.workers > 0``) each build their own. ``compute_dtype``: the
    dtype the run resolved ``model.compute_dtype`` to (``Run.precision``); None resolves it here.
    ``seed``: ``run.seed`` (the backend reads it from ``cfg``)."""
    if cfg.distributed.workers > 0:
        return None
    from rollwise.backends import build

    return build(cfg, codec, model=model, compute_dtype=compute_dtype)


def build_pool(cfg, backend, codec, task, sampling, tree, model, log=print, dp=None):
    """The worker pool the loop calls: the local pool (in this process), request-seeded when
    ``distributed.request_seeds``, shared across data-parallel ranks (``dp``, a
    ``data_parallel.DataParallel``; request-seeded too), or Ray rollout workers (``distributed.workers``),
    each of which builds its engine with ``worker_engine``."""
    if cfg.distributed.workers > 0:
        from rollwise.distributed.ray_pool import RayPool

        return RayPool(cfg, model, codec, sampling, worker_engine, log=log)
    pool = engine_pool(cfg, backend, codec, task, sampling, tree)
    if dp is not None:
        from rollwise.distributed.data_parallel import DataParallelPool

        return DataParallelPool(pool, dp, cfg.run.seed)
    if cfg.distributed.request_seeds:
        from rollwise.distributed.local import SeededPool

        pool = SeededPool(pool, cfg.run.seed)
    return pool


def engine_pool(cfg, backend, codec, task, sampling, tree=None):
    """The pool around one engine, where that engine runs (this process, or a Ray worker through
    ``worker_engine``): an ``EpisodePool`` for an environment task (docs/architecture.md §11), else a
    ``LocalPool`` (``tree``: LATR's sampler, this process only)."""
    if declares_episodes(cfg):  # multi-turn episodes (the task's compatibility record)
        if cfg.sampling.branching.mode != "off":  # episode trees (rollwise.generate.branching)
            from rollwise.generate.branching import BranchingPool

            return BranchingPool.for_run(cfg, backend, codec, task, sampling)
        if cfg.task.env_slots:  # a fixed number of environments; DART's rollout-wise schedule
            from rollwise.generate.rollout_wise import SlotPool

            return SlotPool.for_run(cfg, backend, codec, task, sampling)
        from rollwise.generate.episodes import EpisodePool

        return EpisodePool.for_run(cfg, backend, codec, task, sampling)
    from rollwise.distributed.local import LocalPool

    return LocalPool(
        backend,
        codec,
        task.verify,
        sampling,
        max_batch=cfg.model.max_batch,
        tree=tree,
        verify_workers=getattr(task, "verify_workers", 1),
    )


def worker_engine(cfg, codec, config, device, sampling):
    """A Ray rollout worker's engine (``distributed/ray_pool.py``, ``RolloutWorker``), built in the worker
    by the same builders as this process's: ``(model, backend, pool)``. ``config``: the policy's
    architecture (``distributed.weights.plain_config``), an empty model of which holds no weights until
    the first push; ``device``: where Ray placed the worker. vLLM builds its own model (``model`` None).
    ``RayPool`` takes this function from ``build_pool`` and sends it to its workers, so the pool module
    imports neither the assembler nor the stages it builds from."""
    import torch

    from rollwise.backends import build

    if engine_kind(cfg) == "vllm":
        model, backend = None, build(cfg, codec, config=config)
    else:
        from transformers import AutoModelForCausalLM

        from rollwise.hardware.precision import resolve_compute_dtype

        with torch.random.fork_rng():
            model = AutoModelForCausalLM.from_config(config).eval()
        if cfg.model.dtype == "bfloat16":
            model = model.to(torch.bfloat16)
        model = model.to(device)
        # model.compute_dtype on this worker's device ("auto": measured here, or this machine's cached timings)
        compute = resolve_compute_dtype(
            cfg.model.compute_dtype, device, model.config, weights_dtype=next(model.parameters()).dtype
        )
        backend = build(cfg, codec, model=model, compute_dtype=compute)
    task = build_task(cfg)  # the verifier (and an environment task's environments) run in the worker
    return model, backend, engine_pool(cfg, backend, codec, task, sampling)


def gap_guard(cfg, receivers):
    """The stale-weight alarm (``train.gap_guard``, ``trainer.mismatch.GapGuard``) when the sampler is a
    separate engine (``receivers``: vLLM, Ray workers) fed fresh rollouts only (no asynchrony, on-policy
    replay: old log-probs are legitimately far); else None."""
    gg = cfg.train.gap_guard
    if not (gg.enabled and receivers and not cfg.train.async_.on and cfg.replay.name == "on_policy"):
        return None
    from rollwise.trainer.mismatch import GapGuard

    return GapGuard(gg.ceiling, gg.jump, gg.floor)


def weight_receivers(backend, pool) -> list:
    """What receives the trainer's published weights (``load_weights(version, weights)``): an
    engine that does not share the trainer's module (vLLM) and a pool of workers (Ray)."""
    return [x for x in (backend, pool) if isinstance(x, WeightReceiver)]


# ---------------------------------------------------------------- the assembler (issue #27)


@dataclass(frozen=True)
class PoolStack:
    """Which pools a step generates through (docs/architecture.md §8), as a record a reader can print
    (``print(run.stack)``; issue #41): the engine in this process, the base pool ``build_pool`` made
    around it, and the rollout wrappers of ``ROLLOUT_WRAPPERS`` that applied, in the order they wrap.
    The loop calls the outermost pool (``top``)."""

    backend: Backend | None  # the engine in this process (None: Ray workers each build their own)
    base: Pool  # build_pool's pool: local, episodes, request-seeded, data-parallel or Ray workers
    wrappers: tuple[tuple[str, Pool], ...] = ()  # (ROLLOUT_WRAPPERS name, pool), innermost first

    @property
    def top(self) -> Pool:
        """The pool the loop calls: the outermost wrapper, or the base pool when none applies."""
        return self.wrappers[-1][1] if self.wrappers else self.base

    def layers(self) -> list[tuple[str, str]]:
        """``(role, class name)`` from the pool the loop calls down to the engine."""
        engine = type(self.backend).__name__ if self.backend is not None else "none (each Ray worker builds its own)"
        return [
            *((name, type(p).__name__) for name, p in reversed(self.wrappers)),
            ("base", type(self.base).__name__),
            ("backend", engine),
        ]

    def __str__(self) -> str:
        return "pool stack (the loop calls the first): " + " -> ".join(f"{role} {cls}" for role, cls in self.layers())


@dataclass
class Assembly:
    """A run's parts, built stage by stage by ``open_run`` and ``assemble`` (the run's attributes).
    ``pool``, ``base_pool``, ``async_pool`` and ``arrol`` are the parts of ``stack`` the session and the
    checkpoints name."""

    task: Task
    parts: Strategies
    dp: DataParallel | None = None  # None: one process
    model: Any = None  # the policy (a transformers / tiny causal LM)
    codec: Codec | None = None
    sampling: Sampling | None = None
    precision: Precision | None = None  # hardware.precision's decision (compute dtype, ledger fields)
    compute_dtype: torch.dtype | None = None
    backend: Backend | None = None  # the engine in this process (None with Ray workers)
    stack: PoolStack | None = None  # the pools a step generates through (printable)
    pool: Pool | None = None  # stack.top: what the loop generates through
    base_pool: Pool | None = None  # stack.base (closed after the wrappers and the async generator)
    async_pool: AsyncPool | None = None  # the "async" wrapper of the stack, if it applied
    arrol: ArrolPool | None = None  # the "arrol" wrapper of the stack, if it applied
    trainer: Trainer | StreamingTrainer | None = None
    receivers: list[WeightReceiver] = field(default_factory=list)  # engines that get published weights
    services: Services | None = None  # handed to the strategies
    batches: Batches | None = None  # groups -> the trainer's batch (filters ... D3S)
    value: ValueModel | None = None  # the pass-rate predictor (value.enabled), or None
    verifier_facts: dict = field(default_factory=dict)  # e.g. sandbox/* of a code task, on every ledger line


@dataclass(frozen=True)
class Wiring:
    """What the rollout wrappers take from the session: the run's state (a callable: resume replaces
    it), its directory and the log."""

    state: Callable
    run_dir: Path
    log: Callable = print


def start_data_parallel(cfg, log=print):
    """The first stage: ``(dp, cfg, log)``, ``dp`` a ``data_parallel.DataParallel`` under torchrun with
    WORLD_SIZE > 1 (else None: one process); ranks > 0 wait for rank 0's set-up and take its run name
    (their ``cfg`` and ``log``)."""
    from rollwise.distributed import data_parallel

    dp = data_parallel.start(cfg)
    if dp is not None:
        cfg, log = dp.follow(cfg, log)
    return dp, cfg, log


def open_run(cfg, resume: bool, main: bool = True) -> tuple[Path, Any, Strategies]:
    """The stages that reject user input, before any model loads: the run directory (``main``: this
    process writes it), the task (reads files) and the strategies (validated options). A new run
    directory is removed again when the task or a strategy is refused."""
    existed = cfg.run_dir().exists()
    run_dir = prepare_run_dir(cfg, resume) if main else cfg.run_dir()
    try:
        task = build_task(cfg)
        from rollwise.compat import check_episodes
        from rollwise.envs.base import makes_environments

        episodes = declares_episodes(cfg)
        if makes_environments(task) != episodes:  # the declaration the rest of the run reads must be true
            raise UserError(
                f"task.name = {cfg.task.name!r} "
                + (
                    "makes environments (multi-turn episodes) but its factory does not declare them: give it "
                    "compat = rollwise.registry.Compat(episodes=True)"
                    if not episodes
                    else "declares episodes (Compat(episodes=True)) but its task makes no environments"
                )
            )
        check_episodes(cfg, episodes)  # episode keys and the parts episodes refuse
        return run_dir, task, build_strategies(cfg, task)
    except BaseException:
        if not existed:  # a run that fails validation leaves no empty directory behind
            import shutil

            from rollwise.trainer.checkpoint import unlock_run_dir

            unlock_run_dir(run_dir)
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def assemble(cfg, task, parts: Strategies, wiring: Wiring, dp=None, backend=None) -> Assembly:
    """Everything after ``open_run``, in stage order: runtime checks, policy (and its compute dtype),
    backend (``backend``: one handed in, e.g. a scripted one), base pool, the rollout wrappers
    (``ROLLOUT_WRAPPERS``, in order), trainer, weight receivers, services bound to the strategies."""
    a, log, s = Assembly(task, parts, dp), wiring.log, cfg.sampling
    check_runtime(cfg, log=log)  # Ray cluster reachable, enough CPUs: before the model loads
    a.model, a.codec = build_policy(cfg, task, log=log)
    a.sampling = Sampling(s.temperature, s.top_p, s.max_new_tokens)
    a.precision = _precision(cfg, a.model, log)
    a.compute_dtype = a.precision.dtype
    from rollwise.hardware import fp8

    sampler_model, a.model = fp8.for_run(cfg, a.model, log)  # FP8 rollouts (model.rollout_precision), else a.model
    a.backend = (
        backend if backend is not None else build_backend(cfg, sampler_model, a.codec, cfg.run.seed, a.compute_dtype)
    )
    _record_entropy(cfg, a.backend, parts)
    describe = getattr(task, "describe_verifier", None)
    if describe is not None:  # e.g. which code sandbox is active (verify/sandbox.py), and its ledger facts
        log(describe())
        a.verifier_facts = task.verifier_facts()
    tree = tree_sampler(cfg, a.backend, a.codec)  # LATR, ETMR or EC-Tree (sampling.*), or None
    a.pool = a.base_pool = base = build_pool(cfg, a.backend, a.codec, task, a.sampling, tree, a.model, log=log, dp=dp)
    wrappers = []
    for name, applies, wrap in ROLLOUT_WRAPPERS:
        if applies(cfg, a):
            a.pool = wrap(cfg, a, wiring)
            wrappers.append((name, a.pool))
    a.stack = PoolStack(a.backend, base, tuple(wrappers))
    a.trainer = build_trainer(cfg, a)
    a.receivers = [a.async_pool] if a.async_pool is not None else weight_receivers(a.backend, base)
    a.trainer.gap_guard = gap_guard(cfg, a.receivers)  # stale weights in a separate engine
    t = a.trainer
    a.value = build_value(cfg, a)
    a.services = Services(
        task, a.codec, s.max_new_tokens, t.policy_logprobs, t.policy_and_reference_logprobs, t, a.value
    )
    parts.controller.bind(a.services)  # e.g. ADHint's hint prefixes, SAPO's re-scoring of received text
    parts.replay.bind(a.services)
    a.batches = build_batches(cfg, parts, a.services)
    if cfg.train.async_.periodic:  # periodic asynchrony: groups back-propagated as they arrive (trainer/streaming.py)
        from rollwise.trainer.streaming import StreamingTrainer

        a.trainer = StreamingTrainer(a.trainer, a.batches.stream)
    return a


def build_batches(cfg, parts: Strategies, services):
    """The one owner of groups -> the trainer's batch (``rollwise.batches.Batches``): filters,
    reward shaping, the advantage context and estimator, collation, D3S."""
    from rollwise.batches import Batches

    return Batches(
        filters=parts.filters,
        controller=parts.controller,
        advantage=parts.advantage,
        advantage_options=parts.advantage_options,
        services=services,
        reward=cfg.reward,
        max_new_tokens=cfg.sampling.max_new_tokens,
        d3s=cfg.batch.d3s,
        steps=cfg.train.steps,
        keep_at_most=parts.keep_at_most,
    )


def build_value(cfg, a: Assembly):
    """The pass-rate predictor over the hf backend's prompt states (``value.enabled``), with POISE's
    trajectory probe when the advantage reads it; None when off."""
    v = cfg.value
    if not v.enabled:
        return None
    from rollwise.compat import record
    from rollwise.value.model import ValueModel

    return ValueModel(
        a.backend,
        a.codec,
        a.model.config.hidden_size,
        seed=cfg.run.seed,
        prompts=a.task.train_prompts(),
        trajectories="value_baseline" in getattr(a.parts.advantage, "inputs", ()),
        frozen_rows=ValueModel.FROZEN_ROWS if record(a.parts.replay).replays_rows else 0,  # POISE under replay
        proj_dim=v.proj_dim,
        context=v.context,
        tau=v.tau,
        steps=v.fit_steps,
        lr=v.lr,
        l2=v.l2,
        min_fit=v.min_fit,
    )


def _precision(cfg, model, log):
    """``model.compute_dtype`` decided for the policy's device ("auto": measured on a CPU, hardware/precision.py)."""
    from rollwise.hardware.precision import decide_compute_dtype

    weights = next(model.parameters())
    precision = decide_compute_dtype(
        cfg.model.compute_dtype, weights.device, model.config, weights_dtype=weights.dtype, log=log
    )
    log(precision.describe())
    return precision


def _record_entropy(cfg, backend, parts: Strategies) -> None:
    """Turn on the sampler's entropy record where a strategy reads it: D3S token scores (batch/d3s.py),
    ETTRL / ECHO / MSSR's ``entropy = "sampler"`` (objectives/signals.py), DART's high-entropy turns
    (``task.high_entropy_turns``, generate/entropy_turns.py)."""
    from rollwise.types import EntropyRecorder

    d3s = cfg.batch.d3s
    wanted = (d3s.enabled and d3s.token_level and d3s.entropy == "sampler") or getattr(
        parts.advantage_options, "entropy", None
    ) == "sampler"
    wanted = wanted or (declares_episodes(cfg) and cfg.task.high_entropy_turns < 1.0)  # entropy_turns.py
    if wanted and isinstance(backend, EntropyRecorder):
        backend.record_entropy = True


def tree_sampler(cfg, backend, codec):
    """The tree sampler the config turns on (at most one, ``compat.check_wrappers``): LATR
    (``sampling.latr``, generate/latr.py), ETMR (``sampling.etmr``, generate/etmr.py), EC-Tree
    (``sampling.ec_tree``, generate/ec_tree.py); or None."""
    if cfg.sampling.etmr.enabled:
        from rollwise.generate.etmr import EtmrSampler

        return EtmrSampler(backend, cfg.sampling.etmr, max_batch=cfg.model.max_batch)
    if cfg.sampling.ec_tree.enabled:
        from rollwise.generate.ec_tree import EcTreeSampler

        return EcTreeSampler(backend, cfg.sampling.ec_tree, max_batch=cfg.model.max_batch)
    tc = cfg.sampling.latr
    if not tc.enabled:
        return None
    from rollwise.generate.latr import LatrSampler, math_symbol_ids

    # config-only checks are in latr.check_config (components.check); LatrSampler checks the
    # backend (an argument of the run, not part of the config) before the symbol table is built
    LatrSampler.check_backend(backend)
    symbols = math_symbol_ids(codec.decode, len(codec.tokenizer)) if tc.keep_math_symbols else frozenset()
    return LatrSampler(backend, tc, symbols, max_batch=cfg.model.max_batch)


def build_trainer(cfg, a: Assembly):
    from rollwise.trainer.trainer import Trainer

    parts = a.parts
    return Trainer(
        a.model,
        parts.objective,
        parts.objective_options,
        cfg.train,
        cfg.sampling.temperature,
        reference=cfg.reward.kl.coef > 0 or getattr(parts.advantage, "needs_reference", False),
        compute_dtype=a.compute_dtype,
        data_parallel=a.dp,
    )


# ---------------------------------------------------------------- rollout wrappers, in the order they wrap


def _wrap_async(cfg, a: Assembly, w: Wiring):
    """A generator running ahead of the trainer (distributed/async_pool.py); APRIL inside it, the
    controller then shared under a lock."""
    from rollwise.distributed import async_pool

    parts, april = a.parts, None
    if cfg.replay.name == "april":
        import threading

        parts.controller = async_pool.Locked(parts.controller, threading.RLock())
        april = lambda engine: parts.replay.wrap_pool(engine, parts.controller, w.state)  # noqa: E731
    ctrl = parts.controller
    consume = (lambda groups: a.trainer.consume(groups)) if cfg.train.async_.periodic else None
    draw = lambda: ctrl.plan(ctrl.select(w.state()), w.state())  # noqa: E731  (the generator's next plan)
    a.async_pool = async_pool.build(
        cfg, a.pool, a.backend, a.model, draw, w.run_dir / "timeline.jsonl", consume, april, log=w.log
    )
    return a.async_pool


def _wrap_arrol(cfg, a: Assembly, w: Wiring):
    """ARRoL online pruning of training rollouts (generate/arrol.py)."""
    from rollwise.generate.arrol import ArrolPool

    a.arrol = ArrolPool(a.pool, cfg.sampling.arrol, cfg.sampling.max_new_tokens, cfg.run.seed)
    return a.arrol


def _wrap_sol_rl(cfg, a: Assembly, w: Wiring):
    """Sol-RL's FP8 candidate pool, re-scored by the trainer's full-precision module (generate/sol_rl.py)."""
    from rollwise.backends.hf import HFBackend
    from rollwise.generate.sol_rl import SolRlPool

    scorer = HFBackend(  # scoring only: the trainer's module (a.model), not the FP8 sampler's
        a.model, a.codec.eos_ids, a.codec.pad_id, cfg.model.max_batch, cfg.run.seed, compute_dtype=a.compute_dtype
    )
    return SolRlPool(a.pool, scorer, a.sampling, cfg.sampling.sol_rl.pool_factor)


def _wrap_replay(cfg, a: Assembly, w: Wiring):
    """Replay sources that schedule generation (APRIL, SPEC-RL; ``ReplaySource.schedules_generation``)."""
    return a.parts.replay.wrap_pool(a.pool, a.parts.controller, w.state)


def _wrap_ttrl(cfg, a: Assembly, w: Wiring):
    """TTRL majority-vote pseudo-rewards on training groups (reward/ttrl.py)."""
    from rollwise.reward.ttrl import TtrlPool

    return TtrlPool(a.pool, cfg.reward.ttrl)


# (name in PoolStack, applies(cfg, assembly), wrap(cfg, assembly, wiring))
ROLLOUT_WRAPPERS: tuple[tuple[str, Callable, Callable], ...] = (
    ("async", lambda cfg, a: cfg.train.async_.on, _wrap_async),
    ("arrol", lambda cfg, a: cfg.sampling.arrol.enabled, _wrap_arrol),
    ("sol_rl", lambda cfg, a: cfg.sampling.sol_rl.enabled, _wrap_sol_rl),
    ("replay", lambda cfg, a: a.parts.replay.schedules_generation and a.async_pool is None, _wrap_replay),
    ("ttrl", lambda cfg, a: cfg.reward.ttrl.enabled, _wrap_ttrl),
)
