"""The training loop: rollwise's table of contents (docs/architecture.md §1).

Each stage is one named call; strategies plug in through the parts built by ``Run`` and never
subclass this loop. Generation may take several rounds (a controller can top up groups), then
filters drop groups with a reason, the controller observes every generated group, the replay source
mixes the training groups, their rewards may be shaped (``rollwise.reward``: DAPO's overlong
penalty, KL in the reward), advantages are a pure function of rewards, group ids and a context
computed before them (``rollwise.batches``), D3S may down-sample the batch's rows and tokens
(off by default), and the trainer takes one optimizer step (or one per update epoch). The ledger
records every step's cost.
"""

from __future__ import annotations

from pathlib import Path

from rollwise import defaults, storage
from rollwise.config import Config, load_config
from rollwise.session import Run, RunResult, now, step_metrics
from rollwise.trainer import checkpoint


def train(cfg: Config, *, resume: bool = False, backend=None, log=print) -> RunResult:
    with storage.guard(
        None, (cfg if resume else cfg.with_run_name()).run_dir()
    ):  # set-up writes: the lock, the saved config
        run = Run(cfg, resume=resume, backend=backend, log=log)
    st, parts = run.state, run.parts
    ctrl = parts.controller
    # a full disk, a read-only or vanished run directory: one line naming the intact checkpoint
    with storage.guard(None, run.dir), run.progress() as show:
        if st.step == 0 and cfg.eval.at_start and not run.evals:
            run.evaluate()
            show()
        while st.step < cfg.train.steps and run.within_budget():  # steps cap, compute budget
            t_step = now()
            prompts = ctrl.select(st)  # which prompts
            plan = ctrl.plan(prompts, st)  # how many rollouts each
            groups, planned = [], []
            while plan:  # a controller may top up
                planned.append(plan.total)
                groups = run.pool.generate(plan, groups, st.policy_version)
                plan = ctrl.next_round(groups, st)
            kept, dropped = run.batches.filter(groups)  # keep/drop with reasons
            ctrl.observe(groups, st)  # per-prompt statistics (all groups)
            batch_groups = parts.replay.mix(kept, st)  # fresh + replayed data
            parts.replay.add(kept)
            rows, batch, shaping, advs = run.batches.build(batch_groups)  # shaped rewards, advantages, tensors
            predictor = run.observe_values(groups)  # then the pass-rate predictor learns them (value.enabled)
            t0 = now()  # train time includes D3S (entropy forward)
            batch, picked = run.batches.downsample(batch, rows, st.step)  # D3S rows / tokens (off by default)
            metrics = run.trainer.optimize(batch)  # objective + optimizer step
            ctrl.after_update(batch, rows, metrics, advs)  # GDRO's bin losses, MSSR's KL window
            metrics["time/train_s"] = now() - t0
            st.policy_version += 1
            metrics["time/weight_sync_s"] = run.sync_weights()  # publish to vLLM / Ray workers (0 for hf)
            metrics.update(
                step_metrics(groups, dropped, planned),
                **shaping,
                **ctrl.metrics,
                **picked,
                **parts.replay.metrics,
                **predictor,
            )  # e.g. SAPO's received rollouts
            line = run.ledger.record(st.step, st.policy_version, run.pool.take_cost(), batch.num_loss_tokens, metrics)
            if st.step == run.start_step:  # step-0 probe: truncation, time, memorisation
                defaults.probe(run, line, now() - t_step)
            st.step += 1
            if run.due(cfg.eval.every):
                run.evaluate()
            if run.due(cfg.run.checkpoint_every):
                run.checkpoint()
            show(reward=f"{line['reward/mean']:.3f}", tokens=f"{line['cost/generated_tokens']:,}")
        return run.finish()


def evaluate_run(
    run_dir: str | Path,
    step: int | None = None,
    temperature: float | None = None,
    samples: int | None = None,
    n_prompts: int | None = None,
    log=print,
) -> dict:
    """Evaluate a run's checkpoint on its held-out split (``rollwise eval``): the newest that
    verifies, or ``step``; ``temperature``, ``samples`` (pass@k keeps the run's k values that are
    at most ``samples``) and ``n_prompts`` replace the run's ``eval.*`` values. Read-only: the run
    is neither locked nor resumed, and its ledger is left as it is. Returns ``{"step",
    "checkpoint", "eval/...": ...}``."""
    import tomllib

    from rollwise import components
    from rollwise.eval.evaluate import evaluate
    from rollwise.export import resolve_checkpoint
    from rollwise.types import Sampling

    run_dir = Path(run_dir)
    ckpt = resolve_checkpoint(run_dir, step, log)  # names the steps there when `step` is not one of them
    saved = tomllib.loads((run_dir / "config.resolved.toml").read_text())
    # one process generates here: no Ray workers (their request-seeded sampling kept), no torchrun ranks
    sets = [
        "model.warm_start.steps=0",
        "run.progress=false",
        "run.report_to=[]",
        "distributed.workers=0",
        "distributed.data_parallel=false",
        "train.fsdp=false",  # the checkpoints hold whole weights
    ]
    if saved.get("distributed", {}).get("workers", 0) > 0:
        sets.append("distributed.request_seeds=true")
    if temperature is not None:
        sets.append(f"eval.temperature={temperature}")
    if samples is not None:
        ks = saved.get("eval", {}).get("k", [4])
        sets += [f"eval.samples={samples}", f"eval.k={[k for k in ks if k <= samples] or [samples]}"]
    if n_prompts is not None:
        sets.append(f"eval.n_prompts={n_prompts}")
    cfg = load_config(run_dir / "config.resolved.toml", sets)
    task = components.build_task(cfg)
    model, codec = components.build_policy(
        cfg, task, log=lambda m: None
    )  # no warm start: weights come from the checkpoint
    state = checkpoint.load(ckpt, model)["run_state"]
    s = cfg.sampling
    sampling = Sampling(s.temperature, s.top_p, s.max_new_tokens)
    backend = components.build_backend(cfg, model, codec, cfg.run.seed)
    pool = components.build_pool(cfg, backend, codec, task, sampling, None, model, log=log)
    try:
        m = evaluate(
            pool, task.heldout_prompts(), cfg.eval, sampling, cfg.run.seed, state["step"], state["policy_version"]
        )
    finally:
        pool.close()
    return {"step": state["step"], "checkpoint": ckpt.name, **m}
