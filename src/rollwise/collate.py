"""From groups to trainer tensors: ``flatten`` (rewards and group ids for the advantage
estimator) and ``collate`` (the padded ``Batch``). Rollouts that could not be verified are
left out here (and counted in the ledger by the pool); they are never scored 0.

On the ground floor (docs/architecture.md §4): the batch builder (``rollwise.batches``) collates the
step's batch, and every stage that scores rows with the trainer's log-probs lays them out the same
way (KL in the reward, ``reward/shaping.py``; ACE's confidence shift, ``objectives/inputs.py``;
SAPO's shared rows, ``replay/sapo.py``), one layout written once.
"""

from __future__ import annotations

import torch

from rollwise.types import Advantages, Batch, Group, Rollout


def flatten(groups: list[Group]) -> tuple[list[Rollout], torch.Tensor, torch.Tensor]:
    rows, rewards, gidx = [], [], []
    for gi, g in enumerate(groups):
        for r in g.rollouts:
            if r.reward is not None:
                rows.append(r)
                rewards.append(float(r.reward))
                gidx.append(gi)
    return rows, torch.tensor(rewards, dtype=torch.float32), torch.tensor(gidx, dtype=torch.long)


def collate(rows: list[Rollout], rewards: torch.Tensor, gidx: torch.Tensor, advs: Advantages, pad_id: int) -> Batch:
    """Right-padded prompt+completion rows; loss on completion tokens of included rows. Per-token
    advantages (``advs.token_values``) become ``Batch.token_advantages`` at the completion positions."""
    b = len(rows)
    width = max((len(r.prompt_ids) + len(r.completion_ids) for r in rows), default=1)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.bool)
    loss_mask = torch.zeros((b, width))
    old_lp = torch.zeros((b, width))
    versions = torch.zeros((b, width), dtype=torch.long)
    tok_adv = torch.zeros((b, width)) if advs.token_values is not None else None
    for i, r in enumerate(rows):
        p, c = len(r.prompt_ids), len(r.completion_ids)
        ids[i, : p + c] = torch.tensor(r.prompt_ids + r.completion_ids, dtype=torch.long)
        attn[i, : p + c] = True
        if c:
            old_lp[i, p : p + c] = torch.tensor(r.logprobs, dtype=torch.float32)
            versions[i, p : p + c] = torch.tensor(r.token_versions or (r.policy_version,) * c, dtype=torch.long)
            if bool(advs.include[i]):
                loss_mask[i, p : p + c] = 1.0
                if r.loss_mask is not None:  # APRIL "mask": off-policy prefix tokens are context only
                    loss_mask[i, p : p + c] *= torch.tensor(r.loss_mask, dtype=torch.float32)
                if advs.token_include is not None:  # gradient pruning of single tokens (tree advantage)
                    loss_mask[i, p : p + c] *= advs.token_include[i, :c].float()
            if tok_adv is not None:
                tok_adv[i, p : p + c] = advs.token_values[i, :c].float()
    n_tokens = int(loss_mask.sum().item())
    n_seqs = int((loss_mask.sum(dim=1) > 0).sum().item())
    return Batch(
        ids,
        attn,
        loss_mask,
        old_lp,
        advs.values.float(),
        rewards,
        gidx,
        versions,
        num_loss_tokens=n_tokens,
        num_sequences=n_seqs,
        token_advantages=tok_adv,
        num_rows=len(rows),
    )
