"""Small helpers shared by the task factories (not a task)."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any, TypeVar

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


def holdout_questions(questions: Sequence[str], fraction: float, seed: int, source: str) -> set[str]:
    """The held-out questions: ``round(fraction * d)`` of the ``d`` distinct ``questions`` (first
    occurrence order), drawn by ``seed``; with ``fraction > 0`` at least 1 and at most ``d - 1``,
    so both splits are non-empty (``UserError`` naming ``source`` when ``d < 2``)."""
    distinct = list(dict.fromkeys(questions))
    k = round(len(distinct) * fraction)
    if fraction > 0:
        if len(distinct) < 2:
            raise UserError(
                f"task {source}: {len(distinct)} distinct question(s); need at least 2 to hold "
                "some out (or set heldout_fraction = 0)"
            )
        k = min(max(k, 1), len(distinct) - 1)
    return set(random.Random(seed).sample(distinct, k))


def draw_splits(draw, n_train: int, n_heldout: int, seed: int, name: str) -> tuple[list, list]:
    """(train, held-out) items from ``draw(rng) -> (key, item)``, distinct by key, the two disjoint;
    held-out first from its own stream (it does not depend on ``n_train``). ``UserError`` naming
    ``name`` when the draws keep repeating (the space is too small for the sizes asked)."""
    seen: set = set()
    out = []
    for split, n in (("heldout", n_heldout), ("train", n_train)):
        rng, items, misses = random.Random(f"rollwise-{name}-{split}-{seed}"), [], 0
        while len(items) < n:
            key, item = draw(rng)
            if key in seen:
                misses += 1
                if misses > 1000 + 20 * n:
                    raise UserError(f"task {name!r}: cannot draw {n} distinct {split} items; lower n_{split}")
                continue
            seen.add(key)
            items.append(item)
        out.append(items)
    return out[1], out[0]


def prompts_digest(prompts: Sequence[Prompt]) -> str:
    """A fingerprint of a task's prompts as read from the user's data (ids, text, chat messages, reference
    answers, metadata): the warm start's cache key carries it, so an edited data file (even with as many
    rows) trains a new warm start instead of loading the one made from the old rows."""
    rows = [(p.id, p.text, p.answer, p.messages, p.metadata) for p in prompts]
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()[:16]
