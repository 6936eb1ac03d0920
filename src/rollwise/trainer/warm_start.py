"""Supervised warm start of the built-in tiny model on task examples, cached on disk.

A randomly initialised model never samples a correct answer, so GRPO would see only
zero-variance groups. A short supervised phase (cross-entropy on the reference completion)
gives it a partial skill that RL then improves. The weights are cached under
``$ROLLWISE_CACHE`` (default ``~/.cache/rollwise``) keyed by everything that determines them,
so the second run skips this phase. An interrupted warm start (Ctrl-C, SIGTERM) is saved there
at its last completed step (model, optimizer, RNG states; not when the interrupt lands inside an
optimizer update) and the next warm start with the same key continues from it, ending with the
weights an uninterrupted one gives.

Environment tasks (multi-turn episodes, docs/architecture.md §11) train on ``episode_examples``:
each demonstration laid out exactly as the episode pool lays out an episode
(``rollwise.tokens.episode_ids``: the actions and their EOS in the loss, the observations as
context only). Single-turn tasks keep their examples, rows and cache keys.
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

from rollwise.storage import cache_root

WARM_VERSION = 1


def cache_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return cache_root() / "warm_start" / digest / "model.safetensors"


class Progress:
    """Logs warm-start progress: step, loss and an estimate of the time left, at step 10 (the
    first estimate) and then every tenth of the run (or every 60 s, whichever comes first)."""

    def __init__(self, total: int, log, every_s: float = 60.0):
        self.total, self.log, self.every_s = total, log, every_s
        self.t0 = self.last = time.perf_counter()
        self.tenth = max(1, total // 10)
        self.done = 0  # steps completed

    def __call__(self, step: int, loss: float) -> None:
        self.done = step
        now = time.perf_counter()
        if not (
            step == min(10, self.total)
            or step % self.tenth == 0
            or step == self.total
            or now - self.last >= self.every_s
        ):
            return
        self.last = now
        left = (now - self.t0) / step * (self.total - step)
        eta = f", about {format_seconds(left)} left" if step < self.total else f", took {format_seconds(now - self.t0)}"
        self.log(f"warm start: step {step:,}/{self.total:,}, loss {loss:.3f}{eta}")


def format_seconds(s: float) -> str:
    """62.4 -> '1 min 2 s'; 5.2 -> '5 s'."""
    s = int(round(s))
    return f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"


def warm_start(
    model,
    codec,
    task,
    ws_cfg,
    seed: int,
    key: dict,
    log=print,
    max_observation_tokens: int | None = None,
    *,
    episodes: bool,
) -> str:
    """Train ``model`` in place (or load the cached result). Returns "cached", "trained" or "skipped".
    ``episodes``: the task runs multi-turn episodes (its compatibility record,
    ``rollwise.compat.declares_episodes``), so the examples are its demonstrations;
    ``max_observation_tokens``: the cut of an environment task's observations (``task.max_observation_tokens``;
    the caller puts it in ``key``)."""
    if ws_cfg.steps == 0:
        return "skipped"
    # the OTR fields enter the key only when chosen, so SFT warm starts keep their cache entries
    skip = {"cache", "pretrained"} | ({"objective", "otr"} if ws_cfg.objective == "sft" else set())
    path = cache_path({**key, "ws": ws_cfg.model_dump(exclude=skip), "seed": seed, "v": WARM_VERSION})
    if ws_cfg.cache and path.exists():
        load_model(model, str(path))
        return "cached"
    try:
        examples = _examples(codec, task, ws_cfg.steps * ws_cfg.batch_size, seed, max_observation_tokens, episodes)
    except NotImplementedError:
        examples = []
    if not examples:  # e.g. a library game (textarena:, gem:, gym:) has no solver to demonstrate it
        log(
            f"task {task.name!r} has no reference completions or demonstrations; warm start skipped (the built-in "
            "tiny model starts from random weights: use a pretrained model, e.g. model.name=smollm2-135m)"
        )
        return "skipped"
    log(
        f"warm start: {ws_cfg.steps:,} supervised steps x {ws_cfg.batch_size} examples of {task.name} "
        f"(once; {'cached afterwards under ' + str(cache_root()) if ws_cfg.cache else 'not cached'}; "
        "model.warm_start.steps=0 skips it)"
    )
    rng = random.Random(seed)
    report = Progress(ws_cfg.steps, log)
    opt = torch.optim.AdamW(model.parameters(), lr=ws_cfg.lr, weight_decay=0.0)
    partial = path.parent.with_name(path.parent.name + ".partial") / "state.pt"  # an interrupted warm start
    start, torch_rng = 0, None
    if ws_cfg.cache and partial.is_file():
        start, torch_rng = _load_partial(partial, model, opt, rng)
        report.done = start
        log(
            f"warm start: continuing from step {start:,} of {ws_cfg.steps:,} (interrupted before; saved under "
            f"{cache_root()})"
        )
    model.train()
    at = _Position(start)
    try:
        _fit(model, codec, examples, ws_cfg, seed, rng, opt, report, at, torch_rng)
    except KeyboardInterrupt:  # the run directory has no checkpoint yet: say what a rerun does
        if ws_cfg.cache and at.consistent():
            _save_partial(partial, model, opt, at)
            log(
                f"warm start interrupted after {at.done:,} of {ws_cfg.steps:,} steps; saved: the next run with this "
                f"warm start (--resume of this one, or a new one) continues it from step {at.done:,}"
            )
        else:
            why = "model.warm_start.cache = false" if not ws_cfg.cache else "interrupted inside an optimizer update"
            then = (
                f"continues from step {start:,}, saved before"
                if start
                else "starts the warm start again from its first step"
            )
            log(
                f"warm start interrupted after {at.done:,} of {ws_cfg.steps:,} steps: this session's steps are not "
                f"kept ({why}), so the next run {then}"
            )
        raise
    if ws_cfg.cache:
        tmp = path.parent.with_name(path.parent.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_model(model, str(tmp / path.name))
        shutil.rmtree(path.parent, ignore_errors=True)
        tmp.rename(path.parent)
        shutil.rmtree(partial.parent, ignore_errors=True)
    return "trained"


class _Position:
    """Where ``_fit`` is, so an interrupt can be saved at a step boundary: ``done`` optimizer steps
    completed; ``rng`` the (example, torch) RNG states to continue from, those at the start of
    step ``done`` (set as the step starts, and by ``_fit`` when an interrupt falls between steps);
    ``updating`` while ``opt.step()`` runs (the weights are then half updated: nothing is saved)."""

    def __init__(self, done: int):
        self.done, self.rng, self.updating = done, None, False

    def consistent(self) -> bool:
        return not self.updating


def _save_partial(path: Path, model, opt, at: _Position) -> None:
    """Model, optimizer, step and RNG states of an interrupted warm start at step ``at.done``
    (written to a temporary file and renamed: a second interrupt leaves the previous one)."""
    rng_state, torch_state = at.rng
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "step": at.done,
            "model": model.state_dict(),
            "opt": opt.state_dict(),
            "rng": rng_state,
            "torch_rng": torch_state,
        },
        tmp,
    )
    os.replace(tmp, path)


def _load_partial(path: Path, model, opt, rng) -> tuple[int, tuple]:
    state = torch.load(path, weights_only=False)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    rng.setstate(state["rng"])
    return state["step"], state["torch_rng"]


def _fit(model, codec, examples, ws_cfg, seed: int, rng, opt, report, at: _Position, torch_rng=None) -> None:
    """The supervised steps of ``warm_start`` from step ``at.done``, in place; ``torch_rng``: the
    torch RNG state to continue from (a resumed warm start)."""
    eos, pad = codec.tokenizer.eos_token_id, codec.pad_id
    dev = next(model.parameters()).device
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        if torch_rng is not None:
            torch.set_rng_state(torch_rng[0])
            if torch_rng[1] is not None and dev.type == "cuda":
                torch.cuda.set_rng_state(torch_rng[1], dev)
        try:
            _steps(model, codec, examples, ws_cfg, rng, opt, report, at, eos, pad, dev)
        except KeyboardInterrupt:
            if at.rng is None:  # between steps: the states to continue from are the current ones (fork_rng restores
                at.rng = (rng.getstate(), _torch_rng(dev))  # the outer torch state on the way out)
            raise


def _torch_rng(dev) -> tuple:
    """torch's CPU RNG state, and the model's CUDA device's (None on CPU)."""
    return torch.get_rng_state(), (torch.cuda.get_rng_state(dev) if dev.type == "cuda" else None)


