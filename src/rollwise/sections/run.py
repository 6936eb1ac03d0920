"""The ``run`` section: run directory, seed, checkpoints, trackers (``rollwise.session``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollwise.sections import Section


class RunConfig(Section):
    name: str | None = Field(
        None,
        description="Run name; the run directory is <dir>/<name>. Default: "
        "<task>-<model>-<controller>-<objective>-s<seed>, with -2, -3, ... added when a run of that name exists (an "
        "explicit name is never reused: --resume continues it).",
    )
    dir: str = Field("runs", description="Parent directory of run directories.")
    seed: int = Field(0, ge=0, description="Seed for model init, prompt order and sampling.")
    checkpoint_every: int = Field(100, ge=0, description="Save a checkpoint every N steps (0: only at the end).")
    keep_checkpoints: int = Field(
        2,
        ge=1,
        description="How many most recent checkpoints to keep (older ones are deleted once a "
        "new one is complete and verified on disk).",
    )
    report_to: list[Literal["tensorboard", "wandb", "mlflow", "trackio"]] = Field(
        default_factory=list,
        description="Experiment trackers that get every metrics.jsonl / eval.jsonl scalar (against step "
        "and generated tokens) and the config, as HF TrainingArguments.report_to; each an optional extra "
        "(pip install 'rollwise[track]'); see rollwise.trackers.",
    )
    threads: int | None = Field(None, ge=1, description="torch CPU threads (default: all cores).")
    overwrite: bool = Field(False, description="Replace an existing run directory instead of refusing.")
    progress: bool = Field(True, description="Show a progress bar.")
    force: bool = Field(
        False,
        description="Train even when the first step's probe would stop the run: more than half of "
        "the completions cut at sampling.max_new_tokens (pretrained models), or a measured step time that "
        "puts the remaining steps past 24 h (rollwise.defaults.probe).",
    )
