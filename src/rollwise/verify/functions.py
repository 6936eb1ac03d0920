"""Reward functions with TRL's signature, as one rollwise verifier (issue #46).

A reward function written for TRL's ``GRPOTrainer`` runs here unchanged::

    def my_reward(prompts, completions, **kwargs) -> list[float]

``prompts`` and ``completions`` are lists (one entry per completion); the dataset's other columns
come as keyword lists of the same length (``answer=[...]``), as in TRL's
``GRPOTrainer._calculate_rewards``. A completion is the decoded text, or, when the dataset's prompt
is a list of chat messages (TRL's *conversational* format), ``[{"role": "assistant", "content":
text}]``. A ``async def`` reward function is run to completion with ``asyncio.run``.

What differs from TRL, and why: rollwise verifies each rollout as it finishes (the pool's
verifier contract, ``(prompt, completion text) -> Verdict``, docs/architecture.md §3), so every call
carries one completion (lists of length one); a function that normalises across its batch sees a
batch of one. TRL's trainer-only keywords (``completion_ids``, ``trainer_state``, ``log_extra``,
``log_metric``, ``environments``) are not passed: a function that reads them from ``**kwargs``
gets nothing there.

Values: a number, ``None`` (could not verify: never read as 0, docs/architecture.md §2; TRL reads
it as NaN the same way) or a rollwise ``Verdict``. Several functions combine as TRL's default
``multi_objective_aggregation = "sum_then_normalize"`` does before normalising: the weighted sum of
the values that are not None (``reward_weights``, default 1 each); a completion for which every
function returned None is unverified. A function that raises, returns a sequence of the wrong
length, or a value that is not a number, None or a Verdict raises ``UserError`` naming the function
and the dataset row.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

from rollwise.registry import UserError
from rollwise.types import Verdict


def function_names(funcs: Sequence[Callable]) -> list[str]:
    """Each function's ``__name__`` (a callable object's class name), made unique with ``#2``, ``#3``
    in list order, so that an error and ``Verdict.details`` name one function."""
    names: list[str] = []
    for f in funcs:
        base = getattr(f, "__name__", None) or type(f).__name__
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}#{n}"
        names.append(name)
    return names


class RewardFunctions:
    """``reward_funcs`` and ``reward_weights`` (see the module docstring), checked at construction."""

    def __init__(self, funcs: Callable | Sequence[Callable], weights: Sequence[float] | None = None):
        if callable(funcs):
            funcs = [funcs]
        if isinstance(funcs, (str, bytes)) or not isinstance(funcs, Sequence) or not funcs:
            raise UserError(
                "reward_funcs: give a list of one or more functions f(prompts, completions, **kwargs) -> list[float]"
            )
        for i, f in enumerate(funcs):
            if not callable(f):
                raise UserError(
                    f"reward_funcs[{i}] is {f!r:.60}, not a function; rollwise takes functions f(prompts, "
                    "completions, **kwargs) (a model name as a reward model is not supported)"
                )
        self.funcs = list(funcs)
        self.names = function_names(self.funcs)
        if weights is None:
            weights = [1.0] * len(self.funcs)
        if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
            raise UserError(f"reward_weights: give a list of numbers, one per reward function; got {weights!r:.60}")
        if len(weights) != len(self.funcs):
            raise UserError(
                f"reward_weights has {len(weights)} value(s) for {len(self.funcs)} reward function(s) "
                f"({', '.join(self.names)}); give one weight per function"
            )
        for i, w in enumerate(weights):
            if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w):
                raise UserError(f"reward_weights[{i}] (for {self.names[i]!r}) must be a finite number, got {w!r}")
        self.weights = [float(w) for w in weights]

    def score(self, prompt: Any, completion: Any, columns: dict[str, Any], row: str) -> Verdict:
        """The verdict of one completion: ``prompt`` as the dataset holds it (text or messages),
        ``completion`` as TRL hands it (text or one assistant message), ``columns`` the row's other
        columns, ``row`` what an error calls the row (``"dataset row 3"``)."""
        values: list[float | None] = []
        verdicts: list[Verdict | None] = []
        for f, name in zip(self.funcs, self.names):
            got = self._call(f, name, prompt, completion, columns, row)
            verdicts.append(got if isinstance(got, Verdict) else None)
            values.append(got.score if isinstance(got, Verdict) else got)
        if all(v is None for v in values):
            return Verdict(None, "unverified", {"reward_funcs": dict(zip(self.names, values))})
        if len(self.funcs) == 1 and verdicts[0] is not None and self.weights[0] == 1.0:
            return verdicts[0]  # rollwise's own verdict, reason and details kept
        total = sum(w * v for w, v in zip(self.weights, values) if v is not None)
        return Verdict(total, "reward_funcs", {"reward_funcs": dict(zip(self.names, values))})

    def _call(self, f, name: str, prompt, completion, columns: dict, row: str) -> float | Verdict | None:
        try:
            out = f(prompts=[prompt], completions=[completion], **{k: [v] for k, v in columns.items()})
            if inspect.isawaitable(out):
                out = asyncio.run(_awaited(out))
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's function: any failure is named with its row
            raise UserError(f"reward function {name!r} raised {type(e).__name__}: {e} ({row})") from e
        kind = type(out).__name__
        if hasattr(out, "tolist"):  # a numpy array or a tensor: its numbers
            out = out.tolist()
        if isinstance(out, (str, bytes)) or not isinstance(out, Sequence):
            raise UserError(
                f"reward function {name!r} returned {kind} ({out!r:.60}), not a list with one value per "
                f"completion ({row})"
            )
        if len(out) != 1:
            raise UserError(f"reward function {name!r} returned {len(out)} values for 1 completion ({row})")
        return _value(out[0], name, row)


async def _awaited(awaitable):
    return await awaitable


def _value(v: Any, name: str, row: str) -> float | Verdict | None:
    """A reward function's value: a float, None (could not verify; NaN too, as TRL reads None) or a Verdict."""
    if v is None or isinstance(v, Verdict):
        return v
    if isinstance(v, numbers.Real):  # bool, int, float, numpy scalars
        x = float(v)
        if math.isnan(x):
            return None
        if math.isinf(x):
            raise UserError(f"reward function {name!r} returned {x} ({row}); give a finite number or None")
        return x
    raise UserError(
        f"reward function {name!r} returned {v!r:.60} ({type(v).__name__}) ({row}); give a number, None "
        "(could not verify) or a rollwise Verdict"
    )
