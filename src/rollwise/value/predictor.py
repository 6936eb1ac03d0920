"""A prompt's pass rate under the current policy, predicted before any rollout of it (state zero).

Papers: V0, "A Generalist Value Model for Any Policy at State Zero" (2026): predicts the current
policy's success rate on an unseen prompt from the prompt plus a context of recent (instruction,
performance) pairs that profiles the policy, without parameter updates to follow the policy; and
POISE, "Your Language Model is Its Own Critic" (2026): a lightweight probe on the policy's own
hidden states, trained online alongside the policy. Both are read from their abstracts (issue #31);
every choice below is ours and marked [RECON]:

- features [RECON]: the prompt's last-layer hidden state at its last token (the state the sampler's
  prefill computes; :mod:`rollwise.value.features`), standardised with the bank's mean and std and
  projected to ``proj_dim`` dimensions by a fixed random Gaussian matrix (a probe with few weights
  learns from few observations);
- V0-style context [RECON]: a FIFO bank of the last ``context`` observed (prompt state, group pass
  rate) pairs; the query's context value is the softmax(``tau`` x cosine)-weighted mean pass rate of
  the bank's *other* prompts (never its own visits), plus the bank's overall mean;
- own history [RECON]: when the prompt has been seen, its most recent observed pass rate (a flag and
  the logit), which is what GRESO/V0.5's history stand-in uses alone;
- the model [RECON]: logistic regression on those features, fitted after every step on the whole
  bank (soft targets = observed pass rates, weighted by group size, L2 ``l2``) with ``steps`` full-batch
  Adam iterations warm-started from the previous fit. Each bank entry's features are computed as they
  would have been before it was observed: its context leaves out its own prompt, its "own history"
  is the prompt's previous visit in the bank (none for a first visit). So the probe learns first
  visits and revisits alike, and a first visit is scored from the context and its state alone.

Until ``min_fit`` observations exist it predicts the context value (or 0.5 with an empty bank).
Deviation from POISE: no trajectory states or token-entropy statistics yet (state zero only).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch

EPS = 1e-3  # pass rates are clamped to [EPS, 1 - EPS] before a logit


def logit(p: torch.Tensor) -> torch.Tensor:
    p = p.clamp(EPS, 1.0 - EPS)
    return torch.log(p) - torch.log1p(-p)


class PassRatePredictor:
    def __init__(
        self,
        dim: int,
        proj_dim: int = 16,
        context: int = 512,
        tau: float = 10.0,
        steps: int = 50,
        lr: float = 0.05,
        l2: float = 1e-2,
        min_fit: int = 16,
        seed: int = 0,
    ):
        if dim < 1 or proj_dim < 1 or context < 2:
            raise ValueError(
                f"PassRatePredictor needs dim, proj_dim >= 1 and context >= 2, got {dim}, {proj_dim}, {context}"
            )
        g = torch.Generator().manual_seed(seed)
        self.dim, self.tau, self.steps, self.lr, self.l2, self.min_fit, self.context = (
            dim,
            tau,
            steps,
            lr,
            l2,
            min_fit,
            context,
        )
        self.proj = torch.randn(dim, proj_dim, generator=g, dtype=torch.float64) / math.sqrt(dim)
        self.weights = torch.zeros(
            proj_dim + 4, dtype=torch.float64
        )  # projected state, context, bank mean, seen, own history
        self.bias = torch.zeros((), dtype=torch.float64)
        self.states = torch.zeros(0, dim, dtype=torch.float64)  # the bank, oldest first
        self.rates = torch.zeros(0, dtype=torch.float64)
        self.counts = torch.zeros(0, dtype=torch.float64)
        self.ids: list[str] = []
        self.fitted = False
        self.fit_seconds = 0.0  # cumulative probe-fitting time (the ledger's value/fit_s)

    # ------------------------------------------------------------------ features
    def _unit(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)

    def _context(self, q: torch.Tensor, exclude: torch.Tensor) -> torch.Tensor:
        """(N,) softmax(tau cos)-weighted bank pass rate for each query row, bank entries where
        ``exclude`` (N, M) is True left out; the bank mean where every entry is excluded."""
        sims = self._unit(q) @ self._unit(self.states).T * self.tau
        sims = sims.masked_fill(exclude, float("-inf"))
        empty = exclude.all(dim=1)
        w = torch.softmax(torch.where(empty[:, None], torch.zeros_like(sims), sims), dim=1)
        ctx = w @ self.rates
        return torch.where(empty, self._bank_mean().expand_as(ctx), ctx)

    def _bank_mean(self) -> torch.Tensor:
        if self.rates.numel() == 0:
            return torch.tensor(0.5, dtype=torch.float64)
        return (self.rates * self.counts).sum() / self.counts.sum()

    def _features(self, q: torch.Tensor, ctx: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
        """(N, proj_dim + 4): [projected standardised state, logit ctx, logit bank mean, seen, seen * logit own]."""
        mu = self.states.mean(0) if len(self.states) else torch.zeros(self.dim, dtype=torch.float64)
        sd = self.states.std(0).clamp_min(1e-6) if len(self.states) > 1 else torch.ones(self.dim, dtype=torch.float64)
        z = ((q - mu) / sd) @ self.proj
        seen = (~torch.isnan(own)).to(torch.float64)
        own_logit = torch.where(seen.bool(), logit(torch.nan_to_num(own, nan=0.5)), torch.zeros_like(own))
        mean = logit(self._bank_mean()).expand(len(q))
        return torch.cat([z, logit(ctx)[:, None], mean[:, None], seen[:, None], (seen * own_logit)[:, None]], dim=1)

    def _same(self, prompt_ids: Sequence[str]) -> torch.Tensor:
        """(N, M) bool: query i and bank entry j are the same prompt."""
        codes: dict[str, int] = {}
        bank = torch.tensor([codes.setdefault(b, len(codes)) for b in self.ids], dtype=torch.long)
        query = torch.tensor([codes.get(p, -1) for p in prompt_ids], dtype=torch.long)
        return query[:, None] == bank[None, :]

    def _latest(self) -> dict[str, float]:
        """Each banked prompt's most recent observed pass rate."""
        return {pid: float(r) for pid, r in zip(self.ids, self.rates)}

    def _previous(self) -> torch.Tensor:
        """(M,) for every bank entry, its prompt's pass rate at the visit before it (NaN: first in the bank)."""
        last: dict[str, float] = {}
        out = []
        for pid, r in zip(self.ids, self.rates.tolist()):
            out.append(last.get(pid, math.nan))
            last[pid] = r
        return torch.tensor(out, dtype=torch.float64)

    # ------------------------------------------------------------------ predict / update
    def predict(self, states: torch.Tensor, prompt_ids: Sequence[str]) -> torch.Tensor:
        """(N,) predicted pass rates in (0, 1) for prompts with final-token states (N, dim)."""
        q = self._check(states, prompt_ids)
        if len(self.ids) == 0:
            return torch.full((len(q),), 0.5, dtype=torch.float64)
        ctx = self._context(q, self._same(prompt_ids))
        if not self.fitted:
            return ctx.clamp(EPS, 1.0 - EPS)
        latest = self._latest()
        own = torch.tensor([latest.get(pid, math.nan) for pid in prompt_ids], dtype=torch.float64)
        return torch.sigmoid(self._features(q, ctx, own) @ self.weights + self.bias)

    def update(
        self, states: torch.Tensor, prompt_ids: Sequence[str], rates: Sequence[float], counts: Sequence[int]
    ) -> dict:
        """Add observed groups (their prompts' states, pass rates, group sizes) to the bank and refit;
        returns ``{"value/fit_s", "value/bank", "value/train_loss"}``."""
        q = self._check(states, prompt_ids)
        if len(rates) != len(q) or len(counts) != len(q):
            raise ValueError(
                f"update needs one rate and one count per prompt: {len(q)} prompts, "
                f"{len(rates)} rates, {len(counts)} counts"
            )
        t0 = time.perf_counter()
        self.states = torch.cat([self.states, q])[-self.context :]
        self.rates = torch.cat([self.rates, torch.tensor(list(rates), dtype=torch.float64)])[-self.context :]
        self.counts = torch.cat([self.counts, torch.tensor(list(counts), dtype=torch.float64)])[-self.context :]
        self.ids = (self.ids + list(prompt_ids))[-self.context :]
        loss = math.nan
        if len(self.ids) >= self.min_fit:
            loss = self._fit()
            self.fitted = True
        dt = time.perf_counter() - t0
        self.fit_seconds += dt
        return {"value/fit_s": dt, "value/bank": len(self.ids), "value/train_loss": loss}

    def _fit(self) -> float:
        ctx = self._context(self.states, self._same(self.ids))  # as before the entry was observed: no own visit
        own = self._previous()
        x = self._features(self.states, ctx, own)
        w = self.counts / self.counts.sum()
        params = [self.weights.clone().requires_grad_(True), self.bias.clone().requires_grad_(True)]
        opt = torch.optim.Adam(params, lr=self.lr)
        for _ in range(self.steps):
            opt.zero_grad()
            z = x @ params[0] + params[1]
            bce = torch.nn.functional.binary_cross_entropy_with_logits(z, self.rates, weight=w, reduction="sum")
            (bce + self.l2 * params[0].pow(2).sum()).backward()
            opt.step()
        self.weights, self.bias = params[0].detach(), params[1].detach()
        return float(bce.detach())

    def _check(self, states: torch.Tensor, prompt_ids: Sequence[str]) -> torch.Tensor:
        if states.dim() != 2 or states.shape[1] != self.dim or states.shape[0] != len(prompt_ids):
            raise ValueError(
                f"states must be (N, {self.dim}) with one prompt id per row, got {tuple(states.shape)} "
                f"and {len(prompt_ids)} ids"
            )
        return states.detach().to(torch.float64).cpu()

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        return {
            "weights": self.weights.clone(),
            "bias": self.bias.clone(),
            "states": self.states.clone(),
            "rates": self.rates.clone(),
            "counts": self.counts.clone(),
            "ids": list(self.ids),
            "fitted": self.fitted,
            "fit_seconds": self.fit_seconds,
        }

    def load_state_dict(self, d: dict) -> None:
        self.weights, self.bias = d["weights"].clone(), d["bias"].clone()
        self.states, self.rates, self.counts = d["states"].clone(), d["rates"].clone(), d["counts"].clone()
        self.ids, self.fitted, self.fit_seconds = list(d["ids"]), bool(d["fitted"]), float(d["fit_seconds"])
