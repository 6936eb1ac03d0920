"""Typed configuration (docs/architecture.md §6): pydantic models, one section per stage, loaded from TOML
and overridden with ``section.key=value`` strings. Defaults live only in the section models. ``load_config``
rejects unknown keys, bad values, unknown strategy names and invalid strategy options before
any model is loaded, naming the key and the valid choices.

This module assembles ``Config`` from the sections (``rollwise.sections.<section>``: each section's models, the
option schemas of its fixed features and its own refusals, beside each other) and loads it; it re-exports every
section model, so ``from rollwise.config import ArrolOptions`` keeps working. It is the schema and imports no
strategy module: the options of features that have a fixed section (``sampling.arrol``, ``batch.d3s``,
``reward.ttrl``, ``model.warm_start.otr``, ``train.ess_lr_scaling``) are defined in their section and the
strategy modules alias them (strategy -> config, never config -> strategy). The ``options`` of a
named strategy (``control.options``, ``advantage.options``, ...) and the FAPO detector are
validated through the registries by ``rollwise.compat.check``, which ``load_config`` calls
after the schema, together with every refusal between parts (the compatibility table).
``train.async`` is the field ``TrainConfig.async_`` (``async`` is a Python keyword) with the
alias ``async``: TOML, ``--set`` and dumps write ``train.async``; Python reads ``cfg.train.async_``.
Renamed keys are refused naming the new key: fixed keys in ``RENAMED`` here, a strategy's options in its
``Options.renamed`` (``rollwise.registry.validate_options``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import tomllib
from pydantic import Field, PrivateAttr, ValidationError, model_validator

from rollwise.registry import UserError, format_validation
from rollwise.sections import Section, StrategyConfig, place
from rollwise.sections.advantage import AdvantageConfig
from rollwise.sections.batch import BatchConfig, D3SConfig, D3SOptions
from rollwise.sections.control import ControlConfig, DynamicSamplingConfig
from rollwise.sections.distributed import DistributedConfig
from rollwise.sections.eval import EvalConfig
from rollwise.sections.filter import FilterConfig
from rollwise.sections.model import LoraConfig, ModelConfig, OtrOptions, VllmConfig, WarmStartConfig
from rollwise.sections.objective import ObjectiveConfig
from rollwise.sections.replay import ReplayConfig
from rollwise.sections.reward import (
    FapoConfig,
    KlInRewardConfig,
    OverlongPenaltyConfig,
    RewardConfig,
    TtrlConfig,
    TtrlOptions,
)
from rollwise.sections.run import RunConfig
from rollwise.sections.sampling import (
    ArrolConfig,
    ArrolOptions,
    EcTreeConfig,
    EtmrConfig,
    SamplingConfig,
    TreeSamplingConfig,
)
from rollwise.sections.task import TaskConfig
from rollwise.sections.train import AsyncConfig, EssLrScalingConfig, EssOptions, GapGuardConfig, TrainConfig
from rollwise.sections.value import ValueConfig

__all__ = [
    "AdvantageConfig",
    "ArrolConfig",
    "ArrolOptions",
    "AsyncConfig",
    "BatchConfig",
    "EcTreeConfig",
    "EtmrConfig",
    "Config",
    "ControlConfig",
    "D3SConfig",
    "D3SOptions",
    "DistributedConfig",
    "DynamicSamplingConfig",
    "EssLrScalingConfig",
    "EssOptions",
    "EvalConfig",
    "FapoConfig",
    "FilterConfig",
    "GapGuardConfig",
    "KlInRewardConfig",
    "LoraConfig",
    "ModelConfig",
    "ObjectiveConfig",
    "OtrOptions",
    "OverlongPenaltyConfig",
    "ReplayConfig",
    "RewardConfig",
    "RunConfig",
    "SamplingConfig",
    "Section",
    "StrategyConfig",
    "TaskConfig",
    "TrainConfig",
    "TreeSamplingConfig",
    "TtrlConfig",
    "TtrlOptions",
    "ValueConfig",
    "VllmConfig",
    "WarmStartConfig",
    "RENAMED",
    "apply_overrides",
    "check_renamed",
    "load_config",
    "parse_override",
    "read_toml",
    "to_toml",
]


class Config(Section):
    _derived: dict = PrivateAttr(default_factory=dict)  # key -> "value from why" (rollwise.defaults.resolve)
    run: RunConfig = Field(default_factory=RunConfig, description="Run directory, seed, checkpoints.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy model.")
    task: TaskConfig = Field(default_factory=TaskConfig, description="Prompt source and verifier.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Rollout sampling.")
    control: ControlConfig = Field(
        default_factory=ControlConfig, description="Prompt selection and rollout allocation."
    )
    filter: FilterConfig = Field(default_factory=FilterConfig, description="Group filters.")
    replay: ReplayConfig = Field(default_factory=ReplayConfig, description="Replay source.")
    reward: RewardConfig = Field(
        default_factory=RewardConfig, description="Reward shaping before advantages (verified rollouts only)."
    )
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig, description="Advantage estimator.")
    batch: BatchConfig = Field(
        default_factory=BatchConfig,
        description="The trainer's batch after advantages: D3S row and token down-sampling.",
    )
    objective: ObjectiveConfig = Field(default_factory=ObjectiveConfig, description="Policy objective.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Optimizer and steps.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")
    distributed: DistributedConfig = Field(
        default_factory=DistributedConfig, description="Rollout workers (local pool or Ray actors)."
    )
    value: ValueConfig = Field(default_factory=ValueConfig, description="Pass-rate predictor (off by default).")

    @model_validator(mode="after")
    def _control_knows_max_new_tokens(self):
        self.control._max_new_tokens = self.sampling.max_new_tokens
        place(self)  # an assignment's error names the whole key (train.steps)
        return self

    def run_name(self) -> str:
        """``run.name``, or the default ``<task>-<model>-<controller>-<objective>-s<seed>`` (e.g.
        ``arithmetic-tiny-uniform-grpo-s0``, ``rg.chain_sum-smollm2-135m-dars-dapo-s1``,
        ``jsonl.mydata-tiny-uniform-grpo-s0``); ``with_run_name`` makes a default name unique."""
        if self.run.name:
            return self.run.name
        head, _, arg = self.task.name.partition(":")
        task = {"reasoning_gym": "rg"}.get(head, head.rsplit(".", 1)[-1]) + (f".{Path(arg).stem}" if arg else "")
        parts = (
            task,
            Path(self.model.name).stem or self.model.name,
            self.control.name.rsplit(":", 1)[-1],
            self.objective.name.rsplit(":", 1)[-1],
            f"s{self.run.seed}",
        )
        return "-".join(re.sub(r"[^A-Za-z0-9_.]+", "_", p).strip("_.") or "x" for p in parts)

    def run_dir(self) -> Path:
        return Path(self.run.dir) / self.run_name()

    def with_run_name(self) -> Config:
        """This config with ``run.name`` set: itself if set, else the default name, or, when a run
        directory of that name already holds files, the first free ``<name>-2``, ``<name>-3``, ...
        (a default name never reuses an existing run)."""
        if self.run.name:
            return self
        base, n = self.run_name(), 1
        name = base
        while (Path(self.run.dir) / name).is_dir() and any(
            p.name != ".lock" for p in (Path(self.run.dir) / name).iterdir()
        ):
            n += 1
            name = f"{base}-{n}"
        return self.model_copy(update={"run": self.run.model_copy(update={"name": name})})


# ---------------------------------------------------------------- loading


def parse_override(text: str) -> tuple[list[str], Any]:
    """'a.b=value' -> (['a', 'b'], value); the value is read as TOML, else kept as a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"bad override {text!r}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return [p for p in key.strip().split(".")], value


