"""What the eager and the static decode paths share (``rollwise.backends.hf``,
``rollwise.backends.static_decode``): the sampled distribution (temperature / top-p log-probs), the
inverse-CDF draw that reads one uniform per (row, step), the entropy, and the completions read
back from the decode buffers."""

from __future__ import annotations

import dataclasses

import torch

from rollwise.types import Completion, Sampling


def completions(new_ids, new_lp, new_ent, n_new, lim, pruned, stopped: bool, eos_set) -> list[Completion]:
    """One ``Completion`` per row from the (B, steps) ids / log-probs / entropies (None: not
    recorded) and the (B,) counts of new tokens, budgets and decode-hook cuts: finish "stop" when
    the last id is an EOS, "partial" when the hook cut the row or ``stopped`` (APRIL's stop)
    came before its budget, else "length"."""
    n_new, lim, pruned = n_new.tolist(), lim.tolist(), pruned.tolist()
    ids, lps = new_ids.cpu(), new_lp.cpu()
    result = []
    for i, n in enumerate(n_new):
        toks = tuple(ids[i, :n].tolist())
        finish = "stop" if n and toks[-1] in eos_set else "length"
        if stopped and finish == "length" and n < lim[i]:
            finish = "partial"
        if pruned[i]:
            finish = "partial"
        result.append(Completion(toks, tuple(lps[i, :n].tolist()), finish))
    if new_ent is not None:
        ent = new_ent.cpu()
        result = [
            dataclasses.replace(c, entropies=tuple(ent[i, : len(c.token_ids)].tolist())) for i, c in enumerate(result)
        ]
    return result


def sample_rows(
    logits: torch.Tensor,
    sampling: Sampling,
    logp: torch.Tensor,
    u: torch.Tensor | None,
    cdf_dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row by inverse CDF: row i takes the first token whose cumulative
    probability under ``logp`` (the sampled distribution, fp32) exceeds ``u[i]`` times the row's
    total (so rounding of the total cannot push past the end); a token of probability 0 (top-p
    removed) has an empty interval and is never drawn. Temperature <= 0 (``u`` None) is greedy.
    ``cdf_dtype``: the eager sampler sums in float64; the static path (``static_decode``) in
    float32, which a CUDA graph runs at full speed (a CPU cumsum accumulates float32 in double
    anyway, so on a CPU the two differ only by the final rounding of each cumulative value).
    Returns (ids (B,), their log-probs (B,))."""
    if sampling.temperature <= 0 or u is None:
        tok = logits.argmax(dim=-1)
    else:
        cdf = logp.exp().to(cdf_dtype).cumsum(dim=-1)
        x = u.to(cdf.device, cdf_dtype) * cdf[:, -1]
        tok = torch.searchsorted(cdf, x[:, None], right=True)[:, 0].clamp(max=logp.shape[-1] - 1)
    return tok, logp.gather(1, tok[:, None])[:, 0]


def sample_next(
    logits: torch.Tensor, sampling: Sampling, gen: torch.Generator, logp: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; return (ids (B,), log-probs (B,)) under the sampled distribution
    (``logp``, default ``sampling_logprobs(logits, sampling)``; temperature <= 0 is greedy)."""
    if logp is None:
        logp = sampling_logprobs(logits, sampling)
    if sampling.temperature <= 0:
        tok = logits.argmax(dim=-1)
    else:
        probs = logp.exp()
        if probs.device != gen.device:  # a CPU generator keeps sampling reproducible on any device
            probs = probs.float().cpu()
        tok = torch.multinomial(probs, 1, generator=gen)[:, 0].to(logp.device)
    return tok, logp.gather(1, tok[:, None])[:, 0]


def top_p_logprobs(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose mass reaches ``top_p``; renormalise."""
    sorted_lp, order = logp.sort(dim=-1, descending=True)
    cum = sorted_lp.exp().cumsum(dim=-1)
    drop_sorted = (cum - sorted_lp.exp()) >= top_p  # mass before this token already reaches top_p
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    kept = logp.masked_fill(drop, float("-inf"))
    return kept - torch.logsumexp(kept, dim=-1, keepdim=True)


def sampling_logprobs(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """(B, V) log-probs of the distribution ``sample_next`` draws from (temperature-scaled, top-p
    renormalised; temperature <= 0 reports temperature-1 log-probs), for scoring a token that was
    chosen rather than sampled (``rollwise.generate.latr``)."""
    if sampling.temperature <= 0:
        return torch.log_softmax(logits, dim=-1)
    logp = torch.log_softmax(logits / sampling.temperature, dim=-1)
    return top_p_logprobs(logp, sampling.top_p) if sampling.top_p < 1.0 else logp


def entropy(logp: torch.Tensor) -> torch.Tensor:
    """(B,) entropy of each row of (B, V) log-probs (``sampling_logprobs``: the distribution
    ``sample_next`` draws from); tokens top-p removed (-inf) contribute 0."""
    return -torch.where(torch.isfinite(logp), logp.exp() * logp, torch.zeros_like(logp)).sum(-1)
