"""The compatibility table: which parts of a run may be combined, checked from the config alone.

Every part a config can choose declares what it needs and supports in a frozen record
(:class:`rollwise.registry.Compat`, attribute ``compat`` of its class or function, or ``COMPAT``
of a pool's or rollout wrapper's module): the backend (``backends.REGISTRY``: hf, vllm), the pool
(:data:`POOLS`: local, Ray workers, data-parallel, asynchronous, periodic), the rollout wrappers
that drive the backend in the trainer's process (:data:`WRAPPERS`: ARRoL, the tree samplers LATR, ETMR
and EC-Tree;
replay sources with ``wrap_pool``: APRIL, SPEC-RL), the controller, the advantage estimator and
the objective (its options' ``needs_prox``: an off-policy correction). :func:`check` derives every
refusal between parts from those records, naming the keys to change, before any model is loaded;
``config.load_config`` calls it. Each part's own ``check_config`` checks only local facts (installed?
address parses? its options consistent?), and a config section's refusals that concern it alone live
beside it
(``rollwise.sections.<section>``: episode keys on a single-turn task, options for a filter that is not
on), called from here. Three strategies still check another section from their own options, which no
record field expresses: GDRO (``loss_signal = 'surrogate_kl'`` needs a reference model; it refuses
``batch.d3s``), APRIL (``prefix_mode = 'tis'`` needs an objective weight) and SAPO (not with
``reward.ttrl``).

Parts are reached through their registries (entries are ``"module:attr"`` strings loaded when
chosen), so this module imports no strategy, backend or pool module, and nothing below the
assembler (``components``) imports this one except ``config.load_config``.

What fails late without this table, refused here: ``entropy = 'sampler'`` (ETTRL, ECHO; MSSR on
request) with an engine that records no sampler entropies (vLLM, Ray workers, tree samplers);
periodic asynchrony with a part that reads the whole batch (GDPO's batch normalisation, MSSR,
ECHO, GDRO, ADHint, R3L, SCOPE), which would compute every step twice; and, once the tokenizer is
known (:func:`check_engine_length`, before the warm start and the engine), a prompt plus
``sampling.max_new_tokens`` longer than vLLM's ``max_model_len``. D3S's ``entropy = 'sampler'`` is
not refused: it documents a fallback to a no-grad trainer forward (``batch/d3s.py``,
``d3s/entropy_from_trainer``). A task may check its options against other sections the same way
(``check_config(cfg, opts)`` on its factory: arithmetic's ``ramble`` needs ``sampling.max_new_tokens``
set). Multi-turn episodes (an environment task, docs/architecture.md §11)
refuse the parts that make single completions (:func:`check_episodes`; the assembler checks the
built task again, so a task factory without the ``episodes`` attribute is caught before the model loads).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rollwise.registry import Compat, Registry, UserError, record, validate_options
from rollwise.sections.filter import check_options_named
from rollwise.sections.model import check_lora
from rollwise.sections.task import check_schedule, check_single_turn

# Pools and rollout wrappers, by the name the table uses: "module" entries are the modules that
# implement them (each declares ``COMPAT`` and may define a local ``check_config(cfg)``).
POOLS = Registry("pool")
POOLS.register("local", "rollwise.distributed.local")
POOLS.register("ray", "rollwise.distributed.ray_pool")
POOLS.register("data_parallel", "rollwise.distributed.data_parallel")
POOLS.register("async", "rollwise.distributed.async_pool")
POOLS.register("periodic", "rollwise.trainer.streaming")
WRAPPERS = Registry("rollout wrapper")
WRAPPERS.register("sampling.arrol", "rollwise.generate.arrol")
WRAPPERS.register("sampling.latr", "rollwise.generate.latr")
WRAPPERS.register("sampling.etmr", "rollwise.generate.etmr")
WRAPPERS.register("sampling.ec_tree", "rollwise.generate.ec_tree")
WRAPPERS.register("sampling.sol_rl", "rollwise.generate.sol_rl")
SAMPLING_WRAPPERS = (
    "sampling.arrol",
    "sampling.latr",
    "sampling.etmr",
    "sampling.ec_tree",
    "sampling.sol_rl",
)  # each has .enabled


def _registries() -> dict[str, Registry]:
    from rollwise import control, replay, tasks
    from rollwise import filter as filters
    from rollwise.objectives import ADVANTAGES, OBJECTIVES

    return {
        "task": tasks.REGISTRY,
        "control": control.REGISTRY,
        "replay": replay.REGISTRY,
        "advantage": ADVANTAGES,
        "objective": OBJECTIVES,
        "filter": filters.REGISTRY,
    }


def resolve(cfg, section: str) -> tuple[Any, Any, str | None]:
    """(object, validated options, argument) for a single-strategy section."""
    sec = getattr(cfg, section)
    res = _registries()[section].resolve(sec.name)
    return res.obj, validate_options(section, sec.name, res.obj, dict(sec.options)), res.arg


def local_check(part, cfg) -> None:
    """The part's own ``check_config(cfg)`` (local facts: installed? address parses?), if it has one."""
    if hasattr(part, "check_config"):
        part.check_config(cfg)


def build_filters(cfg) -> list[tuple[str, Callable]]:
    reg = _registries()["filter"]
    check_options_named(cfg.filter)  # the filter section's own check
    out = []
    for name in cfg.filter.names:
        fn = reg.get(name)
        opts = validate_options("filter", name, fn, dict(cfg.filter.options.get(name, {})))
        out.append((name, (lambda f, o: lambda g: f(g, o) if o is not None else f(g))(fn, opts)))
    return out


