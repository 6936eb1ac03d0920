"""Sweep files for ``rollwise compare`` (docs/architecture.md §7): a base config, arms (each a set of
overrides), seeds and one budget shared by every arm.

```toml
name = "example"                      # default: the file's stem
base = "../configs/arith.toml"        # a config file (relative to this file), or an inline [base] table
seeds = [0, 1]
budget = { generated_tokens = 20000 } # or { rollouts = 2000 }: train.budget_* of every run
baseline = "grpo"                     # default: the first arm
# target = "gain:0.75"                # the default: start + 0.75 x (final - start) of the baseline's mean
#                                     # held-out curve; or an absolute pass@1, target = 0.6
# out_dir = "runs/compare/example"    # default: runs/compare/<name>
# runs_dir = "runs/compare/shared"     # default: out_dir; sweeps sharing it reuse identical runs
set = { "eval.every" = 10 }           # overrides for every arm

[[arms]]
name = "grpo"

[[arms]]
name = "dapo-filter"
set = { "filter.names" = ["zero_variance"] }
```

``set`` tables map dotted keys to values, exactly like ``--set key=value``: each entry replaces
the value at its path. Unquoted dotted keys (``set.control.name = "x"``) nest in TOML and are
flattened back to paths, except below an ``options`` key, whose table is taken whole.

``plan(sweep)`` builds and validates every arm × seed ``Config`` with ``load_config`` before any
run starts, so an unknown key or strategy fails early, naming the arm and the key. The runner owns
``run.dir``, ``run.name``, ``run.seed``, ``run.overwrite`` and ``train.budget_*``; setting them in
``set`` is an error (a base config file may hold them: they are replaced).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from rollwise.bench.analysis import DEFAULT_TARGET, target_rule
from rollwise.registry import UserError, format_validation

RESERVED = (
    "run.dir",
    "run.name",
    "run.seed",
    "run.overwrite",
    "train.budget_generated_tokens",
    "train.budget_rollouts",
)
SHARED_SECTIONS = ("task", "eval")  # every arm is evaluated on the same held-out prompts the same way
# Task keys that change only how *training* episodes are made (evaluation always runs the task's own
# environment to task.max_turns), or only when episodes run and which share a backend call (the schedule
# and the environment slots, rollwise.generate.rollout_wise: the same episodes, verified the same way):
# arms may differ in them, as they may in any training strategy.
TRAINING_ONLY_TASK_KEYS = frozenset(
    {"turn_budget", "cleaner", "semi_online", "high_entropy_turns", "episode_schedule", "env_slots"}
)
# Paired seeds (issue #43): a seed fixes the warm start (the model and model.warm_start, seeded by
# model.warm_start.seed, not run.seed), the held-out set and the train pool (task), and the order in
# which the prompt stream visits the pool (run.seed); arms that share a seed must share all of them.
PAIRED_KEYS = ("model.name", "model.warm_start")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Budget(_Model):
    generated_tokens: int | None = Field(
        None,
        ge=1,
        description="Training generated tokens per run (cost/generated_tokens); sets train.budget_generated_tokens.",
    )
    rollouts: int | None = Field(
        None, ge=1, description="Training rollouts per run (cost/rollouts); sets train.budget_rollouts."
    )

    @model_validator(mode="after")
    def _exactly_one(self):
        if (self.generated_tokens is None) == (self.rollouts is None):
            raise ValueError("give exactly one of budget.generated_tokens and budget.rollouts")
        return self

    @property
    def unit(self) -> str:
        return "generated_tokens" if self.generated_tokens is not None else "rollouts"

    @property
    def amount(self) -> int:
        return self.generated_tokens if self.generated_tokens is not None else self.rollouts

    def overrides(self) -> dict[str, int]:
        return {f"train.budget_{self.unit}": self.amount}


class Arm(_Model):
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        max_length=64,
        description="Arm name (letters, digits, '_', '.', '-'); its runs are <out_dir>/<name>-s<seed>.",
    )
    set: dict[str, Any] = Field(
        default_factory=dict, description='Dotted config overrides of this arm, e.g. {"control.name" = "uniform"}.'
    )
    description: str = Field("", description="One line shown in the report.")


class Sweep(_Model):
    name: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="Sweep name (default: the file's stem)."
    )
    base: str | dict[str, Any] = Field(
        default_factory=dict,
        description="Base config: a TOML config file path relative to the sweep "
        "file, or an inline table of dotted overrides of the defaults.",
    )
    set: dict[str, Any] = Field(
        default_factory=dict, description="Dotted overrides applied to every arm, after the base."
    )
    arms: list[Arm] = Field(min_length=1, description="The strategies compared ([[arms]] tables).")
    seeds: list[int] = Field(
        default_factory=lambda: [0], min_length=1, description="run.seed values; every arm runs every seed."
    )
    budget: Budget = Field(description="The one budget shared by all arms: {generated_tokens = N} or {rollouts = N}.")
    baseline: str | None = Field(None, description="Arm that ratios are relative to (default: the first arm).")
    target: float | str = Field(
        DEFAULT_TARGET,
        description="Held-out pass@1 target for tokens/seconds-to-target, fixed before the sweep runs: an absolute "
        "pass@1 in [0, 1] (0.4) or 'gain:F', start + F x (final - start) of the baseline arm's mean held-out curve "
        "with 0 < F <= 1 (default 'gain:0.75'; 'gain:1' is the baseline's final mean pass@1).",
    )
    out_dir: str | None = Field(
        None,
        description="Directory of the runs and the report (default runs/compare/<name>; "
        "relative to the working directory).",
    )
    runs_dir: str | None = Field(
        None,
        description="Directory of the runs (default: out_dir). Sweeps that share it share "
        "their runs: a run whose arm name, seed and resolved config match is reused, not trained again (whatever "
        "commit made it: compare.json lists each run's commit).",
    )
    jobs: int = Field(
        1,
        ge=1,
        description="Runs trained at once in separate processes (1 = one after another; wall-clock "
        "figures are only comparable between runs that shared the machine the same way).",
    )

    _source: Path | None = PrivateAttr(None)

    @field_validator("target", mode="before")
    @classmethod
    def _target(cls, v):
        """Refused at load (naming ``target``), not after the runs: ``analysis.target_rule`` reads it."""
        kind, number = target_rule(v)
        return number if kind == "absolute" else f"gain:{number:g}"

    @model_validator(mode="after")
    def _names(self):
        names = [a.name for a in self.arms]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"arm names must be unique; repeated: {dup}")
        if self.baseline is not None and self.baseline not in names:
            raise ValueError(f"baseline {self.baseline!r} is not an arm; arms: {names}")
        if len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0:
            raise ValueError(f"seeds must be distinct and >= 0 (got {self.seeds})")
        return self

    @property
    def baseline_arm(self) -> str:
        return self.baseline or self.arms[0].name

    def sweep_name(self) -> str:
        return self.name or (self._source.stem if self._source else "sweep")

    def default_out_dir(self) -> Path:
        return Path(self.out_dir) if self.out_dir else Path("runs") / "compare" / self.sweep_name()


def load_sweep(path: str | Path, overrides: list[str] | None = None) -> Sweep:
    """Read and validate a sweep file; ``overrides`` (``key=value`` strings) join its ``set``."""
    from rollwise.config import parse_override, read_toml

    path = Path(path)
    raw = read_toml(path)
    try:
        sweep = Sweep.model_validate(raw)
    except ValidationError as e:
        raise UserError(f"invalid sweep file {path}:\n" + format_validation(e)) from None
    sweep._source = path
    for text in overrides or []:
        keys, value = parse_override(text)
        sweep.set[".".join(keys)] = value
    return sweep


def flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}, 'c.d': 2, 'x': {'options': {'k': 1}}} -> {'a.b': 1, 'c.d': 2, 'x.options': {'k': 1}}."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and key.split(".")[-1] != "options":
            out.update(flatten(value, path))
        else:
            out[path] = value
    return out


def set_path(data: dict, dotted: str, value: Any) -> None:
    node = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise UserError(f"override {dotted!r}: {part!r} is not a section")
    node[parts[-1]] = copy.deepcopy(value)


def base_data(sweep: Sweep) -> dict:
    """The base config as a nested dict (a config file's contents, or the inline table applied to {})."""
    from rollwise.config import read_toml

    if isinstance(sweep.base, str):
        root = sweep._source.parent if sweep._source else Path(".")
        return read_toml(root / sweep.base)
    data: dict = {}
    for key, value in flatten(sweep.base).items():
        set_path(data, key, value)
    return data


@dataclass
class RunSpec:
    """One arm × seed run: its validated config (``run.dir``/``run.name``/``run.seed`` and budget set)."""

    arm: str
    seed: int
    cfg: Any  # rollwise.config.Config

    @property
    def name(self) -> str:
        return f"{self.arm}-s{self.seed}"

    @property
    def dir(self) -> Path:
        return self.cfg.run_dir()


def plan(sweep: Sweep, out_dir: Path | None = None) -> list[RunSpec]:
    """Every arm × seed config, validated (no model is loaded). Raises ``UserError`` naming the arm
    and the key for unknown keys, bad values, unknown strategies, runner-owned keys in ``set``, and
    arms that differ in the shared sections (task, eval) or skip the evaluation at step 0."""
    from rollwise.config import load_config

    out_dir = Path(out_dir) if out_dir is not None else sweep.default_out_dir()
    runs_dir = Path(sweep.runs_dir) if sweep.runs_dir else out_dir
    base = base_data(sweep)
    common = flatten(sweep.set)
    specs: list[RunSpec] = []
    for arm in sweep.arms:
        arm_set = flatten(arm.set)
        for where, table in (("set", common), (f"arms[{arm.name!r}].set", arm_set)):
            bad = sorted(k for k in table if any(k == r or r.startswith(k + ".") for r in RESERVED))
            if bad:
                raise UserError(
                    f"sweep {where}: {bad} are set by rollwise compare (run directory, seed, budget); remove them"
                )
        for seed in sweep.seeds:
            data = copy.deepcopy(base)
            for key, value in {**common, **arm_set}.items():
                set_path(data, key, value)
            train = data.setdefault("train", {})
            if isinstance(train, dict):  # a base file's own budget gives way to the sweep's
                train.pop("budget_generated_tokens", None), train.pop("budget_rollouts", None)
            runner_keys = {
                "run.dir": runs_dir.as_posix(),
                "run.name": f"{arm.name}-s{seed}",
                "run.seed": seed,
                "run.overwrite": False,
                **sweep.budget.overrides(),
            }
            for key, value in runner_keys.items():
                set_path(data, key, value)
            try:
                cfg = load_config(data=data)
            except UserError as e:
                raise UserError(f"sweep arm {arm.name!r}: {e}") from None
            specs.append(RunSpec(arm.name, seed, cfg))
    _check_comparable(specs)
    # seed-major (s0 of every arm, then s1, ...): runs train in this order, so a sweep stopped part-way
    # leaves whole seeds, paired across arms, rather than every seed of the first arms and none of the rest
    specs.sort(key=lambda s: sweep.seeds.index(s.seed))
    return specs


def _check_comparable(specs: list[RunSpec]) -> None:
    ref = specs[0]
    for s in specs:
        if not s.cfg.eval.at_start:
            raise UserError(
                f"sweep arm {s.arm!r}: eval.at_start must be true (every curve starts at 0 generated tokens)"
            )
        for section in SHARED_SECTIONS:
            a, b = getattr(ref.cfg, section).model_dump(), getattr(s.cfg, section).model_dump()
            if section == "task":
                a, b = ({k: v for k, v in d.items() if k not in TRAINING_ONLY_TASK_KEYS} for d in (a, b))
            if a != b:
                keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
                raise UserError(
                    f"sweep arms {ref.arm!r} and {s.arm!r} differ in {', '.join(f'{section}.{k}' for k in keys)}; "
                    f"all arms must share the [{section}] section to be comparable"
                )
        a, b = _paired_part(ref.cfg), _paired_part(s.cfg)
        if a != b:
            keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            raise UserError(
                f"sweep arms {ref.arm!r} and {s.arm!r} differ in {', '.join(keys)}; arms that share a seed must "
                "share its warm start (the seeds are paired: each arm's ratio to the baseline is taken seed by seed)"
            )


def _paired_part(cfg) -> dict:
    """The flattened ``PAIRED_KEYS`` of a config ({"model.name": ..., "model.warm_start.steps": ...})."""
    out = {}
    for key in PAIRED_KEYS:
        node = cfg
        for part in key.split("."):
            node = getattr(node, part)
        out.update(flatten({key: node.model_dump(mode="json")}) if hasattr(node, "model_dump") else {key: node})
    return out
