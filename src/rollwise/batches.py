"""Groups -> the trainer's batch, one owner (docs/architecture.md §1): :class:`Batches`, built by the
assembler (``rollwise.components.assemble``) from records and services, used by the loop and by
periodic asynchrony's streaming trainer (``rollwise.trainer.streaming``) alike. In order:

1. ``filter``: the filter chain (``rollwise.filter.chain``), the surplus over dynamic sampling's
   target, the controller's ``finish_batch``;
2. ``build``: rows, rewards shaped (``rollwise.reward``: DAPO's overlong penalty, KL in the reward,
   FAPO), the advantage context (inputs that need the trainer or the controller, Prompt-GDRO's row
   weights; ``objectives.inputs``), the estimator (a pure function of rewards, group ids, options
   and that context) and the padded tensors (``rollwise.collate``);
3. ``downsample``: D3S's row and token selection (``batch.d3s``; off by default).

The loop calls them in that order, with the controller's ``observe``, the replay mix and the
pass-rate predictor's ``observe`` between them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rollwise.collate import collate, flatten
from rollwise.filter.chain import apply_filters
from rollwise.objectives.inputs import advantage_context, advantage_inputs
from rollwise.types import Advantages, Services


@dataclass
class Batches:
    """What turns a step's groups into the trainer's batch. ``filters``, ``keep_at_most``,
    ``controller``, ``advantage`` and ``advantage_options`` are the run's strategies
    (``components.Strategies``); ``services`` the assembled run's (the codec's pad id, the trainer's
    reference log-probs and token entropies, the task's training prompts); ``reward`` the
    ``reward`` section, ``d3s`` the ``batch.d3s`` options, ``steps`` ``train.steps``."""

    filters: list
    controller: Any
    advantage: Any
    advantage_options: Any
    services: Services
    reward: Any
    max_new_tokens: int
    d3s: Any
    steps: int
    keep_at_most: int | None = None

    def filter(self, groups):
        """``(kept, dropped)``: the training groups of a step and a Counter of drop reasons."""
        return apply_filters(self.filters, groups, self.keep_at_most, self.controller)

    def build(self, groups):
        """The trainer's batch of ``groups``: ``(rows, batch, shaping metrics, advantages)``,
        ``advantages`` the estimator's before the context's row weights."""
        rows, rewards, gidx = flatten(groups)
        rewards, shaping = self.shape_rewards(rows, rewards)
        opts = self.advantage_options
        context = advantage_context(self.advantage, rows, self.services, self.controller, gidx, opts)
        inputs = advantage_inputs(self.advantage, rows, context, opts)
        advs = self.advantage(rewards, gidx, self.advantage_options, **inputs)
        batch = collate(rows, rewards, gidx, apply_row_weights(advs, context.weights), self.services.codec.pad_id)
        return rows, batch, shaping, advs

    def stream(self, groups):
        """Periodic asynchrony's batch of ``groups`` as they arrive (the filters, then ``build``),
        or None when every group is dropped."""
        kept, _ = apply_filters(self.filters, groups)
        return self.build(kept)[1] if kept else None

    def shape_rewards(self, rows, rewards):
        """The step's shaped rewards and ``reward/*`` metrics (``rollwise.reward``); the KL term
        needs the trainer's no-grad policy and reference log-probs, computed only when it is on."""
        from rollwise import reward

        rc, pad = self.reward, self.services.codec.pad_id
        kl = reward.reference_kl(rows, self.services.trainer, rc.kl.estimator, pad) if rc.kl.coef else None
        prompts = None
        if rc.fapo.enabled:  # the flaw detector sees the training prompt (never a held-out one)
            prompts = {p.id: p for p in self.services.task.train_prompts()}
        return reward.shape(rows, rewards, rc, self.max_new_tokens, kl, prompts)

    def downsample(self, batch, rows, step: int):
        """D3S row and token selection of the step's batch (``batch.d3s``); the batch unchanged and
        no metrics when it is off. Token entropies are read or computed (``Trainer.token_entropy``, a
        no-grad forward) only while rho_k < 1."""
        opts = self.d3s
        if not opts.enabled:
            return batch, {}
        from rollwise.batch import d3s

        ent, from_trainer = None, 0.0
        if d3s.needs_entropy(step, self.steps, opts):  # rho_k < 1: after the ramp, no forward
            ent = d3s.sampler_entropy(rows, batch) if opts.entropy == "sampler" else None
            if ent is None:  # not recorded (other backends, continued prefixes) or asked for: pi_theta, no grad
                ent, from_trainer = self.services.trainer.token_entropy(batch), 1.0
        batch, metrics = d3s.apply(batch, ent, step, self.steps, opts)
        return batch, {**metrics, "d3s/entropy_from_trainer": from_trainer}


def apply_row_weights(advs: Advantages, weights: torch.Tensor | None) -> Advantages:
    """``advs`` with each row's advantage (and its per-token advantages) multiplied by ``weights``
    (B,); ``advs`` itself when ``weights`` is None."""
    if weights is None:
        return advs
    wt = weights.to(advs.values.dtype)
    tok = None if advs.token_values is None else advs.token_values * wt[:, None].to(advs.token_values.dtype)
    return Advantages(advs.values * wt, advs.include, token_values=tok, token_include=advs.token_include)
