"""The trainer: turns a ``Batch`` into one optimizer step. It knows nothing of the algorithm:
advantages are in the batch, the objective is a function chosen by name.

Micro-batching is exact: each micro-batch's loss is already divided by the global count of
the optimizer step (``Batch.num_loss_tokens`` / ``num_sequences``), so gradients are summed,
never averaged, across micro-batches (DESIGN.md §9.6).
"""

from __future__ import annotations

import copy
import dataclasses
import math

import torch

from rollwise.types import Batch


def token_logprobs(model, batch: Batch, temperature: float, with_entropy: bool = False):
    """(B, T) log-probs of ``input_ids`` under ``model`` (position 0 gets 0) and optional entropy."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits[:, :-1].float()
    if temperature > 0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    lp = logp.gather(2, batch.input_ids[:, 1:, None])[..., 0]
    lp = torch.nn.functional.pad(lp, (1, 0))
    if not with_entropy:
        return lp, None
    ent = -(logp.exp() * logp).sum(-1)
    return lp, torch.nn.functional.pad(ent, (1, 0))


class Trainer:
    def __init__(self, model, objective, options, train_cfg, temperature: float):
        self.model = model
        self.objective, self.options = objective, options
        self.cfg = train_cfg
        self.temperature = temperature
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=train_cfg.lr, betas=tuple(train_cfg.betas), weight_decay=train_cfg.weight_decay)
        warm = max(1, train_cfg.warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: min(1.0, (s + 1) / warm))
        self.ref_model = None
        if getattr(options, "kl_coef", 0.0):
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)

    def micro_batches(self, batch: Batch):
        mb = self.cfg.micro_batch
        for start in range(0, batch.size, mb):
            yield batch.rows(slice(start, start + mb))

    @torch.no_grad()
    def _with_reference(self, mb: Batch) -> Batch:
        if self.ref_model is None:
            return mb
        return dataclasses.replace(mb, ref_logprobs=token_logprobs(self.ref_model, mb, self.temperature)[0])

    def optimize(self, batch: Batch) -> dict[str, float]:
        """One optimizer step over ``batch``; returns ``train/*`` metrics."""
        if batch.num_loss_tokens == 0:
            return {"train/loss": 0.0, "train/skipped": 1.0}
        self.model.train()
        sums: dict[str, float] = {}
        loss_total = 0.0
        for mb in self.micro_batches(batch):
            if mb.loss_mask.sum() == 0:
                continue
            mb = self._with_reference(mb)
            new_lp, ent = token_logprobs(self.model, mb, self.temperature, with_entropy=True)
            out = self.objective(mb, new_lp, self.options, entropy=ent)
            out.loss.backward()
            loss_total += float(out.loss.detach())
            for k, v in out.metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v)
            sums["entropy_sum"] = sums.get("entropy_sum", 0.0) + float((ent.detach() * mb.loss_mask).sum())
        params = [p for p in self.model.parameters() if p.requires_grad]
        clip = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        metrics = {"train/loss": loss_total, "train/grad_norm": grad_norm, "train/lr": self.scheduler.get_last_lr()[0]}
        for k, v in sums.items():
            if k.endswith("_sum"):  # objectives report sums over loss tokens
                metrics["train/" + k.removesuffix("_sum")] = v / batch.num_loss_tokens
        return metrics

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, s: dict) -> None:
        self.optimizer.load_state_dict(s["optimizer"])
        self.scheduler.load_state_dict(s["scheduler"])

