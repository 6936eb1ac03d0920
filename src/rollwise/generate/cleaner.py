"""CLEANER: repaired tool calls spliced in place of the failures before training (issue #44 item 3;
``task.cleaner``).

Paper: "CLEANER" (arXiv 2601.15141); the working specification is the CLEANER entry of the project's
agentic specifications. An agent whose tool call fails (the code raises, does not parse, times out)
and which repairs it a turn or more later leaves a trajectory that teaches the failure as well as the
fix. CLEANER rolls the trajectory back to the failure and splices the repair in its place, so the
policy is trained on the clean path it could have taken. Rollwise applies it as a post-episode
transform of the episode pool's *training* episodes (``rollwise.generate.episodes``; evaluation
episodes are never changed), after the step's ledger has counted what really ran:

1. **Repairs** (:func:`find_repairs`). A turn *failed* when one of its tool calls ended ``error``,
   ``timeout``, ``parse_error`` or ``unknown_tool`` (``"limit"`` did not run; ``"truncated"`` ran).
   A run of failed turns ``k..j-1`` followed by a turn ``j`` whose calls all ended ``"ok"`` is
   *repaired* by turn ``j``; a run followed by an answer, by another kind of turn or by nothing is
   not, and the episode is left as it was.
2. **Depth** (SAAR, the paper's similarity-aware rollback). The code of the first failed call and
   of the repairing call are compared (``difflib.SequenceMatcher.ratio``): at or above
   ``task.cleaner.threshold`` the fix was local and the splice is **shallow**: turn ``k``'s own
   reasoning (its tokens before the call) followed by turn ``j``'s call and whatever follows it in
   that turn; below it the approach changed and the splice is **deep**: turn ``j``'s whole turn.
   The call starts at the first ``<tool name>`` tag (tag format) or ``<tool_call>`` (JSON format) of
   the turn's decoded text; the token boundary is the last token that ends at or before it (never
   a re-tokenisation).
3. **Splice** (:func:`splice`). Turns ``k..j`` become one turn carrying turn ``j``'s reward, tool calls
   and observation and turn ``k``'s anchor (the state the failure acted in); the turns after shift.
4. **Re-scoring.** Spliced tokens were not sampled where they now stand, and every token after the
   splice point now follows a shorter history, so their sampler log-probs no longer describe the
   behaviour policy μ at those positions. Rollwise **re-scores** them: one forward pass of the
   sampler (``backend.score``, the distribution ``generate`` samples from) over every spliced row
   gives the log-probs of all policy tokens from the splice point on under μ, with the weights that
   generated the episode (the same pool call). Observation tokens keep log-prob 0.0 and loss mask 0.
   The alternative, masking the spliced tokens out of the ratio, would not train the repair at all,
   which is what the splice is for. Entropies (``Rollout.entropies``) are the ones each token was
   sampled with.

Ledger (``metrics.jsonl``): ``cleaner/rows`` (episodes spliced), ``cleaner/shallow``, ``cleaner/deep``
(splices of each depth), ``cleaner/tokens_removed`` (completion tokens the splices dropped) and
``cleaner/score_s`` (seconds of the re-scoring pass). ``StepCost.generated_tokens`` stays the tokens
decoded: the splice saves training tokens, not sampling.

**Reconstructions** [RECON] (the specification gives no formula for them):

- a failure is one of the outcomes above, a repair the first later turn whose calls all succeed;
- the similarity is ``difflib``'s ratio of the two calls' argument texts, its threshold 0.5;
- re-scoring rather than masking, and re-scoring every later policy token, not only the spliced ones.

Refused at load (``rollwise.compat.check_episode_transforms``) on a task without tools
(``Compat(tools=True)`` on its factory) and with a backend that cannot score (vLLM); a single-turn
task refuses every episode key (``rollwise.sections.task.check_single_turn``).
"""

from __future__ import annotations

import dataclasses
import difflib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rollwise.types import Episode, Prompt, Rollout, Sampling, ToolCall, Turn

FAILED = frozenset({"error", "timeout", "parse_error", "unknown_tool"})


@dataclass(frozen=True)
class Repair:
    """Turns ``failed..repair - 1`` failed; turn ``repair`` fixed them."""

    failed: int
    repair: int
    depth: Literal["shallow", "deep"]


def failed(turn: Turn) -> bool:
    return any(c.outcome in FAILED for c in turn.tool_calls)


def repaired(turn: Turn) -> bool:
    return bool(turn.tool_calls) and all(c.outcome == "ok" for c in turn.tool_calls)


def similarity(a: str, b: str) -> float:
    """``difflib``'s ratio of two calls' code. Example: "12+3" and "12+4" -> 0.75."""
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def find_repairs(turns: Sequence[Turn], threshold: float) -> list[Repair]:
    """The repairs of an episode's turns (module docstring, 1. and 2.), in turn order.

    Example: outcomes (error), (ok), answer -> [Repair(0, 1, ...)]; (error), answer -> []."""
    out, k = [], 0
    while k < len(turns):
        if not failed(turns[k]):
            k += 1
            continue
        j = k + 1
        while j < len(turns) and failed(turns[j]):
            j += 1
        if j < len(turns) and repaired(turns[j]):
            bad = next(c for c in turns[k].tool_calls if c.outcome in FAILED)
            deep = similarity(bad.arguments, turns[j].tool_calls[0].arguments) < threshold
            out.append(Repair(k, j, "deep" if deep else "shallow"))
            k = j + 1
        else:
            k = j
    return out


