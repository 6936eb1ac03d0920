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

5. CGM, consistency-based gradient modulation (``cgm = true``; off by default): the intent is the
   paper's [SEC] (hint tokens inconsistent with the policy's own distribution must not drive biased
   updates; one research note says consistency compares a hint token's entropy with the
   continuation's mean entropy); the formula is the spec's reconstruction [RECON], not the paper's::

       g_t = exp(-|H_t - mean_cont H| / mean_cont H)   on the hint tokens t of a hinted row
       g_t = 1                                         on its continuation and on naive rows

   ``H`` is the full-vocabulary entropy of the current (pre-update) policy at each completion
   position, from one no-grad forward of the hinted rows (``objectives.inputs.policy_entropy``: hint
   tokens were never sampled, so the sampler has no entropy for them). A hint token whose entropy
   equals the continuation's mean keeps its full weight; one twice (or zero times) as uncertain gets
   ``1/e``. ``g`` multiplies the row's advantage per token (``Advantages.token_values``). A hinted row
   with no continuation token (the hint is the whole completion) has no mean and keeps ``g = 1``;
   a continuation of zero mean entropy (a deterministic policy) keeps only hint tokens of zero entropy.

Properties (§7b.3): subgroups normalised separately; an all-correct hinted subgroup has A_H = 0
and leaves the naive advantages unchanged; hint tokens of negative hinted rows get zero gradient.
With no hinted rows, step 3 rescales GRPO's advantages by the std of the scaled ones. CGM:
``g = 1`` where a hint token is as uncertain as the continuation, decreasing in the gap, in (0, 1].
"""

from __future__ import annotations

import torch
from pydantic import Field, model_validator

from rollwise.objectives.advantages import GrpoOptions, grpo
from rollwise.objectives.groups import Groups
from rollwise.types import Advantages


class AdhintOptions(GrpoOptions):
    train_hint_tokens: bool = Field(
        True,
        description="Hint tokens of a hinted row with A >= 0 enter the loss (ratio pi_theta / 1, "
        "behaviour probability 1); false masks every hint token (SEELE's choice).",
    )
    cgm: bool = Field(
        False,
        description="CGM (consistency-based gradient modulation, spec [RECON]): weight each hint token's advantage "
        "by exp(-|H_t - mean H_cont| / mean H_cont), H the current policy's entropy (one no-grad forward of the "
        "hinted rows per step).",
    )

    @model_validator(mode="after")
    def _cgm_needs_hint_tokens(self):
        if self.cgm and not self.train_hint_tokens:
            raise ValueError(
                "cgm = true weights the hint tokens' gradients, but train_hint_tokens = false masks every hint token: "
                "set one of them differently"
            )
        return self


def cgm_weights(entropy: torch.Tensor, hint_tokens: torch.Tensor, completion_lengths: torch.Tensor) -> torch.Tensor:
    """(B, L) CGM weights (module docstring, step 5) from (B, L) per-position policy entropies, each
    row's hint length and completion length (B,). Example: continuation entropies [1, 1] (mean 1),
    hint entropies [1, 2, 0.5] -> hint weights [1, exp(-1), exp(-0.5)], continuation weights 1."""
    width = entropy.shape[1]
    pos = torch.arange(width)[None, :]
    in_hint = pos < hint_tokens[:, None]
    in_cont = (pos >= hint_tokens[:, None]) & (pos < completion_lengths[:, None])
    n_cont = in_cont.sum(dim=1)
    mean_cont = (entropy * in_cont).sum(dim=1) / n_cont.clamp(min=1)
    ref = mean_cont[:, None]
    gap = (entropy - ref).abs()
    # a zero-entropy continuation: 0/0 = consistent (weight 1), x/0 = fully inconsistent (weight 0)
    ratio = torch.where(ref > 0, gap / ref.clamp(min=1e-12), torch.where(gap > 0, torch.inf, 0.0))
    g = torch.exp(-ratio)
    modulated = in_hint & (n_cont > 0)[:, None]
    return torch.where(modulated, g, torch.ones_like(g))


def adhint(
    rewards: torch.Tensor,
    group_index: torch.Tensor,
    opts: AdhintOptions | None = None,
    *,
    hint_tokens: torch.Tensor | None = None,
    completion_lengths: torch.Tensor | None = None,
    policy_entropy: torch.Tensor | None = None,
) -> Advantages:
    """AE-RDP advantages with selective hint masking and, with ``cgm``, CGM's per-token weights
    (module docstring); ``policy_entropy`` (B, L) is needed only then."""
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
    token_values = None
    if opts.cgm:
        if policy_entropy is None or policy_entropy.shape[0] != rewards.shape[0]:
            raise ValueError(
                "advantage 'adhint' with cgm = true needs policy_entropy (B, L) (rollwise.objectives.inputs)"
            )
        ent = torch.zeros((rewards.shape[0], width), dtype=torch.float32)
        w = min(width, policy_entropy.shape[1])
        ent[:, :w] = policy_entropy[:, :w].float()
        token_values = a[:, None] * cgm_weights(ent, hint_tokens, completion_lengths).to(a.dtype)
    return Advantages(a, base.include, token_values=token_values, token_include=token_include)


def _inputs_for(opts: AdhintOptions | None) -> tuple[str, ...]:
    """The policy's entropies (a forward pass of the hinted rows) only when CGM is on."""
    base = ("hint_tokens", "completion_lengths")
    return base + ("policy_entropy",) if opts is not None and opts.cgm else base


adhint.Options = AdhintOptions  # type: ignore[attr-defined]
adhint.inputs = _inputs_for(None)  # type: ignore[attr-defined]
adhint.inputs_for = _inputs_for  # type: ignore[attr-defined]