def objective_options(cfg):
    """The objective's options as the trainer gets them: defaults filled in, and the TIS weight on when
    the sampler is not the trainer's forward (``rollwise.trainer.mismatch.default_tis``)."""
    from rollwise.trainer.mismatch import default_tis

    obj, opts, _ = resolve(cfg, "objective")
    return default_tis(opts if opts is not None else obj.Options(), cfg, engine_kind(cfg))


# ---------------------------------------------------------------- the parts a config chooses


def backend_part(cfg):
    from rollwise import backends

    return backends.REGISTRY.get(cfg.model.backend)


def engine_kind(cfg) -> str:
    """The kind of engine ``model.backend`` samples with, as its compatibility record declares it
    (``Compat.engine``: ``'trainer'``, ``'vllm'``, ``'script'``, ``'other'``): the one place the run
    reads it."""
    return record(backend_part(cfg)).engine


def pools(cfg) -> list[tuple[str, Any]]:
    """(the setting that chose it, module) of each pool layer the config turns on, the base pool first."""
    a = cfg.train.async_
    out = [
        (f"distributed.workers = {cfg.distributed.workers}", POOLS.get("ray"))
        if cfg.distributed.workers > 0
        else ("local", POOLS.get("local"))
    ]
    if POOLS.get("data_parallel").enabled(cfg):
        out.append(("data-parallel training (torchrun)", POOLS.get("data_parallel")))
    if a.periodic:
        out.append(("train.async.periodic = true", POOLS.get("periodic")))
    elif a.on:
        out.append(("train.async", POOLS.get("async")))
    return out


def wrappers(cfg) -> list[tuple[str, Compat]]:
    """(config key, record) of each rollout wrapper the config turns on: ARRoL, LATR trees, and a
    replay source that generates training rollouts itself (APRIL, SPEC-RL)."""
    out = [
        (f"{key}.enabled", record(WRAPPERS.get(key)))
        for key in SAMPLING_WRAPPERS
        if getattr(cfg.sampling, key.split(".")[1]).enabled
    ]
    rep = record(resolve(cfg, "replay")[0])
    if rep.owns_generation or rep.needs_decode_hooks:
        out.append((f"replay.name = {cfg.replay.name!r}", rep))
    return out


def in_process_strategies(cfg) -> list[str]:
    """The enabled rollout strategies that drive the ``hf`` backend in the trainer's process
    (ARRoL, LATR trees, a replay source that schedules generation: APRIL, SPEC-RL), as config keys;
    vLLM, Ray workers and asynchronous rollouts refuse them."""
    return [key for key, rec in wrappers(cfg) if rec.needs_decode_hooks]


# ---------------------------------------------------------------- check


def check_model(cfg) -> None:
    from rollwise.trainer import tiny

    name = cfg.model.name
    if name not in tiny.NAMES:
        from rollwise.trainer.hf_models import check_model_name

        check_model_name(name, builtin_names=tiny.NAMES)
    check_lora(cfg.model)  # the model section's own check


def check_detector(name: str) -> None:
    """``reward.fapo.detector``: a flaw detector (``rollwise.flaws.DETECTORS``) or a plugin that imports,
    refused naming the key (not beside its section: the schema imports no module but the registry)."""
    from rollwise.flaws import DETECTORS

    try:
        DETECTORS.resolve(name)
    except UserError as e:
        raise UserError(f"reward.fapo.detector = {name!r}: {e}") from None


def check(cfg) -> None:
    """Every refusal that needs only the config (module docstring); called by ``config.load_config``."""
    check_model(cfg)
    from rollwise.trackers import check as check_trackers

    check_trackers(cfg.run.report_to)
    check_detector(cfg.reward.fapo.detector)
    for section in ("task", "control", "replay", "advantage", "objective"):
        resolve(cfg, section)
    if declares_episodes(cfg):  # first: the episode pool replaces what later checks reason about
        check_episodes(cfg, True)
    check_episode_credit(cfg)
    check_episode_transforms(cfg)
    check_branching(cfg)
    adv_fn, adv_opts, _ = resolve(cfg, "advantage")
    if cfg.objective.name == "gspo" and getattr(adv_fn, "per_token", False):  # turn_return, gigpo: per turn
        raise UserError(
            f"advantage.name = {cfg.advantage.name!r} gives per-token (per-turn) advantages, which objective "
            "'gspo' (sequence-level) cannot use; choose another objective"
        )
    if getattr(adv_opts, "per_token", False) and cfg.objective.name == "gspo":  # tree advantage, per token
        raise UserError(
            "advantage.options.per_token = true gives per-token advantages, which objective 'gspo' "
            "(sequence-level) cannot use; set advantage.options.per_token = false or another objective"
        )
    for section in ("control", "replay", "advantage"):
        cls, opts, _ = resolve(cfg, section)
        check_needs(cfg, section, record(cls))  # e.g. SPEED needs its filter, V0.5's advantage its controller
        if hasattr(cls, "check_config"):
            cls.check_config(
                cfg, opts
            )  # the strategy's own options (e.g. APRIL's "tis" mode needs an objective weight)
    task, task_opts, _ = resolve(cfg, "task")
    if hasattr(task, "check_config"):  # a task's options against other sections (arithmetic's ramble: a length)
        task.check_config(cfg, task_opts)
    build_filters(cfg)
    if cfg.control.dynamic_sampling.enabled and "zero_variance" not in cfg.filter.names:
        raise UserError(
            "control.dynamic_sampling.enabled needs 'zero_variance' in filter.names "
            f"(got {list(cfg.filter.names)}); it refills the groups that filter drops"
        )
    check_wrappers(cfg)
    check_backend(cfg)
    check_rollout_precision(cfg)
    check_workers(cfg)
    check_async(cfg)
    check_data_parallel(cfg)
    check_fsdp(cfg)
    check_packing(cfg)
    check_sampler_entropy(cfg)
    check_value(cfg)
    check_independent_rows(cfg)
    from rollwise.reward import overlong_limits

    overlong_limits(cfg.reward.overlong_penalty, cfg.sampling.max_new_tokens)


