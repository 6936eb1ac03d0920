"""Name tables for pluggable stages (docs/architecture.md §3).

Each stage package owns one ``Registry``. Entries are objects or lazy ``"module:attr"`` strings
so heavy members import only when chosen. A name may carry an argument after a colon
(``"reasoning_gym:leg_counting"``, ``"jsonl:data/train.jsonl"``) when its entry accepts one, and
any ``"package.module:attr"`` string that is not a registered name loads a user plugin.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class UserError(Exception):
    """A mistake in the user's input (config, file, name). The CLI prints it without a traceback."""


@dataclass(frozen=True)
class Compat:
    """What one part of a run needs and supports, declared by the part (its class or function
    attribute ``compat``) and read only by :func:`rollwise.compat.check`, which derives every
    refusal between parts from these records before any model loads. A part without one declares
    the defaults: an engine that supports everything, a strategy that needs nothing.

    A rollout engine (a backend of ``backends.REGISTRY``, a pool of ``rollwise.compat.POOLS``):

    - ``decode_hooks``: rollouts come from the trainer's hf module in this process, so a rollout
      wrapper may drive it directly (decode hooks, scoring, its own generate calls);
    - ``sampler_entropy``: the rows it makes carry the sampler's entropies (``Rollout.entropies``)
      when the run asks for them;
    - ``per_rank``: it can run beside data-parallel training (one per torchrun process);
    - ``engine``: a backend's kind of engine, declared here once and read through
      ``rollwise.compat.engine_kind`` (never by comparing ``model.backend``): ``'trainer'`` (it samples
      with the trainer's own module and forward: hf), ``'vllm'`` (a vLLM engine beside the trainer, with
      its own share of device memory), ``'script'`` (the tests' scripted completions); a backend that
      declares none is ``'other'`` (neither the trainer's forward nor vLLM).

    A rollout wrapper (ARRoL, the LATR tree sampler, a replay source with ``wrap_pool``: APRIL,
    SPEC-RL), a controller, an advantage estimator or an objective:

    - ``needs_decode_hooks``: it drives the hf backend in the trainer's process;
    - ``owns_generation``: it makes the step's training rollouts itself (at most one such part);
    - ``entropy_option``: the option (an entropy flavour, ``objectives/signals.py``) whose value
      ``'sampler'`` makes it read ``Rollout.entropies``;
    - ``batch_statistics``: it reads the whole step's batch (batch normalisation, ``finish_batch``,
      ``weigh_advantages``), so periodic asynchrony cannot train the groups as they arrive; True, or
      the name of the boolean option that turns that on;
    - ``pairs_with``: ``(section, name)``, the one strategy of another section it works with (ADHint's
      controller and advantage, V0.5's advantage and controller, APRIL and the ``uniform`` controller);
    - ``needs_filter``: a group filter that must be in ``filter.names`` (SPEED's ``speed_complete``);
    - ``dynamic_sampling``: whether ``control.dynamic_sampling`` may wrap it: True, False, or the
      one ``control.dynamic_sampling.type`` it allows;
    - ``continues_prefixes``: a controller whose rounds continue prefixes of its own rollouts, so no
      other part may make the training rollouts.

    - ``needs_value``: it reads the pass-rate predictor (``value.enabled``, ``rollwise.value``): True,
      or ``(option, value)``, the option setting that turns that on.
    - ``replays_rows``: a replay source that trains a row again at a later step (rollout replay), so a
      value model keeps each row's POISE baseline (``ValueModel.freeze``);
    - ``independent_rows``: an advantage whose baseline for a row is read from the *other* rows of its
      group (POISE's cross-rollout value), unbiased only while those rows are sampled independently of
      the row and kept whatever its outcome: no shared prefixes, no rounds or group filters that
      follow outcomes (``rollwise.compat.check_independent_rows``).

    A task (its factory in ``tasks.REGISTRY``):

    - ``episodes``: its rollouts are multi-turn episodes (it makes environments; the episode pool,
      ``rollwise.generate.episodes``). The one declaration of that mode: the compatibility checks,
      the assembler's pool and warm start and the task wrappers read it (``record(factory).episodes``,
      ``rollwise.compat.declares_episodes``), nothing probes a task for it;
    - ``state_anchors``: its episodes' turns carry the environment state they acted on (``Turn.anchor``,
      ``rollwise/envs/tools.py``); False (``python_math``: an interpreter namespace) refuses GiGPO's
      step groups (``rollwise.compat.check_episode_credit``);
    - ``tools``: its episodes call tools whose failures a later turn may repair (CLEANER's splice,
      ``task.cleaner``, ``rollwise.compat.check_episode_transforms``);
    - ``demonstrations``: it gives every train prompt an expert trajectory (``demonstration(prompt)``),
      which UI-S1's semi-online replay follows (``task.semi_online``).
    - ``forkable``: its environments can be forked mid-episode (``forkable = True`` and ``fork()`` on the
      environment, ``rollwise/envs/base.py``), so ``sampling.branching`` may branch its episodes
      (``rollwise.generate.branching``); False refuses that option at load (``rollwise.compat.check_branching``).

    Planning ahead (``train.async.max_staleness`` = η >= 1, ``rollwise/control/__init__.py``):

    - ``plans_ahead``: a pool that draws the plans of later steps before the current step's rounds,
      ``observe`` and update have run, up to its staleness bound η (the asynchronous pool; at η = 0 it
      does not);
    - ``keeps_plan_state``: a controller whose ``select``/``plan`` write state that the same plan's
      later hooks read, so it cannot be planned ahead (refused with a pool that plans ahead).

    Both are read in one place, ``rollwise.compat.check_async``.

    An objective's off-policy correction is its options' ``needs_prox``
    (``rollwise.compat.corrects_off_policy``)."""

    decode_hooks: bool = True
    sampler_entropy: bool = True
    per_rank: bool = True
    engine: str = "other"
    needs_decode_hooks: bool = False
    owns_generation: bool = False
    entropy_option: str | None = None
    batch_statistics: bool | str = False
    pairs_with: tuple[str, str] | None = None
    needs_filter: str | None = None
    dynamic_sampling: bool | str = True
    needs_value: bool | tuple[str, str] = False
    continues_prefixes: bool = False
    independent_rows: bool = False
    replays_rows: bool = False
    episodes: bool = False
    state_anchors: bool = True
    tools: bool = False
    demonstrations: bool = False
    forkable: bool = False
    plans_ahead: bool = False
    keeps_plan_state: bool = False


