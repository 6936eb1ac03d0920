"""Episodes waiting on tools: episodes/s, tool calls/s and the share of wall time generation waits
for environment steps, with tool calls run one at a time or concurrently, lockstep or overlapped
(``rollwise.generate.episodes``; issue #30).

    python benchmarks/episode_tools.py [--episodes 32] [--turns 3] [--tokens 24]

The policy is the built-in tiny model warm-started on the ``calculator`` task's demonstrations (so
its turns are tool calls that end with EOS, as a trained policy's do; the warm start is cached);
whatever it writes, every turn's environment step runs a real Python cell in the code sandbox
(``rollwise.envs.python_math``'s tool: bubblewrap where it runs, else rlimits), so tool seconds are
those of a sandboxed process, not a sleep, and every episode has ``--turns`` turns. Writes
``benchmarks/results/episode_tools.json``; compare ratios within one run only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import benchinfo
import torch

from rollwise.backends.hf import HFBackend
from rollwise.config import WarmStartConfig
from rollwise.envs import calculator
from rollwise.envs.base import StepResult
from rollwise.envs.python_math import PythonCells
from rollwise.generate.episodes import EpisodeLimits, EpisodePool
from rollwise.tokens import Codec
from rollwise.trainer.tiny import build_tiny
from rollwise.trainer.warm_start import warm_start
from rollwise.types import Plan, Request, Sampling, Verdict
from rollwise.verify.sandbox import Limits, Sandbox

CELL = "print(sum(i * i for i in range(300_000)))"


class CellEnv:
    """Each turn runs ``CELL`` in the sandbox (one tool call); the episode ends after ``turns`` turns."""

    def __init__(self, sandbox: Sandbox, turns: int):
        self.cells, self.turns, self.k = PythonCells(sandbox, 200), turns, 0

    def reset(self, seed: int) -> None:
        self.k = 0

    def step(self, action: str) -> StepResult:
        from rollwise.types import ToolCall

        t0 = time.perf_counter()
        out = self.cells.python(CELL)
        self.cells.cells.clear()  # no replay: every call costs the same
        self.k += 1
        call = ToolCall("python", CELL, time.perf_counter() - t0, "ok")
        done = self.k >= self.turns
        return StepResult("" if done else out[:16], 1.0 if done else 0.0, done, (call,), Verdict(1.0) if done else None)


class CellTask:
    name = "cells"

    def __init__(self, turns: int):
        self.sandbox, self.turns = Sandbox(Limits(wall_s=20)), turns

    def verify(self, prompt, completion):
        return Verdict(None, "not_used")

    def environment(self, prompt):
        return CellEnv(self.sandbox, self.turns)


def run(pool: EpisodePool, prompts, per_prompt: int) -> dict:
    plan = Plan(tuple(Request(p, per_prompt) for p in prompts))
    t0 = time.perf_counter()
    out = pool.rollouts(plan, 0, generator=torch.Generator().manual_seed(0))
    wall = time.perf_counter() - t0
    c = pool.take_cost()
    return {
        "wall_s": round(wall, 3),
        "episodes": len(out),
        "episodes_per_s": round(len(out) / wall, 2),
        "tool_calls": c.tool_calls,
        "tool_calls_per_s": round(c.tool_calls / wall, 2),
        "generate_s": round(c.generate_s, 3),
        "waiting_s": round(c.waiting_s, 3),
        "waiting_share": round(c.waiting_s / wall, 3),
        "tool_s_sum": round(c.tool_s, 3),
        "policy_tokens": c.generated_tokens,
        "observation_tokens": c.observation_tokens,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=32)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--model", default="tiny-s")
    ap.add_argument("--warm-steps", type=int, default=400)
    ap.add_argument("--out", type=Path, default=benchinfo.RESULTS / "episode_tools.json")
    args = ap.parse_args()
    model, tok = build_tiny(args.model, seed=0)
    codec = Codec(tok)
    calc = calculator.make(None, {})
    ws = WarmStartConfig(steps=args.warm_steps, batch_size=32)
    warm_start(
        model, codec, calc, ws, 0, {"bench": "episode_tools", "model": args.model}, log=lambda m: None, episodes=True
    )
    model.eval()
    backend = HFBackend(model, codec.eos_ids, codec.pad_id, 256, seed=0)
    task = CellTask(args.turns)
    prompts = [dataclasses.replace(p, task="cells") for p in calc.train_prompts()[: args.episodes // 4]]
    sampling = Sampling(1.0, 1.0, args.tokens)
    rows = []
    for workers, schedule in ((1, "lockstep"), (8, "lockstep"), (8, "overlap"), (1, "lockstep"), (8, "lockstep")):
        limits = EpisodeLimits(
            max_turns=args.turns + 1,
            max_episode_tokens=10_000,
            tool_workers=workers,
            episode_schedule=schedule,
            tool_timeout_s=20,
        )
        pool = EpisodePool(backend, codec, task, sampling, limits)
        rows.append({"tool_workers": workers, "schedule": schedule, **run(pool, prompts, 4)})
        pool.close()
        print(json.dumps(rows[-1]))
    out = {
        "what": "episodes waiting on sandboxed tool calls (rollwise.generate.episodes); repeated settings show noise",
        "model": args.model,
        "episodes": args.episodes,
        "turns": args.turns,
        "max_new_tokens": args.tokens,
        "warm_start": f"{args.warm_steps} x 32 calculator demonstrations",
        "cell": CELL,
        "isolation": task.sandbox.isolation,
        "runs": rows,
        "machine": benchinfo.machine(),
        "git": benchinfo.git(),
        "created": benchinfo.stamp(),
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