def declares_episodes(cfg) -> bool:
    """Whether the task runs multi-turn episodes: its factory's compatibility record
    (``Compat(episodes=True)``), the one place that mode is declared. The assembler checks that the
    built task agrees (``rollwise.components.open_run``)."""
    return record(resolve(cfg, "task")[0]).episodes


def check_episodes(cfg, env: bool) -> None:
    """Multi-turn episodes (``env``: the task makes environments, docs/architecture.md §11) run in
    the episode pool (in this process, or in each Ray worker): refused with the parts that make or
    continue single completions (ARRoL, LATR trees, APRIL, SPEC-RL, prefix-continuing controllers),
    data-parallel ranks (their pool is single-turn), asynchrony that streams or stops plans
    mid-generation (bounded staleness with ``on_new_weights = "finish"`` runs: the generator's engine
    is the episode pool over its own weights) and TTRL (majority votes on one answer).
    ``distributed.request_seeds`` works (one seeded episode call per request). A single-turn task
    refuses episode keys changed from their defaults (the task section's own check,
    ``rollwise.sections.task.check_single_turn``); an environment task, a rollout-wise schedule without
    environment slots (``check_schedule``)."""
    task = cfg.task
    if not env:
        check_single_turn(task)
        return
    check_schedule(task)
    bad = [f"{key} (makes or continues single completions)" for key, _ in wrappers(cfg)]
    ctrl = resolve(cfg, "control")[0]
    if record(ctrl).continues_prefixes:
        bad.append(f"control.name = {cfg.control.name!r} (continues prefixes of its rollouts)")
    a = cfg.train.async_
    if a.on and (a.periodic or a.on_new_weights != "finish"):  # whole plans of episodes run ahead (async_pool)
        bad.append(
            "train.async.periodic or train.async.on_new_weights other than 'finish' (the generator runs whole "
            "episodes of a plan)"
        )
    if POOLS.get("data_parallel").enabled(cfg):
        bad.append("data-parallel training (torchrun)")
    if cfg.reward.ttrl.enabled:
        bad.append("reward.ttrl.enabled (majority votes on one answer)")
    if bad:
        raise UserError(
            f"task.name = {task.name!r} runs multi-turn episodes (rollwise.generate.episodes), which do not run "
            f"with {'; '.join(bad)}; turn it off"
        )


def check_episode_credit(cfg) -> None:
    """Step-level credit on episodes. An advantage with ``needs_episodes`` (HGPO, SALT: their step
    groups are turns of episodes) on a task that makes single-turn rollouts would silently be
    trajectory GRPO; one with ``needs_anchors`` (GiGPO, HGPO: turns grouped by the environment state
    they acted on, ``Turn.anchor``) on an environment task whose record declares
    ``Compat(state_anchors=False)`` keys no state (e.g. ``python_math``: an interpreter namespace) and would
    silently be episode-level GRPO. Both refused, naming both keys."""
    adv, name = resolve(cfg, "advantage")[0], cfg.advantage.name
    if getattr(adv, "needs_episodes", False) and not declares_episodes(cfg):
        raise UserError(
            f"advantage.name = {name!r} assigns credit to the turns of multi-turn episodes, and task.name = "
            f"{cfg.task.name!r} makes single-turn rollouts: it would be trajectory GRPO; choose an environment task "
            "(e.g. 'guess_number', 'calculator') or advantage.name = 'grpo'"
        )
    if not getattr(adv, "needs_anchors", False) or record(resolve(cfg, "task")[0]).state_anchors:
        return
    raise UserError(
        f"advantage.name = {name!r} groups turns by the environment state they acted on, and task.name = "
        f"{cfg.task.name!r} keys no state (its turns carry no anchor, see its module docstring): {name} would be "
        "episode-level GRPO; choose advantage.name = 'turn_return' or 'grpo'"
    )


