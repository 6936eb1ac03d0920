"""``jsonl:<path>``: question/answer rows from a JSON-lines file, verified by math-verify.

Contract:

- The file (and ``heldout_path``, if given) is read and checked at construction: one JSON object
  per non-blank line, each with a non-empty string ``question_field`` and an ``answer_field``
  (string or number). Every mistake raises ``UserError`` naming the file, and the line number,
  field and the option that names it (``task.options.answer_field``) where there is one: missing file, malformed JSON, a
  line that is not an object, a missing or empty field, no rows at all.
- Splits, both disjoint by question text and in file order:

  * with ``heldout_path``: that file is the held-out split; train rows whose question also
    appears there are dropped (``dropped_overlap`` counts them);
  * otherwise ``heldout_fraction`` of the distinct questions (rounded, at least one when the
    fraction is above 0), chosen by ``seed``, are held out with all their rows.

- Prompts: ``text`` the question; ``messages`` the chat form (optional system prompt, then the
  question) unless ``chat = false``; ``answer`` the answer as text; ``metadata`` ``{"source",
  "line"}`` plus ``"difficulty"`` when the row has that field. Ids: ``jsonl:<path>/line-<n>``
  (``.../heldout-line-<n>`` for rows of ``heldout_path``).
- ``verify``: the verifier named by ``verifier`` (default ``math``, see ``rollwise.verify.math``).
- ``sft_examples``: targets from ``solution_field`` (a string, or a number used as its text); without
  one it raises NotImplementedError.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollwise.registry import UserError
from rollwise.tasks._common import chat, coerce_options, holdout_questions, prompts_digest, sample_prompts
from rollwise.types import Prompt, Verdict


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question_field: str = Field(default="question", min_length=1, description="JSON key of the question text")
    answer_field: str = Field(default="answer", min_length=1, description="JSON key of the reference answer")
    solution_field: str | None = Field(
        default=None, description="JSON key of a worked solution, used as the SFT target (optional)"
    )
    heldout_path: str | None = Field(
        default=None, description="JSON-lines file of held-out rows; if unset, heldout_fraction of the file is held out"
    )
    heldout_fraction: float = Field(
        default=0.1, ge=0.0, lt=1.0, description="share of distinct questions held out when heldout_path is unset"
    )
    seed: int = Field(default=0, ge=0, description="seed of the held-out draw")
    system_prompt: str | None = Field(default=None, description="system message put before each question (chat only)")
    chat: bool = Field(default=True, description="give prompts as chat messages (false: plain text for base models)")
    verifier: str = Field(default="math", description="verifier name from rollwise.verify (math, exact, ...)")

    @model_validator(mode="after")
    def _system_needs_chat(self) -> _Options:
        if self.system_prompt and not self.chat:
            raise ValueError("system_prompt needs chat = true")
        return self


def read_rows(path: Path, opts: _Options) -> list[tuple[int, dict[str, Any]]]:
    """(line number, row) for each non-blank line of ``path``; ``UserError`` on any mistake."""
    if not path.is_file():
        raise UserError(f"jsonl task: file not found: {path}" + (" (it is a directory)" if path.is_dir() else ""))
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"jsonl task: cannot read {path}: {e}") from None
    rows = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path} line {n}: malformed JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(row, dict):
            raise UserError(f"{path} line {n}: expected a JSON object, got {type(row).__name__}")
        q = row.get(opts.question_field)
        if not isinstance(q, str) or not q.strip():
            raise UserError(_field_error(path, n, "question_field", opts.question_field, row, "a non-empty string"))
        a = row.get(opts.answer_field)
        if not _text_or_number(a):
            raise UserError(
                _field_error(path, n, "answer_field", opts.answer_field, row, "a non-empty string or number")
            )
        if opts.solution_field and not _text_or_number(row.get(opts.solution_field)):
            raise UserError(
                _field_error(path, n, "solution_field", opts.solution_field, row, "a non-empty string or number")
            )
        rows.append((n, row))
    if not rows:
        raise UserError(f"jsonl task: {path} has no rows")
    return rows


def _text_or_number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (str, int, float)) and bool(str(v).strip())


def _field_error(path: Path, n: int, option: str, field: str, row: dict, want: str) -> str:
    if field not in row:
        return (
            f"{path} line {n}: missing field {field!r} (the line has {sorted(row)}); set task.options.{option} "
            f"to the key that holds it (rollwise config options task jsonl)"
        )
    return (
        f"{path} line {n}: field {field!r} must be {want}, got {row[field]!r:.80} (the field named by "
        f"task.options.{option})"
    )


class JsonlTask:
    """See the module docstring."""

    def __init__(self, path: str, options: _Options):
        from rollwise.verify import REGISTRY as VERIFIERS

        self.name = f"jsonl:{path}"
        self.options = options
        self._verify = VERIFIERS.get(options.verifier)  # UserError on an unknown name
        rows = read_rows(Path(path), options)
        q = options.question_field
        if options.heldout_path:
            held = read_rows(Path(options.heldout_path), options)
            held_q = {row[q] for _, row in held}
            train = [(n, row) for n, row in rows if row[q] not in held_q]
            self.dropped_overlap = len(rows) - len(train)
            if not train:
                raise UserError(f"jsonl task: every question of {path} is also in {options.heldout_path}")
            self._heldout = tuple(self._prompt("heldout-line", n, row, options.heldout_path) for n, row in held)
        else:
            self.dropped_overlap = 0
            held_q = holdout_questions([row[q] for _, row in rows], options.heldout_fraction, options.seed, path)
            train = [(n, row) for n, row in rows if row[q] not in held_q]
            self._heldout = tuple(self._prompt("line", n, row, path) for n, row in rows if row[q] in held_q)
        self._train = tuple(self._prompt("line", n, row, path) for n, row in train)
        self.data_digest = prompts_digest(self._train)  # the warm start's cache key (components)

    def _prompt(self, kind: str, n: int, row: dict[str, Any], source: str) -> Prompt:
        o = self.options
        question = row[o.question_field]
        meta: dict[str, Any] = {"source": source, "line": n}
        if "difficulty" in row:
            meta["difficulty"] = row["difficulty"]
        if o.solution_field:
            meta["solution"] = str(row[o.solution_field])  # a number is its own solution text
        return Prompt(
            id=f"{self.name}/{kind}-{n}",
            task=self.name,
            text=question,
            answer=str(row[o.answer_field]).strip(),
            messages=chat(question, o.system_prompt) if o.chat else None,
            metadata=meta,
        )

    def train_prompts(self) -> Sequence[Prompt]:
        return self._train

    def heldout_prompts(self) -> Sequence[Prompt]:
        return self._heldout

    def verify(self, prompt: Prompt, completion: str) -> Verdict:
        return self._verify(prompt, completion)

    def sft_examples(self, n: int, seed: int) -> list[tuple[Prompt, str]]:
        """``n`` (prompt, solution) pairs from the train split, drawn by ``seed``."""
        if not self.options.solution_field:
            raise NotImplementedError(f"task {self.name!r} has no solutions: set options.solution_field")
        return [(p, p.metadata["solution"]) for p in sample_prompts(self._train, n, seed)]


def make(arg: str | None, options=None) -> JsonlTask:
    """Task factory: ``jsonl:<path>``."""
    if not arg:
        raise UserError("task 'jsonl' needs a file: write 'jsonl:<path>'")
    return JsonlTask(arg, coerce_options(make.Options, options, f"jsonl:{arg}"))


make.Options = _Options
