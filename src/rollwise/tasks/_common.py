"""Small helpers shared by the task factories (not a task)."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any, Mapping, Sequence, TypeVar

from pydantic import BaseModel

from rollwise.registry import UserError, validate_options
from rollwise.types import Prompt

M = TypeVar("M", bound=BaseModel)


def coerce_options(model: type[M], options: Any, name: str) -> M:
    """Accept an already validated ``Options`` instance, a plain mapping, or None (defaults)."""
    if isinstance(options, model):
        return options
    if options is None:
        options = {}
    if isinstance(options, BaseModel):
        options = options.model_dump()
    if not isinstance(options, Mapping):
        raise UserError(f"task {name!r}: options must be a table, got {type(options).__name__}")
    return validate_options("task", name, SimpleNamespace(Options=model), dict(options))


def chat(question: str, system_prompt: str | None) -> tuple[dict[str, str], ...]:
    """Chat form of a question: an optional system message, then the user message."""
    user = ({"role": "user", "content": question},)
    return (({"role": "system", "content": system_prompt},) if system_prompt else ()) + user


def sample_prompts(prompts: Sequence[Prompt], n: int, seed: int) -> list[Prompt]:
    """``n`` prompts drawn by ``seed``: without replacement while possible, then with."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not prompts:
        return []
    rng = random.Random(seed)
    out: list[Prompt] = []
    while len(out) < n:
        out += rng.sample(list(prompts), min(n - len(out), len(prompts)))
    return out