def check_episode_transforms(cfg) -> None:
    """CLEANER's splice (``task.cleaner``, ``rollwise.generate.cleaner``) repairs failed tool calls: refused
    on a task whose record does not declare ``tools``, and with a backend that cannot re-score the spliced
    tokens (vLLM). UI-S1's replay (``task.semi_online``, ``rollwise.envs.semi_online``) follows each prompt's
    expert trajectory: refused on a task that does not declare ``demonstrations``. DART's high-entropy
    turns (``task.high_entropy_turns``, ``rollwise.generate.entropy_turns``) rank turns by the sampler's
    entropies: refused with an engine that records none (vLLM, Ray workers). (A single-turn task
    refuses these keys with every episode key, ``rollwise.sections.task.check_single_turn``.)"""
    rec, task = record(resolve(cfg, "task")[0]), cfg.task
    if task.cleaner.enabled and rec.episodes and not rec.tools:
        raise UserError(
            f"task.cleaner.enabled splices repaired tool calls in place of failed ones, and task.name = {task.name!r} "
            "calls no tools: there is nothing to repair; turn task.cleaner.enabled off or choose a tool task "
            "('calculator', 'python_math')"
        )
    if task.cleaner.enabled and engine_kind(cfg) == "vllm":
        raise UserError(
            "task.cleaner.enabled re-scores the spliced tokens with the sampler, which model.backend = 'vllm' "
            "cannot do here; use model.backend = 'hf' or turn task.cleaner.enabled off"
        )
    engines = [(f"model.backend = {cfg.model.backend!r}", record(backend_part(cfg)))]
    engines += [(key, record(pool)) for key, pool in pools(cfg)[:1] if key != "local"]  # Ray workers
    for key, r in engines if task.high_entropy_turns < 1.0 and rec.episodes else ():
        if not r.sampler_entropy:
            raise UserError(
                f"task.high_entropy_turns = {task.high_entropy_turns} ranks turns by the sampler's entropies, "
                f"which {key} does not record: set task.high_entropy_turns = 1, or sample with model.backend = "
                "'hf' in this process"
            )
    if task.semi_online.enabled and rec.episodes and not rec.demonstrations:
        raise UserError(
            f"task.semi_online.enabled replays each prompt's expert trajectory, and task.name = {task.name!r} has no "
            "demonstrations; choose a task with them ('calculator', 'python_math') or turn task.semi_online.enabled off"
        )


def check_branching(cfg) -> None:
    """Episode branching (``sampling.branching.mode``, ``rollwise.generate.branching``) forks environments
    mid-episode: refused on a single-turn task, on an environment task whose factory does not declare
    ``Compat(forkable=True)`` (its environments cannot be copied, ``rollwise/envs/base.py``), with
    ``task.episode_schedule = 'overlap'`` (trees grow in lockstep turns) and, for ``'aepo'`` (which reads
    the sampler's entropies), with a backend that records none. An advantage with ``needs_branching``
    (PORTool's fork-relative advantage) without branching would be a scaled trajectory GRPO: refused."""
    mode, task = cfg.sampling.branching.mode, cfg.task.name
    adv, name = resolve(cfg, "advantage")[0], cfg.advantage.name
    if getattr(adv, "needs_branching", False) and mode == "off":
        raise UserError(
            f"advantage.name = {name!r} compares the branches of episode trees, and sampling.branching.mode = 'off' "
            "grows none (its fork-relative advantage would be 0): set sampling.branching.mode = 'portool' or 'aepo'"
        )
    if mode == "off":
        return
    key = f"sampling.branching.mode = {mode!r}"
    if not declares_episodes(cfg):
        raise UserError(
            f"{key} forks multi-turn episodes, and task.name = {task!r} makes single-turn rollouts: remove the "
            "setting or choose an environment task (e.g. 'calculator')"
        )
    if not record(resolve(cfg, "task")[0]).forkable:
        raise UserError(
            f"{key} forks episodes at tool-call turns, and task.name = {task!r} declares environments that cannot "
            "be forked (no Compat(forkable=True), rollwise/envs/base.py): set sampling.branching.mode = 'off' or "
            "choose a forkable task (e.g. 'calculator', 'guess_number')"
        )
    if cfg.task.semi_online.enabled:
        raise UserError(
            f"{key} forks episodes, and task.semi_online.enabled replays an expert trajectory whose patch budget "
            "one fork would share with its branches: turn one of them off"
        )
    if cfg.task.episode_schedule != "lockstep":
        raise UserError(
            f"{key} grows episode trees in lockstep turns, and task.episode_schedule = "
            f"{cfg.task.episode_schedule!r}: set task.episode_schedule = 'lockstep'"
        )
    if cfg.task.env_slots:
        raise UserError(
            f"{key} grows each group as one tree of episodes, and task.env_slots = {cfg.task.env_slots} queues "
            "episodes for environments one by one (rollwise.generate.rollout_wise): set task.env_slots = 0"
        )
    if mode == "aepo" and not record(backend_part(cfg)).sampler_entropy:
        raise UserError(
            f"{key} splits its budget by the sampler's entropies, which model.backend = {cfg.model.backend!r} does "
            "not record: set model.backend = 'hf' or sampling.branching.mode = 'portool'"
        )


def wants_value(cfg, section: str) -> str | None:
    """The setting of ``section``'s strategy that reads the pass-rate predictor (its record's
    ``needs_value``: the strategy itself, or one option value), else None."""
    cls, opts, _ = resolve(cfg, section)
    need = record(cls).needs_value
    who = f"{section}.name = {getattr(cfg, section).name!r}"
    if need is True:
        return who
    if need and getattr(opts, need[0], None) == need[1]:
        return f"{section}.options.{need[0]} = {need[1]!r}"
    return None


def check_value(cfg) -> None:
    """A strategy that reads predicted pass rates needs ``value.enabled``; the predictor reads the
    prompt states of the hf backend in the trainer's process (no vLLM, Ray workers or asynchrony)."""
    wanted = [w for w in (wants_value(cfg, s) for s in ("control", "advantage")) if w is not None]
    if wanted and not cfg.value.enabled:
        raise UserError(f"{wanted[0]} reads the pass-rate predictor: set value.enabled = true")
    if not cfg.value.enabled:
        return
    # what generates, as the records say: the backend and each pool layer (data-parallel ranks each hold
    # the same hf module, so that layer is no obstacle)
    dp = POOLS.get("data_parallel")
    engine = [(f"model.backend = {cfg.model.backend!r}", backend_part(cfg))] + [
        (setting, mod) for setting, mod in pools(cfg) if mod is not dp
    ]
    lacking = [setting for setting, part in engine if not record(part).decode_hooks]
    if lacking:
        raise UserError(
            f"value.enabled reads prompt states from the hf backend in the trainer's process; it does not run "
            f"with {lacking[0]} (turn one of them off)"
        )