def call_start(ids: Sequence[int], turn: Turn, decode, calls: Sequence[ToolCall]) -> int:
    """How many of the turn's policy tokens come before its first call (module docstring, 2.): the
    most tokens whose decoded text ends at or before the call's opening tag (0 when none is found)."""
    text = decode(ids[turn.start : turn.end])
    marks = [text.find(m) for m in ["<tool_call>", *(f"<{c.name}>" for c in calls if c.name)]]
    at = min((m for m in marks if m >= 0), default=0)
    n = 0
    while turn.start + n < turn.end and len(decode(ids[turn.start : turn.start + n + 1])) <= at:
        n += 1
    return n


def splice(rollout: Rollout, repairs: Sequence[Repair], decode) -> tuple[Rollout, int]:
    """The rollout with every repair spliced in (module docstring, 3.), and the completion position
    from which its policy tokens need re-scoring. Log-probs are the old ones until re-scored
    (:meth:`Cleaner.apply`)."""
    ids, turns = rollout.completion_ids, rollout.episode.turns
    n = len(ids)
    mask = rollout.loss_mask or (1,) * n
    by_start = {r.failed: r for r in repairs}
    src: list[int] = list(range(turns[0].start))  # the new completion as positions of the old one
    new_turns: list[Turn] = []
    k = 0
    while k < len(turns):
        t, r = turns[k], by_start.get(k)
        start = len(src)
        if r is None:
            src += range(t.start, t.obs_end)
            new_turns.append(dataclasses.replace(t, start=start, end=start + t.end - t.start, obs_end=len(src)))
            k += 1
            continue
        fix = turns[r.repair]
        if r.depth == "deep":
            src += range(fix.start, fix.end)
        else:
            keep = call_start(ids, t, decode, t.tool_calls)
            drop = call_start(ids, fix, decode, fix.tool_calls)
            src += range(t.start, t.start + keep)
            src += range(fix.start + drop, fix.end)
        end = len(src)
        src += range(fix.end, fix.obs_end)
        new_turns.append(Turn(start, end, len(src), fix.reward, fix.tool_calls, t.anchor, fix.patched))
        k = r.repair + 1
    src += range(turns[-1].obs_end, n)
    new_ids = tuple(ids[i] for i in src)
    out = dataclasses.replace(
        rollout,
        completion_ids=new_ids,
        logprobs=tuple(rollout.logprobs[i] for i in src),
        text=decode(new_ids),
        token_versions=None if rollout.token_versions is None else tuple(rollout.token_versions[i] for i in src),
        loss_mask=tuple(mask[i] for i in src),
        entropies=None if rollout.entropies is None else tuple(rollout.entropies[i] for i in src),
        episode=Episode(tuple(new_turns), rollout.episode.end),
    )
    return out, new_turns[repairs[0].failed].start


class Cleaner:
    """The episode pool's CLEANER transform (module docstring); ``threshold`` is ``task.cleaner.threshold``."""

    def __init__(self, threshold: float):
        self.threshold = threshold

    def apply(self, out: list[tuple[Prompt, Rollout]], backend, sampling: Sampling, decode, cost) -> list:
        """``out`` with every repaired episode spliced and re-scored; counts in ``cost`` (a ``StepCost``)."""
        done, todo = list(out), []
        shallow = deep = removed = 0
        for i, (p, r) in enumerate(out):
            if r.episode is None or not r.episode.turns:
                continue
            reps = find_repairs(r.episode.turns, self.threshold)
            if not reps:
                continue
            new, at = splice(r, reps, decode)
            done[i] = (p, new)
            todo.append((i, at))
            shallow += sum(x.depth == "shallow" for x in reps)
            deep += sum(x.depth == "deep" for x in reps)
            removed += len(r.completion_ids) - len(new.completion_ids)
        if not todo:
            return done
        t0 = time.perf_counter()
        rows = [done[i][1] for i, _ in todo]
        scored = backend.score(
            [r.prompt_ids + r.completion_ids for r in rows],
            [len(r.prompt_ids) + at for r, (_, at) in zip(rows, todo)],
            sampling,
        )
        for (i, at), r, lp in zip(todo, rows, scored):
            done[i] = (done[i][0], rescored(r, at, lp))
        cost.count(
            **{
                "cleaner/rows": len(todo),
                "cleaner/shallow": shallow,
                "cleaner/deep": deep,
                "cleaner/tokens_removed": removed,
                "cleaner/score_s": time.perf_counter() - t0,
            }
        )
        return done


def rescored(rollout: Rollout, at: int, scored: Sequence[float]) -> Rollout:
    """The row with the sampler's log-probs ``scored`` (positions ``at..``) on its policy tokens from
    ``at`` on; observation tokens keep 0.0."""
    policy = [0] * len(rollout.completion_ids)
    for t in rollout.episode.turns:
        policy[t.start : t.end] = [1] * (t.end - t.start)
    lp = list(rollout.logprobs)
    for pos in range(at, len(lp)):
        lp[pos] = float(scored[pos - at]) if policy[pos] else 0.0
    return dataclasses.replace(rollout, logprobs=tuple(lp))