def _wants_text(path: list[str]) -> bool:
    """True when the field at ``path`` is a plain string field (``run.name``, ``task.name``):
    ``--set run.name=2024`` then means the text "2024", not the integer TOML reads."""
    import typing

    from rollwise.registry import keys, model_at

    section = model_at(Config, path[:-1])
    field = keys(section).get(path[-1]) if section is not None else None
    if field is None:
        return False
    args = typing.get_args(field.annotation)
    return field.annotation is str or (bool(args) and str in args and all(a in (str, type(None)) for a in args))


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for text in overrides:
        path, value = parse_override(text)
        if not isinstance(value, str) and not isinstance(value, (dict, list)) and _wants_text(path):
            value = text.partition("=")[2].strip()
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UserError(f"override {text!r}: {part!r} is not a section")
        node[path[-1]] = value
    return data


def read_toml(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"config file not found: {p}")
    try:
        return tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"config file {p} is not valid TOML: {e}") from None


# Keys renamed so that each feature's config section, module folder and metric prefix use one word
# (LATR: sampling.latr, rollwise.generate.latr, latr/*; D3S: batch.d3s, rollwise.batch.d3s, d3s/*).
RENAMED = {"sampling.tree": "sampling.latr", "filter.d3s": "batch.d3s"}


def check_renamed(raw: dict) -> None:
    """``UserError`` naming the new key when a config file, ``data`` or a --set override uses a
    key listed in ``RENAMED``."""
    for old, new in RENAMED.items():
        node = raw
        for part in old.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            raise UserError(f"{old} was renamed {new}: write [{new}] in the config file or --set {new}.<key>=...")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, data: dict | None = None) -> Config:
    """Build a validated ``Config`` from a TOML file, a dict and ``section.key=value`` overrides."""
    raw = dict(data or {})
    if path is not None:
        raw = read_toml(path) | raw
    raw = apply_overrides(raw, list(overrides or []))
    check_renamed(raw)
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as e:
        raise UserError("invalid configuration:\n" + format_validation(e, model=Config)) from None
    check_strategies(cfg)
    return cfg


def check_strategies(cfg: Config) -> None:
    """Resolve every strategy name, validate its options and refuse parts that cannot be combined
    (``rollwise.compat.check``: strategies reached through their registries, no models)."""
    from rollwise import compat

    compat.check(cfg)


def to_toml(cfg: Config) -> str:
    import tomli_w

    head = "".join(f"# derived: {k} = {why}\n" for k, why in getattr(cfg, "_derived", {}).items())
    return (head + "\n" if head else "") + tomli_w.dumps(cfg.model_dump(mode="json", exclude_none=True))