# Group filters that judge each row by itself (a group is dropped when one of its rows is overlong or
# unverified): keeping a group is then a product of per-row events, so the kept rows stay independent.
ROW_WISE_FILTERS = ("overlong", "errored")


def check_independent_rows(cfg) -> None:
    """An advantage with ``independent_rows`` (POISE: each row's baseline is another row's value,
    ``objectives/poise.py``) is unbiased only when the other rows of a group are independent of the row
    in the batch it trains on. Refused, naming the advantage and the key that breaks it: LATR trees
    (siblings share a prefix), ARRoL (survivors chosen jointly, towards balanced groups), controllers
    with rounds or a ``finish_batch`` (top-ups and row selections that follow earlier outcomes:
    ``Controller.next_round`` / ``finish_batch`` overridden), dynamic sampling, group filters that read
    the rewards (all but ``ROW_WISE_FILTERS``) and SAPO's ``drop_zero_advantage``. Replay is not refused:
    a replayed row keeps the baseline it was given when fresh (``objectives/inputs.value_baseline``)."""
    adv, _, _ = resolve(cfg, "advantage")
    if not record(adv).independent_rows:
        return
    from rollwise.types import Controller

    bad = [
        f"{key} (rows chosen together or sharing a prefix)" for key, _ in wrappers(cfg) if key.startswith("sampling.")
    ]
    ctrl = resolve(cfg, "control")[0]
    hooks = [
        h for h in ("next_round", "finish_batch") if getattr(ctrl, h) is not getattr(Controller, h)
    ]  # the contract's
    if hooks:
        bad.append(f"control.name = {cfg.control.name!r} (its {' / '.join(hooks)} follows the outcomes)")
    if cfg.control.dynamic_sampling.enabled:
        bad.append("control.dynamic_sampling.enabled (refills by outcome)")
    bad += [
        f"filter.names containing {n!r} (drops groups by their rewards)"
        for n in cfg.filter.names
        if n not in ROW_WISE_FILTERS
    ]
    rep, rep_opts, _ = resolve(cfg, "replay")
    if rep_opts is None and hasattr(rep, "Options"):
        rep_opts = rep.Options()  # the defaults (SAPO drops zero-advantage groups by default)
    if getattr(rep_opts, "drop_zero_advantage", False):
        bad.append(
            f"replay.name = {cfg.replay.name!r} with replay.options.drop_zero_advantage = true "
            "(takes groups by their rewards)"
        )
    if bad:
        raise UserError(
            f"advantage.name = {cfg.advantage.name!r} takes each row's baseline from the other rows of its group, "
            f"which must be sampled and kept independently of it; it does not run with {'; '.join(bad)}: "
            "turn it off or choose another advantage"
        )


def check_needs(cfg, section: str, rec: Compat) -> None:
    """What the strategy of ``section`` needs of the other sections (its record): a partner, a filter,
    no dynamic sampling (or one type of it), no other part making the rollouts whose prefixes it continues."""
    who = f"{section}.name = {getattr(cfg, section).name!r}"
    if rec.pairs_with is not None:
        other, want = rec.pairs_with
        got = getattr(cfg, other).name
        if got != want:
            raise UserError(f"{who} needs {other}.name = {want!r} (got {got!r}): the two work as a pair")
    if rec.needs_filter is not None and rec.needs_filter not in cfg.filter.names:
        raise UserError(f"{who} needs {rec.needs_filter!r} in filter.names (got {list(cfg.filter.names)})")
    ds = cfg.control.dynamic_sampling
    if ds.enabled and rec.dynamic_sampling is not True and ds.type != rec.dynamic_sampling:
        key = (
            "control.dynamic_sampling.enabled"
            if rec.dynamic_sampling is False
            else f"control.dynamic_sampling.type = {ds.type!r} (only {rec.dynamic_sampling!r})"
        )
        raise UserError(
            f"{who} does not run with {key}: it runs its own rounds or keeps per-step state that dynamic "
            "sampling's rounds would break; set control.dynamic_sampling.enabled = false"
        )
    if rec.continues_prefixes:
        owners = [key for key, r in wrappers(cfg) if r.owns_generation]
        if owners:
            raise UserError(f"{who} continues its own prefixes; it does not combine with {', '.join(owners)}")


def check_wrappers(cfg) -> None:
    """Each wrapper's local check; at most one part makes the training rollouts."""
    for key in SAMPLING_WRAPPERS:
        local_check(WRAPPERS.get(key), cfg)  # ARRoL: its check point; ETMR: whole trees per group
    rep = record(resolve(cfg, "replay")[0])
    on = [f"{key}.enabled" for key in SAMPLING_WRAPPERS if getattr(cfg.sampling, key.split(".")[1]).enabled]
    if len(on) > 1:
        raise UserError(f"{' cannot be combined with '.join(on)} (each owns training generation; turn all but one off)")
    if on and rep.owns_generation:
        raise UserError(
            f"{on[0]} cannot be combined with replay {cfg.replay.name!r} (both own training generation: the replay "
            "would bypass the sampler)"
        )


