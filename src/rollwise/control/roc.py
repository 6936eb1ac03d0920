"""``roc``: GRPO-RoC's Resample-on-Correct rollout strategy (issue #30).

Paper: Shang et al., "rStar2-Agent: Agentic Reasoning Technical Report", arXiv 2508.20722 (GRPO-RoC).
Outcome-only rewards reinforce correct trajectories that stumbled through tool errors; RoC
oversamples each group and keeps the *cleanest* successes while downsampling the failures
uniformly, so failures stay diverse and successes are high quality. The details below follow the
authors' released code (its ``resample_of_correct`` and ``reject_equal_reward``), which the paper's
prose summarises; where rollwise's records differ from the code's text parsing it is marked
[reconstruction].

Per step (prompts drawn as ``uniform`` does):

1. **Oversample.** ``plan`` asks ``oversample * rollouts_per_prompt`` rollouts per prompt
   (paper: 2G generated, G trained; G = ``control.rollouts_per_prompt``). The per-step rollout
   budget defaults to ``prompts_per_step * oversample * rollouts_per_prompt``.
2. **Drop all-equal groups** (after the filters, ``finish_batch``): a group whose verified rewards
   are all equal (or that has fewer than two) carries no GRPO signal and is dropped, counted as
   ``filter/roc_all_equal`` (``drop_equal``; the code's ``reject_equal_reward``).
3. **Shares** of a group of n verified rollouts, ``n_f`` failed (reward <= ``success_above``; the
   code: reward <= 0) and ``n_s`` successful, downsampled to G: ``k_f = round(n_f * G / n)``
   failures (Python's half-to-even rounding, as the code), at least ``min(min_failed, n_f)``,
   and ``k_s = G - k_f`` successes, at least ``min(min_success, n_s)`` (then ``k_f = G - k_s``):
   the oversampled group's failure share, kept. The code rounds both shares and asserts they sum
   to G (false for some odd G); rollwise derives ``k_s`` from ``k_f``. The code's minimums are
   options that default off (its example scripts use 2); rollwise defaults them to 1, so a mixed
   group stays mixed (a group with one failure in 16 would otherwise lose it to rounding).
4. **Failures: uniform.** ``k_f`` of the failures, uniformly without replacement (the paper:
   "uniformly downsample"; the code keeps the first ``k_f`` in generation order, which for
   i.i.d. rollouts is the same distribution). The draw's RNG is
   ``random.Random("roc:<run seed>:<prompt id>:<crc32 of the group's token ids>")``: the same group
   gives the same draw after a resume or when plans are drawn ahead, so there is no checkpoint
   state beyond ``uniform``'s.
5. **Successes: by quality.** The ``k_s`` successes with the smallest penalty
   ``p = p_err + p_format`` (ties by index; the code sorts stably by the same sum):

   - ``p_err`` (``error_penalty``): the share of the rollout's tool calls
     (``Rollout.episode`` → ``ToolCall.outcome``) that are not ``"ok"``; ``no_tool_penalty`` (0.5,
     the code's value: tool use is encouraged) when it made none. The code counts tool responses
     whose text contains "error" [reconstruction: the outcome record instead];
   - ``p_format`` (``format_penalty``): the code penalises a missing or repeated answer tag
     (``min((answers - 1) / turns, 1)``, 1 when missing). [reconstruction] Here: the share of the
     episode's turns whose tool calls include a ``"parse_error"`` (a malformed call), plus 1 when
     the verifier reports no answer (``Verdict.reason == "no_answer"``), at most 1. A parse error
     thus counts in both terms (a failed call and a format fault).

   A group with at most G verified rollouts is kept whole (the code drops a group that came back
   with fewer than G; rollwise keeps what the budget allowed). Unverified rollouts are left out
   of a downsampled group (they never train).

Metrics: ``control/roc_dropped_rollouts`` (rollouts removed by downsampling) and
``control/roc_kept_success_penalty`` / ``control/roc_success_penalty`` (mean penalty of the kept
successes / of all successes of the downsampled groups). ``observe`` sees every generated rollout.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from rollwise.control.source import PromptSource
from rollwise.control.uniform import Uniform
from rollwise.registry import Compat
from rollwise.types import Group, Plan, Prompt, Request, Rollout


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    oversample: int = Field(2, ge=1, description="Rollouts generated per trained rollout (paper: 2, i.e. 2G for G).")
    error_penalty: bool = Field(True, description="Rank successes by their share of tool calls that failed (p_err).")
    format_penalty: bool = Field(True, description="Rank successes by their format faults (p_format).")
    no_tool_penalty: float = Field(
        0.5, ge=0.0, description="p_err of a rollout that made no tool call (released code: 0.5)."
    )
    min_failed: int = Field(1, ge=0, description="Failures a downsampled group keeps at least (when it has them).")
    min_success: int = Field(1, ge=0, description="Successes a downsampled group keeps at least (when it has them).")
    success_above: float = Field(0.0, description="A rollout succeeds when its reward is above this (code: > 0).")
    drop_equal: bool = Field(True, description="Drop groups whose verified rewards are all equal (no GRPO signal).")


def penalty(r: Rollout, opts: Options) -> float:
    """``p_err + p_format`` of one rollout (module docstring, 5.). Example: calls (ok, error) over
    two turns -> p_err 0.5, p_format 0; (parse_error, ok) over two turns -> 0.5 + 0.5 = 1.0; no calls -> 0.5."""
    calls = r.episode.tool_calls if r.episode is not None else ()
    p = 0.0
    if opts.error_penalty:
        p += sum(c.outcome != "ok" for c in calls) / len(calls) if calls else opts.no_tool_penalty
    if opts.format_penalty:
        turns = r.episode.turns if r.episode is not None and r.episode.turns else ()
        bad = sum(any(c.outcome == "parse_error" for c in t.tool_calls) for t in turns)
        no_answer = r.verdict is not None and r.verdict.reason == "no_answer"
        p += min(1.0, bad / max(len(turns), 1) + (1.0 if no_answer else 0.0))
    return p


def shares(n_failed: int, n_success: int, keep: int, opts: Options) -> tuple[int, int]:
    """``(k_f, k_s)``, failures and successes kept of a group downsampled to ``keep`` (module
    docstring, 3.). Examples (keep 4 of 8): 2 failed -> (1, 3); 3 failed -> round(1.5) = 2 -> (2, 2);
    1 failed -> round(0.5) = 0, raised to min_failed 1 -> (1, 3); 7 failed -> round(3.5) = 4, then
    min_success 1 -> (3, 1)."""
    n = n_failed + n_success
    k_f = max(round(n_failed * keep / n), min(opts.min_failed, n_failed))
    k_s = keep - k_f
    if k_s < min(opts.min_success, n_success):
        k_s = min(opts.min_success, n_success)
        k_f = keep - k_s
    k_f = min(k_f, n_failed)
    k_s = min(keep - k_f, n_success)
    return keep - k_s, k_s


def downsample(rollouts: Sequence[Rollout], keep: int, rng: random.Random, opts: Options) -> list[int]:
    """Indices (ascending) of the ``keep`` rollouts of a verified group that RoC trains on."""
    success = [i for i, r in enumerate(rollouts) if r.reward > opts.success_above]
    failed = [i for i, r in enumerate(rollouts) if r.reward <= opts.success_above]
    k_f, k_s = shares(len(failed), len(success), keep, opts)
    best = sorted(success, key=lambda i: (penalty(rollouts[i], opts), i))[:k_s]
    return sorted(best + rng.sample(failed, k_f))


def group_rng(seed: int, group: Group) -> random.Random:
    """The failures' RNG of one group: a function of the run seed, the prompt and the group's tokens."""
    crc = 0
    for r in group.rollouts:
        crc = zlib.crc32(repr((r.completion_ids, r.reward)).encode(), crc)
    return random.Random(f"roc:{seed}:{group.prompt.id}:{crc}")


class RoC(Uniform):
    """GRPO-RoC: ``uniform``'s prompts with oversampled groups, downsampled after the filters."""

    Options = Options
    compat = Compat(batch_statistics=True, dynamic_sampling=False)  # finish_batch changes the kept groups

    def __init__(self, prompts: Sequence[Prompt], cfg, options: Options | None, seed: int):
        self.cfg = cfg
        self.opts = options or Options()
        self.seed = seed
        self.keep = cfg.rollouts_per_prompt
        self.source = PromptSource(prompts, seed, cfg, cfg.prompts_per_step * self.opts.oversample * self.keep)
        self.metrics: dict[str, float] = {}

    def plan(self, prompts: list[Prompt], state) -> Plan:
        return self.source.cap([Request(p, self.opts.oversample * self.keep) for p in prompts])

    def finish_batch(self, groups: list[Group], kept: list[Group], dropped) -> list[Group]:
        out, removed, all_p, kept_p = [], 0, [], []
        for g in kept:
            if self.opts.drop_equal and g.is_zero_variance():
                dropped["roc_all_equal"] += 1
                continue
            verified = [r for r in g.rollouts if r.reward is not None]
            if len(verified) <= self.keep:
                out.append(g)
                continue
            idx = downsample(verified, self.keep, group_rng(self.seed, g), self.opts)
            chosen = set(idx)
            for i, r in enumerate(verified):
                if r.reward > self.opts.success_above:
                    all_p.append(penalty(r, self.opts))
                    if i in chosen:
                        kept_p.append(all_p[-1])
            removed += g.size - len(idx)
            out.append(Group(g.prompt, tuple(verified[i] for i in idx)))
        self.metrics = {
            "control/roc_dropped_rollouts": float(removed),
            "control/roc_success_penalty": sum(all_p) / len(all_p) if all_p else 0.0,
            "control/roc_kept_success_penalty": sum(kept_p) / len(kept_p) if kept_p else 0.0,
        }
        return out
