"""reasoning-gym verifier: ``verify(prompt, completion, score_fn=None) -> Verdict``.

Contract:

- ``prompt.metadata`` holds ``"dataset"`` (the reasoning-gym name), ``"entry"`` (the generated
  entry: question, answer, metadata, as the scorer needs it) and optionally ``"config"`` (the
  dataset's config options; a few scorers read them). ``rollwise.tasks.reasoning_gym`` sets all
  three. No entry -> ``Verdict(None, "bad_reference")``.
- The answer is the last ``<answer>...</answer>`` span (reasoning-gym's ``extract_answer``);
  without one, the last non-empty line (``details["format"]`` says which: ``"tag"`` /
  ``"last_line"``). An empty completion -> ``Verdict(0.0, "no_answer")``.
- The score is the dataset's own ``score_answer(answer, entry)``: usually 1.0 or 0.0, some
  datasets give partial credit in between. Reasons: ``"correct"`` (1.0), ``"wrong"`` (0.0),
  ``"partial"``. An exception in the scorer -> ``Verdict(None, "scorer_error")``.
- ``score_fn`` lets a task pass its own dataset's ``score_answer``; otherwise one is built from
  the dataset name and config, once per (name, config), and cached.
- ``details["answer"]`` is the extracted answer, stripped, for maj@k voting.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any

from rollwise.types import Prompt, Verdict

ScoreFn = Callable[[str | None, dict], float]
_ANSWER_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)  # as reasoning_gym.utils


def extract(completion: str) -> tuple[str | None, str | None]:
    """(answer, format): the last <answer> span, else the last non-empty line, else (None, None)."""
    tags = _ANSWER_TAG.findall(completion)
    if tags:
        return tags[-1].strip(), "tag"
    lines = [line.strip() for line in completion.splitlines() if line.strip()]
    return (lines[-1], "last_line") if lines else (None, None)


@functools.lru_cache(maxsize=64)
def _cached_score_fn(dataset: str, config_json: str) -> ScoreFn:
    import reasoning_gym

    return reasoning_gym.create_dataset(dataset, **json.loads(config_json), size=1).score_answer


def score_fn_for(dataset: str, config: dict[str, Any] | None = None) -> ScoreFn:
    """The ``score_answer`` of ``dataset`` built with ``config`` (cached)."""
    return _cached_score_fn(dataset, json.dumps(config or {}, sort_keys=True, default=list))


def verify(prompt: Prompt, completion: str, score_fn: ScoreFn | None = None) -> Verdict:
    entry = prompt.metadata.get("entry")
    dataset = prompt.metadata.get("dataset")
    if entry is None or (score_fn is None and dataset is None):
        return Verdict(None, "bad_reference", {"error": "prompt.metadata lacks the reasoning-gym entry"})
    answer, fmt = extract(completion)
    if answer is None:
        return Verdict(0.0, "no_answer", {"answer": None})
    details: dict[str, Any] = {"answer": answer, "format": fmt}
    try:
        fn = score_fn or score_fn_for(dataset, prompt.metadata.get("config"))
        score = float(fn(answer, entry))
    except Exception as e:  # a scorer bug is "could not verify", never a silent 0
        return Verdict(None, "scorer_error", {**details, "error": f"{type(e).__name__}: {e}"[:300]})
    reason = "correct" if score >= 1.0 else "wrong" if score <= 0.0 else "partial"
    return Verdict(score, reason, details)