def check_backend(cfg) -> None:
    """``model.backend``: its local check; wrappers that need decode hooks it lacks."""
    backend = backend_part(cfg)
    local_check(backend, cfg)  # vLLM: installed
    needs_hf = in_process_strategies(cfg)
    if needs_hf and not record(backend).decode_hooks:
        raise UserError(
            f"{', '.join(needs_hf)} needs the hf backend's decode hooks or scoring, which "
            f"model.backend = {cfg.model.backend!r} does not have; set model.backend = 'hf' or turn it off"
        )


def check_rollout_precision(cfg) -> None:
    """``model.rollout_precision = "fp8"`` (``rollwise.hardware.fp8``) quantises the hf sampler's module in
    this process; ``train.matched_quantisation`` the trainer's to match it."""
    fp8 = cfg.model.rollout_precision == "fp8"
    if cfg.train.matched_quantisation and not fp8:
        raise UserError(
            "train.matched_quantisation = true quantises the trainer's forward to match FP8 rollouts: set "
            "model.rollout_precision = 'fp8', or train.matched_quantisation = false"
        )
    if cfg.model.fp8_gemm != "emulated" and not fp8:
        raise UserError(
            f"model.fp8_gemm = {cfg.model.fp8_gemm!r} multiplies FP8 rollouts' operands, and model.rollout_precision "
            "= 'model' has none: set model.rollout_precision = 'fp8', or remove model.fp8_gemm"
        )
    if not fp8:
        return
    refused = [
        (cfg.model.backend != "hf", f"model.backend = {cfg.model.backend!r} (vLLM quantises with its own kernels)"),
        (cfg.distributed.workers > 0, "distributed.workers > 0 (each Ray worker builds its own sampler)"),
        (cfg.train.async_.on, "train.async (its generator holds its own copy of the weights)"),
        (cfg.train.fsdp, "train.fsdp = true"),
        (cfg.model.lora.enabled, "model.lora.enabled = true (the adapters' products would stay unquantised)"),
    ]
    for bad, what in refused:
        if bad:
            raise UserError(
                f"model.rollout_precision = 'fp8' quantises the hf sampler in this process and does not work with "
                f"{what}; set model.rollout_precision = 'model' or change that key"
            )


def check_workers(cfg) -> None:
    """``distributed.workers``: Ray's local check; wrappers that drive the backend in this process."""
    ray = POOLS.get("ray")
    local_check(ray, cfg)  # installed, address
    local_only = in_process_strategies(cfg)
    if cfg.distributed.workers > 0 and local_only and not record(ray).decode_hooks:
        raise UserError(
            f"{', '.join(local_only)} drives the backend in this process, which distributed.workers > 0 "
            "does not have; set distributed.workers = 0 or turn it off"
        )


def check_async(cfg) -> None:
    """``train.async``: periodic asynchrony (strictly on-policy, streamed) or bounded staleness."""
    a = cfg.train.async_
    local_check(POOLS.get("async"), cfg)  # its own options consistent
    if a.periodic:
        check_periodic(cfg)
        return
    if not a.on:
        return
    gen = record(POOLS.get("async"))
    in_process = [k for k in in_process_strategies(cfg) if k != "replay.name = 'april'"]  # APRIL runs inside (build)
    if cfg.replay.name == "april" and (
        engine_kind(cfg) != "trainer" or cfg.distributed.workers > 0 or a.on_new_weights != "finish"
    ):
        raise UserError(
            "replay.name = 'april' (APRIL) with train.async drives the generator's own hf backend: set "
            "model.backend = 'hf', distributed.workers = 0 and train.async.on_new_weights = 'finish'"
        )
    if in_process and not gen.decode_hooks:
        raise UserError(
            f"{', '.join(in_process)} drives the trainer's backend directly, which train.async "
            "(a generator with its own weights) does not allow; turn it off or set train.async.max_staleness = 0"
        )
    engine = (record(backend_part(cfg)), record(pools(cfg)[0][1]))  # what generates: the backend, the base pool
    if a.on_new_weights != "finish" and not all(rec.decode_hooks for rec in engine):
        raise UserError(
            f"train.async.on_new_weights = {a.on_new_weights!r} stops generation between decode steps, "
            "which only the in-process hf backend does; set model.backend = 'hf' and distributed.workers = 0, "
            "or on_new_weights = 'finish'"
        )
    if gen.plans_ahead and a.max_staleness >= 1:  # the pool draws later steps' plans: η >= 1
        check_plans_ahead(cfg)
    if a.max_staleness >= 1:
        check_corrected(cfg)


def check_periodic(cfg) -> None:
    """``train.async.periodic``: the trainer back-propagates each group as it arrives
    (``trainer/streaming.py``), which needs every row of the batch to be the row it streamed."""
    local_check(POOLS.get("periodic"), cfg)
    bad = []
    if cfg.train.epochs > 1:
        bad.append("train.epochs > 1 (one optimizer step per batch)")
    if cfg.train.ess_lr_scaling.enabled:
        bad.append("train.ess_lr_scaling.enabled (needs every row's weight before the step)")
    if cfg.batch.d3s.enabled:
        bad.append("batch.d3s.enabled (selects rows of the whole batch)")
    if cfg.replay.name != "on_policy":
        bad.append(f"replay.name = {cfg.replay.name!r} (mixes other groups into the batch)")
    if cfg.control.dynamic_sampling.enabled:
        bad.append("control.dynamic_sampling.enabled (keeps a share of the batch)")
    if any(rec.needs_decode_hooks for key, rec in wrappers(cfg) if key.startswith("sampling.")):
        bad.append("sampling.arrol / latr / etmr / ec_tree (drive the trainer's backend directly)")
    opts = resolve(cfg, "objective")[1]
    if not all(hasattr(opts, k) for k in ("aggregation", "norm_constant", "count_empty_rows")):
        bad.append(f"objective.name = {cfg.objective.name!r} (no common.aggregate denominator)")
    for section in ("control", "advantage"):
        key, why = batch_statistics(cfg, section)
        if key:
            bad.append(f"{key} ({why}: every step would be computed twice)")
    if bad:
        raise UserError("train.async.periodic = true cannot stream with " + "; ".join(bad))