NEUTRAL = Compat()


def record(part) -> Compat:
    """The part's compatibility record (``compat`` of a class or function, ``COMPAT`` of a module);
    a part without one declares the defaults (``NEUTRAL``)."""
    return getattr(part, "compat", None) or getattr(part, "COMPAT", None) or NEUTRAL


@dataclass(frozen=True)
class Resolved:
    name: str  # registered name (or the plugin path)
    obj: Any  # the class or function
    arg: str | None  # text after "name:" for parametrised entries


def load_attr(path: str) -> Any:
    module, _, attr = path.partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise UserError(f"cannot import module {module!r} for {path!r}: {e}") from None
    try:
        return getattr(mod, attr) if attr else mod
    except AttributeError:
        raise UserError(f"module {module!r} has no attribute {attr!r}") from None


class Registry:
    def __init__(self, family: str):
        self.family = family
        self._entries: dict[str, Any] = {}
        self._takes_arg: set[str] = set()
        self.hints: dict[str, str] = {}  # names people try that are not entries here, and what to write instead

    def register(self, name: str, obj: Any, *, takes_arg: bool = False) -> None:
        if name in self._entries:
            raise ValueError(f"{self.family} {name!r} is already registered")
        self._entries[name] = obj
        if takes_arg:
            self._takes_arg.add(name)

    def names(self) -> list[str]:
        return sorted(n + (":<arg>" if n in self._takes_arg else "") for n in self._entries)

    def resolve(self, name: str) -> Resolved:
        head, sep, arg = name.partition(":")
        if head in self._entries:
            if head in self._takes_arg and not arg:
                raise UserError(f"{self.family} {head!r} needs an argument: write '{head}:<value>'")
            if sep and head not in self._takes_arg:
                raise UserError(f"{self.family} {head!r} takes no argument (got {name!r})")
            obj = self._entries[head]
            if isinstance(obj, str):
                obj = load_attr(obj)
            return Resolved(head, obj, arg or None)
        if sep and "." in head:  # "package.module:attr" plugin
            return Resolved(name, load_attr(name), None)
        if head in self.hints:
            raise UserError(f"{self.family} {name!r} is not a {self.family} name: {self.hints[head]}")
        import difflib

        close = difflib.get_close_matches(head, list(self._entries), n=3, cutoff=0.6)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise UserError(f"unknown {self.family} {name!r}; known: {', '.join(self.names())}{hint}")

    def get(self, name: str) -> Any:
        return self.resolve(name).obj

    def __contains__(self, name: str) -> bool:
        try:
            self.resolve(name)
            return True
        except UserError:
            return False


