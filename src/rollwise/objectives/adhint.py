"""``adhint``: ADHint's split-group advantage (AE-RDP) and selective hint masking.

Paper: "Adaptive Hints with Difficulty Priors for Reinforcement Learning" (ADHint),
arXiv 2512.13095; guidance.md §7b. The controller half (hint prefixes, difficulty-scheduled hint
ratio) is :mod:`rollwise.control.adhint`; it marks each hinted rollout with its hint length
(``Verdict.details["hint_tokens"]``), which reaches this estimator as the ``hint_tokens`` input.

Per prompt group, naive rows (no hint) and hinted rows are **not** pooled [SEC]:

1. ``A_N`` = GRPO over the naive rows, ``A_H`` = GRPO over the hinted rows (``grpo`` options);
2. [RECON placeholder, the spec's] with ``Diff_N = 1 - mean r_naive`` and ``Diff_H = 1 - mean r_hinted``:
   naive positives ``A <- A (1 + Diff_N)`` (a hard prompt's own successes count more), hinted
   negatives ``A <- A (1 + (1 - Diff_H))`` (failing despite an easy hint is punished more);
3. the prompt's advantages are divided by their std (``std`` option) taken over the rows of its
   non-degenerate subgroups, so a subgroup with all-equal rewards (advantage 0) changes nothing
   for the other one (our reading of "rescale to unit std" that keeps the spec's property);
4. selective masking [SEC]: a hinted row with a negative advantage gets no gradient on its hint
   tokens (``Advantages.token_include`` False there); with ``train_hint_tokens = false`` no hint
   token is ever trained.

Properties (§7b.3): subgroups normalised separately; an all-correct hinted subgroup has A_H = 0
and leaves the naive advantages unchanged; hint tokens of negative hinted rows get zero gradient.
With no hinted rows, step 3 rescales GRPO's advantages by the std of the scaled ones.
"""

from __future__ import annotations

import torch
from pydantic import Field

from rollwise.objectives.advantages import GrpoOptions, grpo
from rollwise.objectives.groups import Groups
from rollwise.types import Advantages


class AdhintOptions(GrpoOptions):
    train_hint_tokens: bool = Field(
        True,
        description="Hint tokens of a hinted row with A >= 0 enter the loss (ratio pi_theta / 1, "
        "behaviour probability 1); false masks every hint token (SEELE's choice).",
    )


def adhint(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    opts: AdhintOptions | None = None,
    *,
    hint_tokens: torch.Tensor | None = None,
    completion_lengths: torch.Tensor | None = None,
) -> Advantages:
    """AE-RDP advantages with selective hint masking (module docstring)."""
    opts = opts or AdhintOptions()
    if hint_tokens is None or completion_lengths is None:
        raise ValueError(
            "advantage 'adhint' needs hint_tokens and completion_lengths (B,) (rollwise.objectives.inputs)"
        )
    if hint_tokens.shape != rewards.shape or completion_lengths.shape != rewards.shape:
        raise ValueError(f"hint_tokens / completion_lengths must be (B,) like rewards {tuple(rewards.shape)}")
    hinted = hint_tokens > 0
    gdense = Groups.of(group_index).inverse
    sub = gdense * 2 + hinted.long()  # naive and hinted rows of a prompt are separate subgroups
    grpo_opts = GrpoOptions(**{k: getattr(opts, k) for k in GrpoOptions.model_fields})
    base = grpo(rewards, sub, grpo_opts)
    a = base.values.clone()
    subgroups = Groups.of(sub)
    diff = 1.0 - subgroups.mean(rewards)  # Diff_N on naive rows, Diff_H on hinted rows
    a = torch.where(~hinted & (a > 0), a * (1.0 + diff), a)
    a = torch.where(hinted & (a < 0), a * (2.0 - diff), a)
    live = ~subgroups.constant(rewards) & (subgroups.count(rewards) > 1)
    prompts = Groups.of(gdense)
    w = live.to(a.dtype)
    n = prompts.sum(w)
    mean = prompts.sum(a * w) / n.clamp(min=1.0)
    ss = prompts.sum(((a - mean) ** 2) * w)
    denom = (n - 1.0) if opts.std == "unbiased" else n
    std = torch.where(denom > 0, (ss / denom.clamp(min=1.0)).sqrt(), torch.zeros_like(ss))
    a = torch.where(std > 0, a / (std + opts.eps), a)
    width = int(completion_lengths.max().item()) if completion_lengths.numel() else 0
    pos = torch.arange(width)[None, :]
    in_hint = pos < hint_tokens[:, None]
    masked_rows = hinted if not opts.train_hint_tokens else hinted & (a < 0)
    token_include = ~(in_hint & masked_rows[:, None])
    return Advantages(a, base.include, token_include=token_include)


adhint.Options = AdhintOptions  # type: ignore[attr-defined]
adhint.inputs = ("hint_tokens", "completion_lengths")  # type: ignore[attr-defined]