def batch_statistics(cfg, section: str) -> tuple[str | None, str]:
    """(the key naming it, why) when the section's strategy reads the whole batch (its record's
    ``batch_statistics``, or the option it names), else (None, "")."""
    part, opts, _ = resolve(cfg, section)
    flag = record(part).batch_statistics
    if isinstance(flag, str):
        if not getattr(opts if opts is not None else part.Options(), flag):
            return None, ""
        return (
            f"{section}.name = {getattr(cfg, section).name!r} with {section}.options.{flag} = true",
            "statistics over the whole batch",
        )
    if flag:
        why = (
            "statistics over the whole batch"
            if section == "advantage"
            else "changes or weighs the batch after the filters"
        )
        return f"{section}.name = {getattr(cfg, section).name!r}", why
    return None, ""


def check_plans_ahead(cfg) -> None:
    """η >= 1 draws plans k+1 .. k+η before step k's rounds, filters, ``observe`` and
    ``after_update``: refuse a controller that keeps per-plan state between them (its record's
    ``keeps_plan_state``, rollwise/control/__init__.py), also when dynamic sampling wraps it,
    and dynamic sampling's ``replace``, whose batch gate reads the prompts of the plan planned last."""
    eta, ctrl = cfg.train.async_.max_staleness, cfg.control
    if record(resolve(cfg, "control")[0]).keeps_plan_state:
        raise UserError(
            f"train.async.max_staleness = {eta} draws the next {eta} plan(s) before a step's rounds and observe, "
            f"which control.name = {ctrl.name!r} cannot do: it keeps per-plan state between plan and "
            "next_round/observe/after_update, so a step would top up, observe or credit a plan drawn after "
            "its own. Set train.async.max_staleness = 0 (or train.async.periodic = true), or use a controller "
            "that plans ahead (e.g. 'uniform')"
        )
    if ctrl.dynamic_sampling.enabled and ctrl.dynamic_sampling.type == "replace":
        raise UserError(
            f"train.async.max_staleness = {eta} draws plans ahead, which control.dynamic_sampling.type = 'replace' "
            "cannot do: its batch gate reads the prompts of the plan planned last, not of the plan trained. "
            "Set control.dynamic_sampling.type = 'refill' or train.async.max_staleness = 0"
        )


def corrects_off_policy(cfg) -> bool:
    """Whether the objective corrects rollouts drawn by an older policy. The rule: the objective
    reads the trainer's proximal recompute ``pi_prox`` (its options' ``needs_prox``): then its PPO
    ratio is ``pi_theta / pi_prox``, a trust region around the policy being updated, and the stale
    behaviour policy ``mu`` enters only through the bounded weight ``pi_prox / mu`` (AReaL's
    decoupled PPO, eq. 4-5; ``decoupled_ppo``, or any objective with ``objective.options.tis_level``
    other than 'off', including the token weight a sampler other than the trainer's forward turns
    on, ``rollwise.trainer.mismatch.default_tis``). Without it (``tis_level = 'off'``, slime's
    "bypass") the ratio is ``pi_theta / mu`` clipped around ``mu``: an importance ratio, but the
    trust region is centred on a policy up to η versions old, not on the one being updated: tokens
    the trainer has since moved past the clip range give no gradient, or (negative advantage,
    without ``dual_clip``) an unbounded ratio. That is not counted as a correction, so plain
    ``grpo``/``dapo``/``gspo``/... with ``tis_level = 'off'`` are refused with η >= 1 unless
    ``train.async.allow_uncorrected``."""
    return bool(objective_options(cfg).needs_prox)  # declared by every objective's options (ObjectiveOptions)


def check_corrected(cfg) -> None:
    """Stale rollouts (η >= 1) need an objective with an off-policy correction
    (:func:`corrects_off_policy`) unless ``train.async.allow_uncorrected``."""
    a = cfg.train.async_
    if a.allow_uncorrected or corrects_off_policy(cfg):
        return
    raise UserError(
        f"train.async.max_staleness = {a.max_staleness} trains rollouts up to {a.max_staleness} policy "
        f"version(s) old, and objective.name = {cfg.objective.name!r} with objective.options.tis_level = 'off' "
        "has no off-policy correction (its ratio is clipped around the stale sampler's log-probs). Set "
        "objective.name = 'decoupled_ppo', or objective.options.tis_level = 'token' (the behaviour weight "
        "pi_prox / mu), or train.async.allow_uncorrected = true to train them uncorrected"
    )


