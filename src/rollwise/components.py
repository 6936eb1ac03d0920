"""Building a run's parts from a validated ``Config``: names -> registry entries -> objects.

``rollwise.compat.check(cfg)`` resolves every strategy name, validates its options and refuses
parts that cannot be combined, without loading a model (called by ``load_config``).
``build_task``, ``build_strategies`` and ``build_policy`` construct the parts in the order the
loop needs: everything that can reject user input comes before the model is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rollwise.compat import _registries, build_filters, objective_options, resolve  # noqa: F401 (here since #27)
from rollwise.registry import UserError


def build_task(cfg):
    make, opts, arg = resolve(cfg, "task")
    task = make(arg, opts)
    if not task.train_prompts():
        raise UserError(f"task {cfg.task.name!r} has an empty train split")
    if not task.heldout_prompts():
        raise UserError(f"task {cfg.task.name!r} has an empty held-out split")
    if cfg.task.max_train_prompts:
        return TrainSubset(task, cfg.task.max_train_prompts)
    return task


class TrainSubset:
    """A task whose RL train split is the first ``n`` prompts of ``task``'s (``task.max_train_prompts``);
    everything else, the warm-start examples included, is ``task``'s own."""

    def __init__(self, task, n: int):
        self._task, self._train = task, tuple(task.train_prompts()[:n])

    def train_prompts(self):
        return self._train

    def __getattr__(self, name):
        return getattr(self._task, name)


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
        controller=controller, filters=filters, replay=rep_cls(cfg.replay, rep_opts, seed),
        advantage=adv, advantage_options=adv_opts if adv_opts is not None else adv.Options(),
        objective=obj, objective_options=objective_options(cfg),
        keep_at_most=target_groups(cfg.control),
    )


def prepare_run_dir(cfg, resume: bool) -> Path:
    """Create (or reuse when resuming) the run directory; fail early if it is not writable or
    another process holds its lock (``checkpoint.lock_run_dir``, taken before anything in it
    is touched)."""
    from rollwise.train.checkpoint import LOCK, lock_run_dir

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
            raise UserError(f"run directory {run_dir} already exists; use --resume {run_dir}, "
                            "another run.name, or run.overwrite=true")
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

    from rollwise.tokens import Codec
    from rollwise.train import tiny
    from rollwise.train.device import check_model_fits, resolve_device
    from rollwise.train.warm_start import fit_warnings, warm_start

    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    device = resolve_device(cfg.model.device)
    name, ws = cfg.model.name, cfg.model.warm_start
    builtin = name in tiny.NAMES
    if builtin:
        model, tok = tiny.build_tiny(name, seed=ws.seed)
        codec = Codec(tok, use_chat=False)
        warnings = fit_warnings(task, codec, cfg.sampling.max_new_tokens, model.config.max_position_embeddings, builtin=True)
    else:
        from rollwise.train.hf_models import load_pretrained

        model, tok = load_pretrained(name, dtype=cfg.model.dtype)
        codec = Codec(tok, use_chat=True)
        warnings = fit_warnings(task, codec, cfg.sampling.max_new_tokens)
    for w in warnings:
        log(f"warning: {w}")  # before the warm start: a run that cannot score should not spend it first
    from rollwise.compat import check_engine_length

    check_engine_length(cfg, task, codec, getattr(model.config, "max_position_embeddings", None))  # vLLM: prompts fit
    engine = cfg.model.vllm.gpu_memory_utilization if cfg.model.backend == "vllm" else 0.0
    check_model_fits(model, device, dtype_bytes=2 if cfg.model.dtype == "bfloat16" else 4, lora=cfg.model.lora.enabled,
                     reference=cfg.reward.kl.coef > 0, engine_share=engine)  # before the weights move there
    model = model.to(device)  # the warm start, the reference copy, the sampler and the trainer follow it
    if builtin or (ws.pretrained and ws.steps > 0):  # a pretrained model only on request (model.warm_start.pretrained)
        reward_only = getattr(task, "REWARD_ONLY_OPTIONS", ())  # options that leave the SFT examples unchanged share a cache
        key = {"model": tiny.canonical(name) if builtin else name, "task": cfg.task.name,
               "task_options": {k: v for k, v in cfg.task.options.items() if k not in reward_only}}
        if device.type != "cpu":  # a warm start trained on a GPU is another model (CPU cache keys unchanged)
            key["device"] = device.type
        how = warm_start(model, codec, task, ws, ws.seed, key, log=log)
        if not builtin:
            model.eval()  # as load_pretrained returns it
        log(f"warm start: {how}")
    if cfg.model.dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    if cfg.model.lora.enabled:
        from rollwise.train.hf_models import apply_lora

        lc = cfg.model.lora
        model = apply_lora(model, r=lc.r, alpha=lc.alpha, dropout=lc.dropout, target_modules=list(lc.target_modules))
    return model, codec


