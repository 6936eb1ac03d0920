"""``dataset:<handle>``: the rows and reward functions given to the Python API (``rollwise.train(dataset=...,
reward_funcs=...)``, ``rollwise.api``; issue #46), in TRL's dataset format.

Contract:

- Rows are a ``datasets.Dataset``, a list of dicts, or a path to a JSON-lines file. Each row has a
  ``prompt``: a non-empty string (TRL's *standard* format) or a non-empty list of chat messages
  (``{"role": ..., "content": ...}``, TRL's *conversational* format). Its other columns are handed
  to the reward functions as keyword lists (a column a row lacks: None). Every row is checked when
  the rows are read; a mistake raises ``UserError`` naming the row (numbered from 1) and the column.
- The rows live in this Python process only (a table keyed by the handle that ``register``
  returns): ``task.name = "dataset:<handle>"`` names them, and the factory refuses a handle it does
  not hold (another process: Ray workers, ``rollwise eval`` from the command line) with that reason.
  ``rollwise.api`` refuses ``distributed.workers`` before that.
- Held-out split: the API's ``eval_dataset`` when given, else ``options.heldout_fraction`` of the
  distinct prompts drawn by ``options.seed`` (``tasks._common.holdout_questions``, as ``jsonl:``).
- Prompts: ``text`` the prompt string, or the last user message's content for a conversational row
  (what a model without a chat template sees); ``messages`` the conversation. Ids
  ``dataset:<handle>/row-<n>`` (``eval-row-<n>`` for ``eval_dataset``).
- ``verify``: the reward functions (``rollwise.verify.functions.RewardFunctions``) on the row's
  prompt, the completion and the row's other columns.
- ``sft_examples`` raises NotImplementedError (no reference completions: the built-in tiny model's
  warm start is skipped).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rollwise.registry import UserError
from rollwise.tasks._common import coerce_options, holdout_questions, prompts_digest
from rollwise.types import Prompt, Verdict
from rollwise.verify.functions import RewardFunctions

PROMPT = "prompt"  # TRL's column name


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    heldout_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="share of distinct prompts held out when no eval_dataset is given"
    )
    seed: int = Field(0, ge=0, description="seed of the held-out draw")


@dataclass(frozen=True)
class Rows:
    """Checked rows of one dataset: ``label`` is what errors call it (``dataset``, a file name)."""

    label: str
    rows: tuple[dict[str, Any], ...]


def read_rows(data: Any, label: str) -> Rows:
    """The rows of ``data`` (a ``datasets.Dataset``, a list of dicts, a JSON-lines path), checked."""
    if isinstance(data, (str, Path)):
        return _check(_read_jsonl(Path(data)), str(data))
    if type(data).__name__ in ("DatasetDict", "IterableDatasetDict"):
        raise UserError(f"{label}: a DatasetDict has splits {sorted(data)}; give one, e.g. {label}=ds['train']")
    if hasattr(data, "column_names") and hasattr(data, "__len__"):  # a datasets.Dataset
        return _check(list(data), label)
    if isinstance(data, Mapping) or not isinstance(data, Sequence):
        raise UserError(
            f"{label}: give a datasets.Dataset, a list of dicts or a JSON-lines path, not {type(data).__name__}"
        )
    return _check(list(data), label)


def _read_jsonl(path: Path) -> list:
    if not path.is_file():
        raise UserError(f"dataset file not found: {path}" + (" (it is a directory)" if path.is_dir() else ""))
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise UserError(f"{path} line {n}: malformed JSON ({e.msg} at column {e.colno})") from None
    return rows


def _check(rows: list, label: str) -> Rows:
    if not rows:
        raise UserError(f"{label} has no rows")
    for n, row in enumerate(rows, start=1):
        if not isinstance(row, Mapping):
            raise UserError(f"{label} row {n}: expected a dict with a {PROMPT!r} column, got {type(row).__name__}")
        if PROMPT not in row:
            raise UserError(f"{label} row {n}: no {PROMPT!r} column (the row has {sorted(row)})")
        p = row[PROMPT]
        if isinstance(p, str):
            if not p.strip():
                raise UserError(f"{label} row {n} column {PROMPT!r}: empty text")
            continue
        if not isinstance(p, Sequence) or not p or not all(_is_message(m) for m in p):
            raise UserError(
                f"{label} row {n} column {PROMPT!r}: give a string or a list of chat messages "
                f'{{"role": ..., "content": "..."}}, got {p!r:.80}'
            )
    return Rows(label, tuple(dict(r) for r in rows))


def _is_message(m: Any) -> bool:
    return isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)


@dataclass(frozen=True)
class Data:
    train: Rows
    heldout: Rows | None
    rewards: RewardFunctions


_TABLE: dict[str, Data] = {}  # handle -> what this process was given (see the module docstring)


def register(train: Rows, heldout: Rows | None, rewards: RewardFunctions) -> str:
    """Keep the rows and reward functions in this process; returns the handle for ``dataset:<handle>``:
    the file name's stem or ``rows``, then a digest of the rows and of the functions' names and weights
    (the same data and functions get the same handle, and so the same default run name; other functions of the
    same names get ``-2``, ``-3``, ... so that a trainer made earlier keeps its own)."""
    stem = Path(train.label).stem if train.label.endswith((".jsonl", ".json")) else "rows"
    parts = (train.rows, heldout.rows if heldout else None, rewards.names, rewards.weights)
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()[:10]
    handle, n = f"{stem}-{digest}", 1
    while handle in _TABLE and not _same(_TABLE[handle], train, heldout, rewards):  # e.g. a redefined function
        n += 1
        handle = f"{stem}-{digest}-{n}"
    _TABLE[handle] = Data(train, heldout, rewards)
    return handle


def _same(data: Data, train: Rows, heldout: Rows | None, rewards: RewardFunctions) -> bool:
    """Whether ``data`` holds these rows and these very function objects (a trainer made earlier keeps its own)."""
    same_funcs = len(data.rewards.funcs) == len(rewards.funcs) and all(
        a is b for a, b in zip(data.rewards.funcs, rewards.funcs)
    )
    return same_funcs and data.rewards.weights == rewards.weights and (data.train, data.heldout) == (train, heldout)


def _key(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


class DatasetTask:
    """See the module docstring."""

    def __init__(self, handle: str, data: Data, options: _Options):
        self.name, self.options, self._rewards = f"dataset:{handle}", options, data.rewards
        self._rows: dict[str, tuple[dict[str, Any], str]] = {}  # prompt id -> (row, how errors name it)
        train = list(enumerate(data.train.rows, start=1))
        if data.heldout is not None:
            self._heldout = tuple(
                self._prompt("eval-row", n, r, data.heldout.label) for n, r in enumerate(data.heldout.rows, 1)
            )
        else:
            held = holdout_questions(
                [_key(r[PROMPT]) for _, r in train], options.heldout_fraction, options.seed, data.train.label
            )
            self._heldout = tuple(
                self._prompt("row", n, r, data.train.label) for n, r in train if _key(r[PROMPT]) in held
            )
            train = [(n, r) for n, r in train if _key(r[PROMPT]) not in held]
        self._train = tuple(self._prompt("row", n, r, data.train.label) for n, r in train)
        self.data_digest = prompts_digest(self._train)  # the warm start's cache key (components)

    def _prompt(self, kind: str, n: int, row: dict[str, Any], label: str) -> Prompt:
        p = row[PROMPT]
        pid = f"{self.name}/{kind}-{n}"
        self._rows[pid] = (row, f"{label} row {n}")
        if isinstance(p, str):
            return Prompt(id=pid, task=self.name, text=p, answer=None, metadata={"row": n})
        messages = tuple({"role": m["role"], "content": m["content"]} for m in p)
        text = next((m["content"] for m in reversed(messages) if m["role"] == "user"), messages[-1]["content"])
        return Prompt(id=pid, task=self.name, text=text, answer=None, messages=messages, metadata={"row": n})

    def train_prompts(self) -> Sequence[Prompt]:
        return self._train

    def heldout_prompts(self) -> Sequence[Prompt]:
        return self._heldout

    def verify(self, prompt: Prompt, completion: str) -> Verdict:
        row, where = self._rows[prompt.id]
        conversational = not isinstance(row[PROMPT], str)
        shown = [{"role": "assistant", "content": completion}] if conversational else completion
        columns = {k: v for k, v in row.items() if k != PROMPT}
        return self._rewards.score(row[PROMPT], shown, columns, where)

    def sft_examples(self, n: int, seed: int):
        raise NotImplementedError(f"task {self.name!r} has no reference completions")


def make(arg: str | None, options=None) -> DatasetTask:
    """Task factory: ``dataset:<handle>`` (a handle that ``register`` returned in this process)."""
    if not arg:
        raise UserError("task 'dataset' is made by the Python API: rollwise.train(dataset=..., reward_funcs=...)")
    if arg not in _TABLE:
        raise UserError(
            f"task 'dataset:{arg}' holds Python objects (rows, reward functions) that live only in the process "
            "that called rollwise.train(dataset=..., reward_funcs=...); this process does not have them "
            "(another process: a Ray worker, a command line); call rollwise.train / rollwise.evaluate from that "
            "script, or use task 'jsonl:<path>' / 'hf:<path>' with a verifier"
        )
    return DatasetTask(arg, _TABLE[arg], coerce_options(make.Options, options, f"dataset:{arg}"))


make.Options = _Options
