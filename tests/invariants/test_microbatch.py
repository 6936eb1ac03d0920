"""Micro-batching is exact: one micro-batch of 8 and eight micro-batches of 1 give the same
loss and the same updated weights (the loss is divided by the step's global token count)."""

import copy

import pytest
import torch

from rollwise.collate import collate
from rollwise.config import load_config
from rollwise.objectives import ADVANTAGES, OBJECTIVES
from rollwise.trainer.tiny import build_tiny
from rollwise.trainer.trainer import Trainer
from rollwise.types import Rollout


def _rows(tok):
    # 2 groups of 4, completions of different lengths so token counts differ per row
    texts = [
        ("3+4=", "7"),
        ("3+4=", "8"),
        ("3+4=", "71"),
        ("3+4=", "7"),
        ("9+9=", "18"),
        ("9+9=", "1"),
        ("9+9=", "180"),
        ("9+9=", "99"),
    ]
    rows = []
    for i, (p, c) in enumerate(texts):
        pids = tuple([tok.bos_token_id] + tok.encode(p))
        cids = tuple(tok.encode(c) + [tok.eos_token_id])
        rows.append(Rollout(f"g{i // 4}", pids, cids, tuple(-1.0 - 0.1 * j for j in range(len(cids))), "stop", 0))
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    gidx = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    return rows, rewards, gidx


@pytest.mark.parametrize("objective", ["grpo", "dapo", "gspo"])
@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_one_by_eight_equals_eight_by_one(objective, aggregation):
    model, tok = build_tiny("tiny-s", seed=0)
    rows, rewards, gidx = _rows(tok)
    adv_fn = ADVANTAGES.get("grpo")
    advs = adv_fn(rewards, gidx, adv_fn.Options())
    batch = collate(rows, rewards, gidx, advs, tok.pad_token_id)
    fn = OBJECTIVES.get(objective)
    opts = fn.Options(aggregation=aggregation)
    results = []
    for mb in (8, 1):
        m = copy.deepcopy(model)
        cfg = load_config(overrides=[f"train.micro_batch={mb}", "train.max_grad_norm=0"]).train
        tr = Trainer(m, fn, opts, cfg, temperature=1.0)
        # plain SGD so the weight change *is* the gradient (Adam's first step ~ sign(g)
        # would amplify float rounding in near-zero gradient entries)
        tr.optimizer = torch.optim.SGD(m.parameters(), lr=1.0)
        metrics = tr.optimize(batch)
        results.append((metrics, torch.cat([p.detach().flatten() for p in m.parameters()])))
    (m8, w8), (m1, w1) = results
    assert m8["train/loss"] == pytest.approx(m1["train/loss"], abs=1e-6)
    assert torch.allclose(w8, w1, atol=1e-6)
    # and the step really changed the weights
    w0 = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert not torch.allclose(w0, w8)
