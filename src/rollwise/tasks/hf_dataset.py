"""``hf:<path>``: question/answer rows from local data files read by the Hugging Face
``datasets`` library (an optional extra: ``pip install 'rollwise[data]'``), for users coming
from TRL / verl with their own files and column names.

Contract:

- ``<path>`` is a file (``.jsonl``/``.json`` -> datasets' ``json`` builder, ``.csv``,
  ``.parquet``, ``.arrow``; ``options.format`` overrides the guess) or a directory written by
  ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk`` (read with ``load_from_disk``).
  Nothing is downloaded. A ``DatasetDict`` gives its ``options.split`` split for training.
- Columns are options: ``question_column``, ``answer_column`` (string or number), and either a
  fixed ``system_prompt`` or a per-row ``system_prompt_column`` (a null or empty cell: no
  system message). Every row is checked at construction; a mistake raises ``UserError`` naming
  the file, the row (numbered from 1 in file order) and the column: a missing column (listing
  the columns there), an empty or non-string question, a missing or empty answer, a system
  prompt that is not a string. A missing file, an unreadable one and an empty one are named too.
- Held-out split, disjoint from train by question text: ``heldout_path`` (another file, same
  columns), else the DatasetDict's ``heldout_split``, else ``heldout_fraction`` of the distinct
  questions drawn by ``seed`` (``tasks._common.holdout_questions``, shared with ``jsonl:``).
- Prompts: ``messages`` (the optional system message, then the question) unless
  ``chat = false``; the policy's tokenizer renders them with its chat template
  (``tokens.Codec``: instruct models), and a tokenizer without one sees ``text``, the question.
  Ids ``hf:<path>/row-<n>`` (``heldout-row-<n>`` for rows of ``heldout_path``).
- ``verify``: the verifier named by ``verifier``: ``math`` (math-verify), ``exact``, any name of
  ``rollwise.verify``, or a ``package.module:function`` import path to a callable
  ``(prompt, completion_text) -> Verdict``.
- ``sft_examples`` raises NotImplementedError (no reference completions; the tiny model's warm
  start is then skipped).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollwise.registry import UserError
from rollwise.tasks._common import chat, coerce_options, holdout_questions, prompts_digest
from rollwise.types import Prompt, Verdict

FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question_column: str = Field("question", min_length=1, description="column of the question text")
    answer_column: str = Field("answer", min_length=1, description="column of the reference answer")
    system_prompt_column: str | None = Field(None, description="column of a per-row system prompt (null/empty: none)")
    system_prompt: str | None = Field(None, description="system message put before every question (chat only)")
    format: Literal["json", "csv", "parquet", "arrow"] | None = Field(
        None, description="datasets builder for a file (default: from the extension)"
    )
    split: str = Field("train", min_length=1, description="split of a save_to_disk DatasetDict used for training")
    heldout_split: str | None = Field(None, description="split of a save_to_disk DatasetDict used as held-out set")
    heldout_path: str | None = Field(None, description="another file or save_to_disk directory used as held-out set")
    heldout_fraction: float = Field(
        0.1, ge=0.0, lt=1.0, description="share of distinct questions held out when no held-out set is given"
    )
    seed: int = Field(0, ge=0, description="seed of the held-out draw")
    chat: bool = Field(
        True,
        description="give prompts as chat messages, rendered by the model's chat template "
        "(false: plain text for base models)",
    )
    verifier: str = Field(
        "math",
        min_length=1,
        description="verifier: a rollwise.verify name (math, exact, ...) or 'package.module:function'",
    )

    @model_validator(mode="after")
    def _check(self) -> _Options:
        if (self.system_prompt or self.system_prompt_column) and not self.chat:
            raise ValueError("system_prompt / system_prompt_column need chat = true")
        if self.system_prompt and self.system_prompt_column:
            raise ValueError("give system_prompt or system_prompt_column, not both")
        if self.heldout_split and self.heldout_path:
            raise ValueError("give heldout_split or heldout_path, not both")
        return self


def _require_datasets():
    try:
        import datasets
    except ImportError:
        raise UserError("task 'hf:<path>' needs the datasets package: pip install 'rollwise[data]'") from None
    return datasets


def load_table(path: Path, opts: _Options, split: str | None = None):
    """The rows of ``path`` as a ``datasets.Dataset`` (see the module docstring)."""
    datasets = _require_datasets()
    if not path.exists():
        raise UserError(f"hf task: file or directory not found: {path}")
    try:
        if path.is_dir():
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                want = split or opts.split
                if want not in ds:
                    raise UserError(
                        f"hf task: {path} has splits {sorted(ds)}, not {want!r} (options.split / heldout_split)"
                    )
                ds = ds[want]
            return ds
        fmt = opts.format or FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise UserError(
                f"hf task: cannot tell the format of {path} from its extension; "
                f"use {sorted(FORMATS)} or set options.format"
            )
        return datasets.load_dataset(fmt, data_files=str(path), split="train")
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - datasets raises many types for a bad file
        raise UserError(f"hf task: cannot read {path}: {type(e).__name__}: {str(e)[:300]}") from None


def check_rows(path: Path, ds, opts: _Options) -> list[tuple[int, dict[str, Any]]]:
    """(row number from 1, row) for every row; ``UserError`` naming file, row and column."""
    cols = [opts.question_column, opts.answer_column] + (
        [opts.system_prompt_column] if opts.system_prompt_column else []
    )
    for c in cols:
        if c not in ds.column_names:
            raise UserError(f"{path}: no column {c!r} (the columns are {ds.column_names})")
    if len(ds) == 0:
        raise UserError(f"hf task: {path} has no rows")
    rows = []
    for n, row in enumerate(ds.select_columns(cols), start=1):
        q, a = row[opts.question_column], row[opts.answer_column]
        if not isinstance(q, str) or not q.strip():
            raise UserError(
                f"{path} row {n} column {opts.question_column!r}: must be a non-empty string, got {q!r:.80}"
            )
        if isinstance(a, bool) or not isinstance(a, (str, int, float)) or not str(a).strip():
            raise UserError(
                f"{path} row {n} column {opts.answer_column!r}: must be a non-empty string or number, got {a!r:.80}"
            )
        if opts.system_prompt_column:
            s = row[opts.system_prompt_column]
            if s is not None and not isinstance(s, str):
                raise UserError(
                    f"{path} row {n} column {opts.system_prompt_column!r}: must be a string or null, got {s!r:.80}"
                )
        rows.append((n, row))
    return rows


class HFDatasetTask:
    """See the module docstring."""

    def __init__(self, path: str, options: _Options):
        from rollwise.verify import REGISTRY as VERIFIERS

        self.name, self.options = f"hf:{path}", options
        self._verify = VERIFIERS.get(options.verifier)  # UserError on an unknown name or import path
        if not callable(self._verify):
            raise UserError(f"hf task: verifier {options.verifier!r} is not callable")
        q = options.question_column
        rows = check_rows(Path(path), load_table(Path(path), options), options)
        if options.heldout_path or options.heldout_split:
            src = options.heldout_path or path
            held = check_rows(Path(src), load_table(Path(src), options, split=options.heldout_split), options)
            held_q = {r[q] for _, r in held}
            kind = "heldout-row" if options.heldout_path else f"{options.heldout_split}-row"
            self._heldout = tuple(self._prompt(kind, n, r) for n, r in held)
        else:
            held_q = holdout_questions([r[q] for _, r in rows], options.heldout_fraction, options.seed, self.name)
            self._heldout = tuple(self._prompt("row", n, r) for n, r in rows if r[q] in held_q)
        self._train = tuple(self._prompt("row", n, r) for n, r in rows if r[q] not in held_q)
        self.data_digest = prompts_digest(self._train)  # the warm start's cache key (components)
        self.dropped_overlap = len(rows) - len(self._train) if (options.heldout_path or options.heldout_split) else 0
        if not self._train:
            raise UserError(f"hf task: every question of {path} is in the held-out set")

    def _prompt(self, kind: str, n: int, row: dict[str, Any]) -> Prompt:
        o = self.options
        question = row[o.question_column]
        system = o.system_prompt or (row.get(o.system_prompt_column) if o.system_prompt_column else None) or None
        return Prompt(
            id=f"{self.name}/{kind}-{n}",
            task=self.name,
            text=question,
            answer=str(row[o.answer_column]).strip(),
            messages=chat(question, system) if o.chat else None,
            metadata={"source": self.name, "row": n},
        )

    def train_prompts(self) -> Sequence[Prompt]:
        return self._train

    def heldout_prompts(self) -> Sequence[Prompt]:
        return self._heldout

    def verify(self, prompt: Prompt, completion: str) -> Verdict:
        return self._verify(prompt, completion)

    def sft_examples(self, n: int, seed: int):
        raise NotImplementedError(f"task {self.name!r} has no reference completions")


def make(arg: str | None, options=None) -> HFDatasetTask:
    """Task factory: ``hf:<path>``."""
    if not arg:
        raise UserError("task 'hf' needs a file or directory: write 'hf:<path>'")
    return HFDatasetTask(arg, coerce_options(make.Options, options, f"hf:{arg}"))


make.Options = _Options
