"""How well can a group's degeneracy be predicted before generating it, on regime 1? (issue #31)

Samples two independent groups of G rollouts for each of the 192 pool prompts of
``benchmarks/regime_cot.toml`` with the cached warm-started tiny model (one policy, no training),
then scores predictions of the first group's pass rate and zero-variance flag:

- the state-zero pass-rate predictor (``rollwise.value.predictor``) in 4-fold cross-validation, so
  every prompt is predicted as a first visit, with last-token, mean-pooled and middle-layer states;
- an oracle that knows each prompt's level and the level's mean pass rate;
- the prompt's *other* group (an independent previous visit of G rollouts: what history methods see).

    PYTHONPATH=src python benchmarks/value_ceiling.py   # -> benchmarks/results/value_ceiling.json

``--prompts``, ``--max-new-tokens`` and ``--warm-start-steps`` shrink it to a smoke run (at least 4
prompts: the cross-validation has 4 folds).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402

from rollwise import components  # noqa: E402
from rollwise.backends.hf import HFBackend  # noqa: E402
from rollwise.config import load_config  # noqa: E402
from rollwise.distributed.local import LocalPool  # noqa: E402
from rollwise.types import Plan, Request, Sampling  # noqa: E402
from rollwise.value.metrics import auc, brier, degenerate_prob  # noqa: E402
from rollwise.value.predictor import PassRatePredictor  # noqa: E402

G = 8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=192, help="the pool's first N prompts")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--warm-start-steps", type=int, default=None, help="model.warm_start.steps (default: the config's)")
    ap.add_argument("--out", type=Path, default=benchinfo.RESULTS / "value_ceiling.json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    sets = [
        "task.options={cot = true, levels = [3, 4, 5]}",
        f"task.max_train_prompts={a.prompts}",
        f"sampling.max_new_tokens={a.max_new_tokens}",
    ]
    if a.warm_start_steps is not None:
        sets.append(f"model.warm_start.steps={a.warm_start_steps}")
    cfg = load_config(overrides=sets)
    task = components.build_task(cfg)
    model, codec = components.build_policy(cfg, task, log=lambda m: None)
    backend = HFBackend(model, codec.eos_ids, codec.pad_id, 64, 0)
    prompts = list(task.train_prompts())
    smp = Sampling(1.0, 1.0, a.max_new_tokens)
    pool = LocalPool(backend, codec, task.verify, smp, max_batch=64)

    def sample(seed):
        res = pool.rollouts(
            Plan(tuple(Request(p, G) for p in prompts)), 0, smp, torch.Generator().manual_seed(seed), charge=False
        )
        by: dict[str, list[bool]] = {}
        for p, r in res:
            by.setdefault(p.id, []).append(r.verdict.score is not None and r.verdict.score >= 0.5)
        return [sum(by[p.id]) / G for p in prompts], [len(set(by[p.id])) == 1 for p in prompts]

    t0 = time.perf_counter()
    rates, degenerate = sample(0)
    other, _ = sample(1)
    sample_s = time.perf_counter() - t0
    seqs = [codec.encode_prompt(p) for p in prompts]
    with torch.no_grad():
        hidden = [model(input_ids=torch.tensor([list(s)]), output_hidden_states=True).hidden_states for s in seqs]
    feats = {
        "last token": backend.prompt_states(seqs),
        "mean pooled (last layer)": torch.stack([h[-1][0].mean(0) for h in hidden]),
        "mean pooled (middle layer)": torch.stack([h[len(h) // 2][0].mean(0) for h in hidden]),
    }

    def score(pred):
        a = auc([degenerate_prob(v, G) for v in pred], degenerate)  # None when every group is alike
        return {"brier": round(brier(pred, rates), 4), "auc_degenerate": None if a is None else round(a, 3)}

    out = {"constant (mean pass rate)": score([sum(rates) / len(rates)] * len(rates))}
    for name, x in feats.items():
        idx = list(range(len(prompts)))
        random.Random(0).shuffle(idx)
        pred = [0.0] * len(idx)
        for k in range(4):
            test = idx[k::4]
            train = [i for i in idx if i not in set(test)]
            pr = PassRatePredictor(x.shape[1], seed=0)
            pr.update(x[train], [prompts[i].id for i in train], [rates[i] for i in train], [G] * len(train))
            for i, v in zip(test, pr.predict(x[test], [prompts[i].id for i in test]).tolist()):
                pred[i] = v
        out[f"predictor, first visit, {name}"] = score(pred)
    levels = [p.metadata.get("level") for p in prompts]
    level_mean = {lv: sum(r for r, q in zip(rates, levels) if q == lv) / levels.count(lv) for lv in set(levels)}
    out["oracle: the level's mean pass rate"] = score([level_mean[lv] for lv in levels])
    out["previous visit: an independent group of 8"] = score(other)
    result = {
        "what": "prediction of a group's pass rate / zero-variance before generating it, regime 1 (issue #31)",
        "group_size": G,
        "prompts": len(prompts),
        "level_pass_rate": {str(k): round(v, 3) for k, v in sorted(level_mean.items())},
        "zero_variance_share": round(sum(degenerate) / len(degenerate), 3),
        "scores": out,
        "sample_s": round(sample_s, 1),
        "machine": benchinfo.machine(),
        "git": benchinfo.git(),
        "created": benchinfo.stamp(),
    }
    a.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["scores"], indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
