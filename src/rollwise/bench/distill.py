"""``rollwise distill-diagnose``: score candidate distillation teachers of a run's checkpoint on its
held-out prompts (the math and the plot: :mod:`rollwise.eval.distill`).

The student is the run's checkpoint (the newest that verifies, or ``step``). It samples
``samples`` rollouts of each of ``n_prompts`` held-out prompts with the run's sampling settings;
every rollout is scored against every teacher, a teacher being one of

- ``answer``: the student itself with the reference answer in its context (``Answer: <answer>``
  written before the prompt; the paper's "self with the answer in context");
- ``checkpoint:PATH``: another checkpoint (a ``checkpoints/step-<N>`` directory, or a run directory
  for its newest verifying checkpoint), e.g. a later checkpoint of the same run. Its model is built
  from its own run's ``config.resolved.toml`` and must share the student's vocabulary.

Read-only: nothing under the run directory (or a teacher's) is written, moved or locked (a corrupt
checkpoint is skipped, not moved aside as a resumed run would), and ``out_dir`` may not lie inside
the run directory. Writes ``distill.json`` and ``distill.png`` to ``out_dir``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from rollwise.eval.evaluate import heldout_subset
from rollwise.registry import UserError

ANSWER = "answer"
CHECKPOINT = "checkpoint:"


def _verified_checkpoint(run_dir: Path, step: int | None, key: str) -> Path:
    """The newest checkpoint of ``run_dir`` that verifies (or ``step``'s), without moving any aside."""
    from rollwise.trainer import checkpoint

    if not (run_dir / "config.resolved.toml").is_file():
        raise UserError(f"{key}: {run_dir} is not a run directory (no config.resolved.toml)")
    steps = checkpoint.list_steps(run_dir)
    if step is not None and step not in steps:
        raise UserError(f"{key}: {run_dir} has no checkpoint step-{step}; it has steps {steps}")
    for s in reversed(steps if step is None else [step]):
        path = checkpoint.ckpt_dir(run_dir) / f"step-{s}"
        if checkpoint.verify(path) is None:
            return path
    raise UserError(f"{key}: no checkpoint of {run_dir} verifies (steps {steps})")


def parse_teacher(spec: str) -> tuple[str, Path | None]:
    """``(name, checkpoint path or None)`` of a ``--teacher`` value; refused naming ``--teacher``
    (a missing path, an unknown form) before any model loads."""
    if spec == ANSWER:
        return ANSWER, None
    if spec.startswith(CHECKPOINT):
        path = Path(spec[len(CHECKPOINT) :])
        if not path.exists():
            raise UserError(f"--teacher {spec}: checkpoint path not found: {path}")
        if (path / "config.resolved.toml").is_file():
            path = _verified_checkpoint(path, None, f"--teacher {spec}")
        elif not (path / "model.safetensors").is_file() or not (path.parent.parent / "config.resolved.toml").is_file():
            raise UserError(
                f"--teacher {spec}: {path} is neither a run directory nor a checkpoints/step-<N> directory of one"
            )
        return f"checkpoint {path.parent.parent.name}/{path.name}", path
    raise UserError(f"--teacher {spec!r}: expected 'answer' or 'checkpoint:PATH'")


# builds a run's parts in this one process, with nothing trained (as ``rollwise eval``)
SETS = [
    "model.warm_start.steps=0",
    "run.progress=false",
    "run.report_to=[]",
    "distributed.workers=0",
    "distributed.data_parallel=false",
    "train.fsdp=false",
]


def _load(run_dir: Path, ckpt: Path):
    """``(cfg, task, model, codec)`` of a run with ``ckpt``'s weights."""
    from rollwise import components
    from rollwise.config import load_config
    from rollwise.trainer import checkpoint

    cfg = load_config(run_dir / "config.resolved.toml", SETS)
    task = components.build_task(cfg)
    model, codec = components.build_policy(cfg, task, log=lambda m: None)
    state = checkpoint.load(ckpt, model)["run_state"]
    model.eval()
    return cfg, task, model, codec, state


def with_answer(prompt):
    """The prompt with ``Answer: <answer>`` written before it (text and last user message); a new id."""
    from dataclasses import replace

    head = f"Answer: {prompt.answer}\n"
    messages = prompt.messages
    if messages:
        msgs = [dict(m) for m in messages]
        last = max((i for i, m in enumerate(msgs) if m.get("role") == "user"), default=None)
        if last is not None:
            msgs[last]["content"] = head + msgs[last].get("content", "")
        messages = tuple(msgs)
    return replace(prompt, id=f"{prompt.id}#with-answer", text=head + prompt.text, messages=messages)


@torch.no_grad()
def completion_logits(model, prompt_ids, completion_ids, temperature: float) -> torch.Tensor:
    """(C, V) logits (divided by the sampling temperature) that predict each completion token."""
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], dtype=torch.long)
    logits = model(input_ids=ids).logits[0].float()
    p, c = len(prompt_ids), len(completion_ids)
    return logits[p - 1 : p + c - 1] / max(temperature, 1e-6)