def validate_options(family: str, name: str, obj: Any, options: dict) -> Any:
    """Validate an options table against ``obj.Options`` (a pydantic model), if it has one. An option
    listed in the model's ``renamed`` (old name -> new) is refused with a message naming the new name."""
    model = getattr(obj, "Options", None)
    if model is None:
        if options:
            raise UserError(f"{family} {name!r} takes no options (got {sorted(options)})")
        return None
    from pydantic import ValidationError

    for old, new in getattr(model, "renamed", {}).items():  # as config.RENAMED for the fixed keys
        if old in options:
            raise UserError(
                f"{family}.options.{old} was renamed {family}.options.{new} ({family} {name!r}): write {new} in "
                f"[{family}.options] of the config file or --set {family}.options.{new}=..."
            )
    try:
        return model.model_validate(options)
    except ValidationError as e:
        raise UserError(
            f"invalid options for {family} {name!r}:\n" + format_validation(e, f"{family}.options", model)
        ) from None


def format_validation(err: Any, prefix: str = "", model: Any = None) -> str:
    """One line per error, ``  key: message (got value)``. With the pydantic ``model`` that was
    validated, an unknown key gets the close matches among the valid keys at its place, or the
    list of valid keys ("train.stpes: unknown key; did you mean train.steps?")."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        key = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
        if e.get("type") == "extra_forbidden" and model is not None:
            lines.append(f"  {key}: unknown key; {suggest(model, [str(p) for p in e['loc']], prefix)}")
            continue
        lines.append(
            f"  {key}: {e['msg']}"
            + (f" (got {e['input']!r})" if "input" in e and not isinstance(e["input"], dict) else "")
        )
    return "\n".join(lines)


def keys(model: Any) -> dict[str, Any]:
    """The fields of a pydantic ``model`` by the key written in TOML and --set (the alias where a
    field has one, e.g. ``train.async`` for ``TrainConfig.async_``)."""
    return {f.alias or k: f for k, f in getattr(model, "model_fields", {}).items()}


def model_at(model: Any, path: list[str]) -> Any:
    """The pydantic model class of the section at ``path`` under ``model`` (None if not a section)."""
    import typing

    from pydantic import BaseModel

    for part in path:
        field = keys(model).get(part)
        if field is None:
            return None
        ann = field.annotation
        cands = [ann, *typing.get_args(ann)]
        model = next((c for c in cands if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return None
    return model


def suggest(model: Any, loc: list[str], prefix: str = "") -> str:
    """'did you mean a.b?' for the unknown key ``loc[-1]`` in the section ``loc[:-1]`` of
    ``model``, or 'valid: ...' when nothing is close."""
    import difflib

    section = model_at(model, loc[:-1])
    valid = sorted(keys(section))
    if not valid:
        return "this section takes no keys"
    where = ".".join(p for p in [prefix, *loc[:-1]] if p)
    close = difflib.get_close_matches(loc[-1], valid, n=3, cutoff=0.6)
    if close:
        return "did you mean " + " or ".join(f"{where}.{c}" if where else c for c in close) + "?"
    return f"valid keys{' of ' + where if where else ''}: {', '.join(valid)}"


Factory = Callable[..., Any]