def _examples(codec, task, n: int, seed: int, max_observation_tokens: int | None, episodes: bool) -> list:
    """The warm start's examples: ``(prompt, target text)`` pairs of a single-turn task
    (``sft_examples``), or ``(prompt, completion ids, loss mask)`` of an environment task's
    demonstrations (``episode_examples``, laid out by ``rollwise.tokens.episode_ids``)."""
    if not episodes:
        return task.sft_examples(n, seed)
    from rollwise.tokens import episode_ids

    return [(p, *episode_ids(codec, p, steps, max_observation_tokens)) for p, steps in task.episode_examples(n, seed)]


def _row(codec, example, eos: int) -> tuple[tuple[int, ...], list[int], list[int] | None]:
    """(prompt ids, completion ids, loss mask or None = all) of one example (``_examples``)."""
    if len(example) == 3:
        p, ids, mask = example
        return codec.encode_prompt(p), list(ids), list(mask)
    p, t = example
    return codec.encode_prompt(p), codec.encode_text(t) + [eos], None


def _steps(model, codec, examples, ws_cfg, rng, opt, report, at: _Position, eos: int, pad: int, dev) -> None:
    for step in range(at.done, ws_cfg.steps):
        at.rng = (rng.getstate(), _torch_rng(dev))
        chunk = [examples[rng.randrange(len(examples))] for _ in range(ws_cfg.batch_size)]
        rows = [_row(codec, ex, eos) for ex in chunk]
        width = max(len(p) + len(t) for p, t, _ in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        attn = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (p, t, mask) in enumerate(rows):
            ids[i, : len(p) + len(t)] = torch.tensor(list(p) + t)
            target = t if mask is None else [x if m else -100 for x, m in zip(t, mask)]  # observations: no loss
            labels[i, len(p) : len(p) + len(t)] = torch.tensor(target)
            attn[i, : len(p) + len(t)] = 1
        ids, labels, attn = ids.to(dev), labels.to(dev), attn.to(dev)  # the model's device (model.device)
        if ws_cfg.objective == "otr":  # One-Token Rollout (rollwise.objectives.otr) instead of cross-entropy
            from rollwise.objectives.otr import otr_loss

            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
            gold = labels[:, 1:]
            loss = otr_loss(logits, gold.clamp(min=0), gold != -100, ws_cfg.otr)
        else:
            loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        loss.backward()
        at.updating = True
        opt.step()
        at.done, at.rng, at.updating = step + 1, None, False
        opt.zero_grad(set_to_none=True)
        report(step + 1, loss.item())


def fit_warnings(
    task,
    codec,
    max_new_tokens: int,
    context: int | None = None,
    builtin: bool = False,
    n: int = 64,
    *,
    episodes: bool,
) -> list[str]:
    """Warnings, before any training, when a run cannot score however long it trains: the task's
    reference completions (``types.reference_completions``; end-of-text included) are
    longer than ``sampling.max_new_tokens``; and, for the built-in tiny model (``builtin``), the
    task uses characters its character-level tokenizer lacks, or its prompts do not fit the
    model's ``context`` with ``max_new_tokens`` after them. Looks at the first ``n`` train examples."""
    prompts = list(task.train_prompts()[:n])
    from rollwise.types import reference_completions

    targets, what = reference_completions(task, n, episodes=episodes)
    out = []
    if targets:
        lens = sorted(len(codec.encode_text(t)) + 1 for t in targets)
        median = lens[len(lens) // 2]
        if median > max_new_tokens:
            out.append(
                f"sampling.max_new_tokens = {max_new_tokens} is shorter than the task's {what} (median {median} tokens "
                f"with end-of-text, longest {lens[-1]}, e.g. {targets[0]!r:.40}): rollouts are cut before they can "
                f"answer and rewards stay 0; set sampling.max_new_tokens={lens[-1]} or more"
            )
    if builtin:
        unk = getattr(codec.tokenizer, "unk_token_id", None)

        def lacks(texts) -> list[str]:
            return sorted({ch for t in texts for ch in t if unk is not None and codec.encode_text(ch) == [unk]})

        missing = lacks(targets)
        if missing:
            out.append(
                f"the built-in tiny model's character vocabulary (printable ASCII) lacks {len(missing)} character(s) "
                f"this task's {what} use ({''.join(missing[:20])!r}): it cannot learn this task's format; use a "
                "Hugging Face model (model.name=smollm2-135m or a local model directory)"
            )
        unseen = [ch for ch in lacks(p.text for p in prompts) if ch not in missing]
        if unseen:  # only the prompts have them: the model reads <unk> there and can still answer
            out.append(
                f"the built-in tiny model's character vocabulary (printable ASCII) lacks {len(unseen)} character(s) "
                f"of this task's prompts ({''.join(unseen[:20])!r}): it reads them all as one unknown token, so where "
                "they carry the question's meaning (an operator, a letter) it cannot learn the task; layout (a newline)"
                " does no harm; a Hugging Face model (model.name=smollm2-135m) reads them"
            )
        if context is not None and prompts:
            longest = max(len(codec.encode_prompt(p)) for p in prompts)
            if longest + max_new_tokens > context:
                out.append(
                    f"the task's prompts (up to {longest} tokens) plus sampling.max_new_tokens = {max_new_tokens} "
                    f"exceed the built-in tiny model's context of {context} tokens: it cannot learn this task's "
                    "format; use a Hugging Face model (model.name=smollm2-135m or a local model directory)"
                )
    return out
