"""FAPO's judge (issue #45 item 3; rollwise.tasks.fapo_judge, arXiv 2510.22543 §3) against the rule
detector on held-out traces.

1. Train the judge with the preset (``configs/fapo_judge.toml``) on the built-in tiny model:
   ``--warm-steps`` supervised steps on (trace, label) pairs, then ``--steps`` GRPO steps with the
   reward ``R_outcome + R_process`` (-1 invalid). The run is saved (``--run-dir``) and then loaded as
   the flaw detector ``genrm:<run dir>`` (``rollwise.flaws_judge``), the same object
   ``reward.fapo.detector`` builds.
2. On the task's held-out traces (correct final answers, about half with a planted wrong step; the
   label t* is the rule detector's), ask the judge greedily and report: exact-step accuracy (answer
   == t*, "none" included), flawed detection precision / recall (a step named vs t* >= 0), clean
   detection precision / recall ("none" vs t* = -1), the invalid-answer rate and the mean reward.

Final measurement::

    nice -n 10 python benchmarks/fapo_judge.py   # -> benchmarks/results/fapo_judge/judge_vs_rule.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import rollwise
from rollwise.config import load_config
from rollwise.flaws import DETECTORS
from rollwise.tasks.fapo_judge import END, judge_reward, make, parse

ROOT = Path(__file__).resolve().parents[1]


def ratio(a: int, b: int) -> float | None:
    return a / b if b else None


def score(detect, prompts) -> dict:
    """The judge's answers on ``prompts`` against their rule-detector labels (module docstring)."""
    exact = tp = fp = fn = tn = invalid = said_clean_total = 0
    rewards = []
    for p in prompts:
        trace, t_star, n = p.text[: -len(END)], p.metadata["t_star"], p.metadata["n_steps"]
        t_hat = parse(detect.answer(trace), n)
        rewards.append(judge_reward(t_hat, t_star, n))
        invalid += t_hat is None
        exact += t_hat == t_star
        said_flawed = t_hat is not None and t_hat >= 0
        said_clean = t_hat == -1
        said_clean_total += said_clean
        tp += said_flawed and t_star >= 0
        fp += said_flawed and t_star == -1
        fn += (not said_flawed) and t_star >= 0
        tn += said_clean and t_star == -1
    n_clean = sum(p.metadata["t_star"] == -1 for p in prompts)
    return {
        "n": len(prompts),
        "n_flawed": len(prompts) - n_clean,
        "n_clean": n_clean,
        "exact_step_accuracy": exact / len(prompts),
        "flawed_precision": ratio(tp, tp + fp),
        "flawed_recall": ratio(tp, tp + fn),
        "clean_precision": ratio(tn, said_clean_total),
        "clean_recall": ratio(tn, n_clean),
        "invalid_rate": invalid / len(prompts),
        "mean_reward": sum(rewards) / len(rewards),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warm-steps", type=int, default=300)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--n-heldout", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-dir", default=str(ROOT / ".scratch" / "fapo_judge_runs"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fapo_judge" / "judge_vs_rule.json"))
    a = ap.parse_args()
    overrides = {
        "run.dir": a.run_dir,
        "run.name": f"judge-s{a.seed}",
        "run.progress": False,
        "run.seed": a.seed,
        "run.checkpoint_every": a.steps,
        "model.warm_start.steps": a.warm_steps,
        "train.steps": a.steps,
        "task.options.n_heldout": a.n_heldout,
        "eval.at_start": False,
        "eval.every": 0,
    }
    cfg = load_config(
        ROOT / "configs" / "fapo_judge.toml", overrides=[f"{k}={json.dumps(v)}" for k, v in overrides.items()]
    )
    t0 = time.time()
    res = rollwise.train(cfg, log=lambda m: None)
    train_s = time.time() - t0
    detect = DETECTORS.get(f"genrm:{res.run_dir}")
    task = make(None, dict(cfg.task.options))
    out = {
        "what": "FAPO judge (task fapo_judge, tiny-s) vs the rule detector's labels on held-out traces",
        "config": "configs/fapo_judge.toml",
        "overrides": overrides,
        "train_seconds": round(train_s, 1),
        "heldout": score(detect, task.heldout_prompts()),
        "train_sample": score(detect, task.train_prompts()[: a.n_heldout]),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out["heldout"], indent=2))


if __name__ == "__main__":
    main()
