"""``reasoning_gym:<dataset>``: any procedural dataset of reasoning-gym as a task.

Contract:

- Construction checks the dataset name (unknown -> ``UserError`` listing close matches) and the
  ``config`` options (unknown keys or values the dataset's config rejects -> ``UserError``), by
  building the reasoning-gym dataset objects, which is cheap. Entries are generated on first use
  of a split (some generators are slow) and cached.
- Train: ``size`` entries, indices 0..size-1 of the dataset seeded with ``seed``.
- Held-out: ``heldout_size`` entries from the same dataset seeded with ``seed + 1_000_000_000``
  (far from the train seeds: many generators seed entry i with ``seed + i``), skipping any entry
  whose question is a train question or an earlier held-out question. If too few distinct
  questions exist, using the split raises ``UserError``.
- Prompts: ``text`` is the question, ``messages`` the chat form (system prompt, if any, then the
  question), ``answer`` the entry's answer, ``metadata`` ``{"dataset", "config", "entry"}`` (what
  ``rollwise.verify.reasoning_gym`` needs). Ids: ``reasoning_gym:<dataset>/train/<i>`` and
  ``.../heldout/<i>``, with i the index in the seeded dataset.
- ``system_prompt`` is a name from ``reasoning_gym.utils.SYSTEM_PROMPTS`` (``"default"``,
  ``"DeepSeekZero"``, ``"simple"``, ``"direct"``, ``"chain_of_draft"``), any other text used as
  is, or ``""`` for none. The shipped ones ask for the answer inside ``<answer></answer>``.
- ``sft_examples``: the target is ``<answer>ANSWER</answer>`` (reasoning-gym has reference
  answers, not worked solutions), enough to teach the answer format.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rollwise.registry import UserError
from rollwise.tasks._common import chat, coerce_options, sample_prompts
from rollwise.types import Prompt, Verdict
from rollwise.verify import reasoning_gym as rg_verify

HELDOUT_SEED_OFFSET = 1_000_000_000
HELDOUT_TRIES = 4  # look at up to 4 * heldout_size + 100 candidates for distinct questions


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    size: int = Field(default=1000, ge=1, le=1_000_000, description="number of train entries")
    heldout_size: int = Field(default=100, ge=1, le=100_000, description="number of held-out entries")
    seed: int = Field(default=0, ge=0, description="seed of the train split (held-out uses seed + 1e9)")
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="options passed to reasoning_gym.create_dataset (difficulty ranges etc.); not seed or size",
    )
    system_prompt: str = Field(
        default="default",
        description="a reasoning_gym SYSTEM_PROMPTS name (default, DeepSeekZero, simple, direct, "
        "chain_of_draft), literal text, or '' for no system message",
    )


class ReasoningGymTask:
    """See the module docstring."""

    def __init__(self, dataset: str, options: _Options):
        import reasoning_gym
        from reasoning_gym.factory import DATASETS
        from reasoning_gym.utils import SYSTEM_PROMPTS

        self.dataset = dataset
        self.name = f"reasoning_gym:{dataset}"
        self.options = options
        if dataset not in DATASETS:
            close = difflib.get_close_matches(dataset, list(DATASETS), n=5, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(sorted(DATASETS))}"
            raise UserError(f"unknown reasoning-gym dataset {dataset!r}; {hint}")
        self.config = dict(options.config)
        valid = {f.name for f in dataclasses.fields(DATASETS[dataset][1])} - {"seed", "size"}
        bad = sorted(set(self.config) - valid)
        if bad:
            raise UserError(
                f"task {self.name!r}: unknown config key(s) {bad} "
                f"(set seed and size with the task options); valid: {', '.join(sorted(valid))}"
            )
        self.system_prompt = SYSTEM_PROMPTS.get(options.system_prompt, options.system_prompt) or None
        built = _composite_specs(self.config) if dataset == "composite" else self.config
        try:
            self._train_ds = reasoning_gym.create_dataset(dataset, **built, seed=options.seed, size=options.size)
            self._heldout_ds = reasoning_gym.create_dataset(
                dataset,
                **built,
                seed=options.seed + HELDOUT_SEED_OFFSET,
                size=HELDOUT_TRIES * options.heldout_size + 100,
            )
        except Exception as e:  # the dataset's own validation (assertions, type errors)
            raise UserError(f"task {self.name!r}: invalid config {self.config}: {type(e).__name__}: {e}") from None

    def _prompt(self, split: str, i: int, entry: dict) -> Prompt:
        return Prompt(
            id=f"{self.name}/{split}/{i}",
            task=self.name,
            text=entry["question"],
            answer=None if entry.get("answer") is None else str(entry["answer"]),
            messages=chat(entry["question"], self.system_prompt),
            metadata={"dataset": self.dataset, "config": self.config, "entry": entry},
        )

    @functools.cached_property
    def _train(self) -> tuple[Prompt, ...]:
        return tuple(self._prompt("train", i, self._train_ds[i]) for i in range(self.options.size))

    @functools.cached_property
    def _heldout(self) -> tuple[Prompt, ...]:
        seen = {p.text for p in self._train}
        out: list[Prompt] = []
        for i in range(len(self._heldout_ds)):
            entry = self._heldout_ds[i]
            if entry["question"] not in seen:
                seen.add(entry["question"])
                out.append(self._prompt("heldout", i, entry))
                if len(out) == self.options.heldout_size:
                    return tuple(out)
        raise UserError(
            f"task {self.name!r}: found only {len(out)} held-out questions distinct from the "
            f"{self.options.size} train ones (wanted {self.options.heldout_size}); lower size or "
            "heldout_size, or widen the dataset's config"
        )

    def train_prompts(self) -> Sequence[Prompt]:
        return self._train

    def heldout_prompts(self) -> Sequence[Prompt]:
        return self._heldout

    def verify(self, prompt: Prompt, completion: str) -> Verdict:
        return rg_verify.verify(prompt, completion, score_fn=self._train_ds.score_answer)

    def sft_examples(self, n: int, seed: int) -> list[tuple[Prompt, str]]:
        """``n`` (prompt, ``<answer>ANSWER</answer>``) pairs from the train split, drawn by ``seed``."""
        with_answer = [p for p in self._train if p.answer is not None]
        return [(p, f"<answer>{p.answer}</answer>") for p in sample_prompts(with_answer, n, seed)]


def _composite_specs(config: dict) -> dict:
    """``reasoning_gym:composite`` (a weighted mixture of datasets): the config's ``datasets`` is a
    list of tables ``{name, weight, config}`` in TOML; reasoning-gym wants ``DatasetSpec`` objects.
    A row that is not such a table raises ``UserError`` naming its index."""
    from reasoning_gym.composite import DatasetSpec

    specs = []
    for i, row in enumerate(config.get("datasets") or []):
        if not isinstance(row, dict) or "name" not in row:
            raise UserError(
                f"task 'reasoning_gym:composite': config.datasets[{i}] must be a table with name, weight and "
                f"config (got {row!r})"
            )
        specs.append(
            DatasetSpec(name=row["name"], weight=float(row.get("weight", 1.0)), config=dict(row.get("config") or {}))
        )
    return {**config, "datasets": specs}


def make(arg: str | None, options=None) -> ReasoningGymTask:
    """Task factory: ``reasoning_gym:<dataset>``."""
    if not arg:
        raise UserError("task 'reasoning_gym' needs a dataset: write 'reasoning_gym:<dataset>'")
    return ReasoningGymTask(arg, coerce_options(make.Options, options, f"reasoning_gym:{arg}"))


make.Options = _Options