# ---------------------------------------------------------------- generation (DESIGN.md §7)


def check_runtime(cfg, log=print) -> None:
    """Checks that need the machine, not only the config, made before the model is loaded: the Ray
    cluster (``distributed.address`` reachable, enough CPUs for ``distributed.workers``) and the
    device ``model.device`` names (a CUDA request on a machine without CUDA is refused here)."""
    from rollwise.train.device import describe, resolve_device, summary

    device = resolve_device(cfg.model.device)
    log(summary(describe(device)))
    if cfg.model.backend == "vllm":
        from rollwise.backends.vllm import check_device

        check_device(cfg.model.vllm, device)
    if cfg.distributed.workers > 0:
        from rollwise.distributed.ray_pool import connect

        connect(cfg.distributed, log=log)


def build_backend(cfg, model, codec, seed: int, compute_dtype=None):
    """The rollout engine in this process (``model.backend``), or None when rollout workers
    (``distributed.workers > 0``) each build their own. ``compute_dtype``: the dtype the run
    resolved ``model.compute_dtype`` to (``Run.precision``); None resolves it here."""
    if cfg.distributed.workers > 0:
        return None
    if cfg.model.backend == "vllm":
        from rollwise.backends.vllm import VLLMBackend

        return VLLMBackend.from_policy(model, codec.eos_ids, cfg.model, seed)
    from rollwise.backends.hf import HFBackend
    if compute_dtype is None:
        from rollwise.train.precision import resolve_compute_dtype

        weights = next(model.parameters())
        compute_dtype = resolve_compute_dtype(cfg.model.compute_dtype, weights.device, model.config, weights_dtype=weights.dtype)
    return HFBackend(model, codec.eos_ids, codec.pad_id, cfg.model.max_batch, seed, compute_dtype=compute_dtype)


def build_pool(cfg, backend, codec, task, sampling, tree, model, log=print, dp=None):
    """The worker pool the loop calls: the local pool (in this process), request-seeded when
    ``distributed.request_seeds``, shared across data-parallel ranks (``dp``, a
    ``data_parallel.DataParallel``; request-seeded too), or Ray rollout workers (``distributed.workers``)."""
    from rollwise.distributed.local import LocalPool

    if cfg.distributed.workers > 0:
        from rollwise.distributed.ray_pool import RayPool

        return RayPool(cfg, model, codec, sampling, log=log)
    pool = LocalPool(backend, codec, task.verify, sampling, max_batch=cfg.model.max_batch, tree=tree,
                     verify_workers=getattr(task, "verify_workers", 1))
    if dp is not None:
        from rollwise.distributed.data_parallel import DataParallelPool

        return DataParallelPool(pool, dp, cfg.run.seed)
    if cfg.distributed.request_seeds:
        from rollwise.distributed.local import SeededPool

        pool = SeededPool(pool, cfg.run.seed)
    return pool


def gap_guard(cfg, receivers):
    """The stale-weight alarm (``train.gap_guard``, ``train.mismatch.GapGuard``) when the sampler is a
    separate engine (``receivers``: vLLM, Ray workers) fed fresh rollouts only (no asynchrony, on-policy
    replay: old log-probs are legitimately far); else None."""
    gg = cfg.train.gap_guard
    if not (gg.enabled and receivers and not cfg.train.async_.on and cfg.replay.name == "on_policy"):
        return None
    from rollwise.train.mismatch import GapGuard

    return GapGuard(gg.ceiling, gg.jump, gg.floor)


def weight_receivers(backend, pool) -> list:
    """What receives the trainer's published weights (``load_weights(version, weights)``): an
    engine that does not share the trainer's module (vLLM) and a pool of workers (Ray)."""
    return [x for x in (backend, pool) if hasattr(x, "load_weights")]
