"""Supervised warm start of the built-in tiny model on task examples, cached on disk.

A randomly initialised model never samples a correct answer, so GRPO would see only
zero-variance groups. A short supervised phase (cross-entropy on the reference completion)
gives it a partial skill that RL then improves. The weights are cached under
``$ROLLWISE_CACHE`` (default ``~/.cache/rollwise``) keyed by everything that determines them,
so the second run skips this phase.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model

WARM_VERSION = 1


def cache_root() -> Path:
    return Path(os.environ.get("ROLLWISE_CACHE") or Path.home() / ".cache" / "rollwise")


def cache_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return cache_root() / "warm_start" / digest / "model.safetensors"


class Progress:
    """Logs warm-start progress: step, loss and an estimate of the time left, at step 10 (the
    first estimate) and then every tenth of the run (or every 30 s, whichever comes first)."""

    def __init__(self, total: int, log, every_s: float = 30.0):
        self.total, self.log, self.every_s = total, log, every_s
        self.t0 = self.last = time.perf_counter()
        self.tenth = max(1, total // 10)

    def __call__(self, step: int, loss: float) -> None:
        now = time.perf_counter()
        if not (step == min(10, self.total) or step % self.tenth == 0 or step == self.total or now - self.last >= self.every_s):
            return
        self.last = now
        left = (now - self.t0) / step * (self.total - step)
        eta = f", about {format_seconds(left)} left" if step < self.total else f", took {format_seconds(now - self.t0)}"
        self.log(f"warm start: step {step:,}/{self.total:,}, loss {loss:.3f}{eta}")


def format_seconds(s: float) -> str:
    """62.4 -> '1 min 2 s'; 5.2 -> '5 s'."""
    s = int(round(s))
    return f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"


def warm_start(model, codec, task, ws_cfg, seed: int, key: dict, log=print) -> str:
    """Train ``model`` in place (or load the cached result). Returns "cached", "trained" or "skipped"."""
    if ws_cfg.steps == 0:
        return "skipped"
    # the OTR fields enter the key only when chosen, so SFT warm starts keep their cache entries
    skip = {"cache"} | ({"objective", "otr"} if ws_cfg.objective == "sft" else set())
    path = cache_path({**key, "ws": ws_cfg.model_dump(exclude=skip), "seed": seed, "v": WARM_VERSION})
    if ws_cfg.cache and path.exists():
        load_model(model, str(path))
        return "cached"
    try:
        examples = task.sft_examples(ws_cfg.steps * ws_cfg.batch_size, seed)
    except NotImplementedError:
        log(f"task {task.name!r} has no reference completions; warm start skipped")
        return "skipped"
    log(f"warm start: {ws_cfg.steps:,} supervised steps x {ws_cfg.batch_size} examples of {task.name} "
        f"(once; {'cached afterwards under ' + str(cache_root()) if ws_cfg.cache else 'not cached'}; "
        "model.warm_start.steps=0 skips it)")
    rng = random.Random(seed)
    report = Progress(ws_cfg.steps, log)
    opt = torch.optim.AdamW(model.parameters(), lr=ws_cfg.lr, weight_decay=0.0)
    eos = codec.tokenizer.eos_token_id
    pad = codec.pad_id
    model.train()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for step in range(ws_cfg.steps):
            chunk = [examples[rng.randrange(len(examples))] for _ in range(ws_cfg.batch_size)]
            rows = [(codec.encode_prompt(p), codec.encode_text(t) + [eos]) for p, t in chunk]
            width = max(len(p) + len(t) for p, t in rows)
            ids = torch.full((len(rows), width), pad, dtype=torch.long)
            labels = torch.full((len(rows), width), -100, dtype=torch.long)
            attn = torch.zeros((len(rows), width), dtype=torch.long)
            for i, (p, t) in enumerate(rows):
                ids[i, : len(p) + len(t)] = torch.tensor(list(p) + t)
                labels[i, len(p) : len(p) + len(t)] = torch.tensor(t)
                attn[i, : len(p) + len(t)] = 1
            if ws_cfg.objective == "otr":  # One-Token Rollout (rollwise.objectives.otr) instead of cross-entropy
                from rollwise.objectives.otr import otr_loss

                logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
                gold = labels[:, 1:]
                loss = otr_loss(logits, gold.clamp(min=0), gold != -100, ws_cfg.otr)
            else:
                loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            report(step + 1, loss.item())
    if ws_cfg.cache:
        tmp = path.parent.with_name(path.parent.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_model(model, str(tmp / path.name))
        shutil.rmtree(path.parent, ignore_errors=True)
        tmp.rename(path.parent)
    return "trained"