def diagnose(
    run_dir: str | Path,
    teachers: list[str],
    out_dir: str | Path,
    step: int | None = None,
    n_prompts: int = 16,
    samples: int = 8,
    log=print,
) -> dict:
    """Score ``teachers`` (``--teacher`` values) for the run's checkpoint (module docstring); returns
    the result written to ``out_dir/distill.json``."""
    from rollwise import components
    from rollwise.eval import distill
    from rollwise.types import Plan, Request, Sampling

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if not run_dir.is_dir():
        raise UserError(f"RUN_DIR: run directory not found: {run_dir}")
    if not teachers:
        raise UserError("--teacher: give at least one teacher ('answer' or 'checkpoint:PATH')")
    if out_dir.resolve().is_relative_to(run_dir.resolve()):
        raise UserError(f"--out {out_dir} lies inside the run directory, which distill-diagnose leaves as it is")
    ckpt = _verified_checkpoint(run_dir, step, "RUN_DIR")
    parsed = [parse_teacher(t) for t in teachers]
    names = [n for n, _ in parsed]
    if len(set(names)) != len(names):
        raise UserError(f"--teacher: the same teacher is given twice ({names})")

    cfg, task, model, codec, state = _load(run_dir, ckpt)
    s = cfg.sampling
    sampling = Sampling(s.temperature, s.top_p, s.max_new_tokens)
    prompts = heldout_subset(task.heldout_prompts(), n_prompts)
    pool = components.build_pool(
        cfg, components.build_backend(cfg, model, codec, cfg.run.seed), codec, task, sampling, None, model, log=log
    )
    gen = torch.Generator().manual_seed(cfg.run.seed * 1_000_003 + 7)
    try:
        results = pool.rollouts(
            Plan(tuple(Request(p, samples) for p in prompts)), state["policy_version"], sampling, gen, charge=False
        )
    finally:
        pool.close()
    by_prompt: dict[str, list] = {}
    for prompt, r in results:
        if r.reward is not None and r.completion_ids:
            by_prompt.setdefault(prompt.id, []).append((prompt, r))
    rows = []  # (prompt, rollout, baseline)
    for items in by_prompt.values():
        base = distill.loo_baselines([float(r.reward) for _, r in items])
        rows += [(p, r, b) for (p, r), b in zip(items, base)]
    student = [completion_logits(model, r.prompt_ids, r.completion_ids, s.temperature) for _, r, _ in rows]

    out = {
        "run": run_dir.name,
        "checkpoint": ckpt.name,
        "student_step": state["step"],
        "prompts": len(by_prompt),
        "samples": samples,
        "rollouts": len(rows),
        "student_pass_rate": sum(float(r.reward) >= 0.5 for _, r, _ in rows) / max(1, len(rows)),
        "temperature": s.temperature,
        "teachers": {},
    }
    for (name, path), spec in zip(parsed, teachers):
        t0 = time.perf_counter()
        if path is None:
            t_model, t_ids = model, [codec.encode_prompt(with_answer(p)) for p, _, _ in rows]
        else:
            _, _, t_model, t_codec, _ = _load(path.parent.parent, path)
            if t_model.config.vocab_size != model.config.vocab_size:
                raise UserError(
                    f"--teacher {spec}: its vocabulary ({t_model.config.vocab_size}) is not the student's "
                    f"({model.config.vocab_size})"
                )
            t_ids = [t_codec.encode_prompt(p) for p, _, _ in rows]
        scores = []
        for (_, r, b), z, ids in zip(rows, student, t_ids):
            q = completion_logits(t_model, ids, r.completion_ids, s.temperature)
            scores.append(distill.score_rollout(z, q, torch.tensor(r.completion_ids), float(r.reward), b))
        out["teachers"][name] = {
            "spec": spec,
            "summary": distill.summarise(scores),
            "per_rollout": [asdict(x) for x in scores],
            "seconds": time.perf_counter() - t0,
        }
        log(f"{name}: {json.dumps(out['teachers'][name]['summary'])}")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "distill.json").write_text(json.dumps(out, indent=1) + "\n")
    distill.plot(out, out_dir / "distill.png")
    return out