def check_data_parallel(cfg) -> None:
    """Data-parallel training (torchrun): its local check (torchrun's environment), then the parts
    that cannot run once per rank."""
    dp = POOLS.get("data_parallel")
    local_check(dp, cfg)  # torchrun's environment
    if not dp.enabled(cfg):
        return
    if cfg.distributed.workers > 0 and not record(POOLS.get("ray")).per_rank:
        raise UserError(
            f"distributed.workers = {cfg.distributed.workers} (Ray rollout workers) with data-parallel "
            "training (torchrun) is not supported: set distributed.workers = 0, or run one process"
        )
    if cfg.train.async_.on and not record(POOLS.get("periodic" if cfg.train.async_.periodic else "async")).per_rank:
        raise UserError(
            "train.async (a generator thread per process) with data-parallel training (torchrun) is not "
            "supported: set train.async.max_staleness = 0 and train.async.periodic = false, or run one process"
        )
    if not record(backend_part(cfg)).per_rank:
        raise UserError(
            f"model.backend = {cfg.model.backend!r} with data-parallel training (torchrun) is not supported (one "
            "engine per rank): set model.backend = 'hf', or run one process"
        )
    local_only = in_process_strategies(cfg)
    if local_only and not record(dp).decode_hooks:
        raise UserError(
            f"{', '.join(local_only)} drives the sampler in one process, which data-parallel training "
            "(torchrun) does not share across ranks; turn it off, or run one process"
        )


def check_fsdp(cfg) -> None:
    """FSDP2 training (``train.fsdp``, rollwise.trainer.fsdp) shards the training state of data-parallel
    ranks: it needs data-parallel training (torchrun), and a full fine-tune (not LoRA)."""
    if not cfg.train.fsdp:
        return
    if not POOLS.get("data_parallel").enabled(cfg):
        raise UserError(
            "train.fsdp = true shards the training state across torchrun's data-parallel ranks: start at least 2 "
            "processes (torchrun --nproc_per_node 2 -m rollwise.cli train ...), or set train.fsdp = false"
        )
    if cfg.model.lora.enabled:
        raise UserError(
            "train.fsdp = true with model.lora.enabled = true is not supported (LoRA trains adapters well under 1% "
            "of the weights, which need no sharding): set train.fsdp = false, or model.lora.enabled = false"
        )


def check_packing(cfg) -> None:
    """``train.packing = "on"`` needs a model whose logits are its LM head's output: a local model
    directory whose ``config.json`` sets a logit soft-cap or scale (``trainer.logit_transform``) is
    refused here, before it loads; the trainer refuses what only the loaded model shows
    (``trainer.packing_refusal``)."""
    if cfg.train.packing != "on":
        return
    import json
    from pathlib import Path

    config = Path(cfg.model.name).expanduser() / "config.json"
    if not config.is_file():  # a built-in tiny model, the SmolLM2 preset or a GGUF file: Llama-style
        return
    from rollwise.trainer.trainer import logit_transform

    try:
        key = logit_transform(json.loads(config.read_text()))
    except (OSError, ValueError, AttributeError):
        return  # an unreadable config.json fails where the model loads, with its own message
    if key is not None:
        raise UserError(
            f"train.packing = 'on' cannot apply to model {cfg.model.name!r}: its config.json sets {key}, so its "
            "logits are not the LM head's output and the trainer runs one full forward per row; set "
            "train.packing = 'auto' or 'off'"
        )


def check_sampler_entropy(cfg) -> None:
    """A part that reads the sampler's entropies (its record's ``entropy_option`` set to 'sampler')
    needs every engine that makes training rows to record them (hf does; vLLM, Ray workers and
    LATR trees do not): else step 0 would fail after the model loads."""
    part, opts, _ = resolve(cfg, "advantage")
    option = record(part).entropy_option
    if option is None or getattr(opts if opts is not None else part.Options(), option) != "sampler":
        return
    engines = [
        (f"model.backend = {cfg.model.backend!r}", "model.backend = 'hf'", record(backend_part(cfg))),
        *((key, "distributed.workers = 0", record(pool)) for key, pool in pools(cfg)[:1] if key != "local"),
        *((key, f"{key} = false", rec) for key, rec in wrappers(cfg)),
    ]
    for key, fix, rec in engines:
        if not rec.sampler_entropy:
            raise UserError(
                f"advantage.options.{option} = 'sampler' (advantage.name = {cfg.advantage.name!r}) reads the "
                f"sampler's entropies (Rollout.entropies), which {key} does not record; set "
                f"advantage.options.{option} = 'surprisal' or 'sampled_term', or {fix}"
            )


def check_engine_length(cfg, task, codec, positions: int | None) -> None:
    """With ``model.backend = 'vllm'``: refuse (before the warm start and the engine) a train or
    evaluated prompt whose tokens plus ``sampling.max_new_tokens`` exceed the engine's
    ``max_model_len`` (``model.vllm.max_model_len``, default from the model's ``positions``), which
    vLLM would raise on mid-run. Every train prompt and the evaluated held-out prompts are measured."""
    if engine_kind(cfg) != "vllm":  # the backend's declared engine (Compat.engine), not a probe
        return
    limit, new = backend_part(cfg).engine_length(cfg.model.vllm, positions), cfg.sampling.max_new_tokens
    from rollwise.eval.evaluate import heldout_subset

    prompts = [*task.train_prompts(), *heldout_subset(task.heldout_prompts(), cfg.eval.n_prompts)]
    longest, worst = max(((len(codec.encode_prompt(p)), p) for p in prompts), key=lambda x: x[0], default=(0, None))
    if longest + new > limit:
        cap = f" (at most the model's {positions} positions)" if positions else ""
        raise UserError(
            f"prompt {worst.id!r} has {longest} tokens, and with sampling.max_new_tokens = {new} it exceeds the vLLM "
            f"engine's max_model_len = {limit} (model.vllm.max_model_len); raise model.vllm.max_model_len "
            f"to {longest + new} or more{cap}, or lower sampling.max_new_tokens"
        )
