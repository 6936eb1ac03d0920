"""Tokens decoded by the entropy-tree samplers against independent sampling at the same number of
leaves (issue #45): ETMR (``rollwise.generate.etmr``; the paper's M = 12 roots, and the preset's N = 2
forks, B = 2 branches: 60 leaves, claimed at 0.6 of the tokens) and EC-Tree (``rollwise.generate.ec_tree``; n
leaves per prompt).

For each of ``--prompts`` training prompts of the configured task, on the run's warm-started policy
(the embedded default unless ``--set`` overrides say otherwise; the warm start is the cached one),
with the options of the presets ``configs/etmr.toml`` and ``configs/ec_tree.toml``:

- the tree sampler's group: the tokens it decoded (roots in full, each branch from its fork on,
  EC-Tree's pruned completions and top-ups included) and the total length of its leaves;
- ``leaves`` independent samples of the same prompt by the same backend: their total length.

Reported per sampler: ``ratio_vs_independent`` = tree tokens / independent tokens (the issue's
measure: what the tree costs against sampling its leaf count independently), ``ratio_within_tree``
= tree tokens / the leaves' total length (the share not shared), and for ETMR the paper's formula
``(1 + 0.5 B N) / (1 + B N)``. The CPU, torch threads and code commit are recorded.

    nice -n 10 python benchmarks/tree_tokens.py                      # -> benchmarks/results/tree_tokens.json
    nice -n 10 python benchmarks/tree_tokens.py --set task.options='{cot=true,levels=[3,4,5]}' \\
        --set sampling.max_new_tokens=256 --out benchmarks/results/tree_tokens_cot.json

Smoke test::

    python benchmarks/tree_tokens.py --prompts 1 --etmr-roots 1 --ec-leaves 2 --out /tmp/tree_tokens.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", action="append", default=[], help="config override section.key=value (repeatable)")
    p.add_argument("--prompts", type=int, default=16, help="training prompts measured")
    p.add_argument("--etmr-roots", type=int, default=12, help="M (paper: 12)")
    p.add_argument("--ec-leaves", type=int, default=10, help="EC-Tree's group size n")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(benchinfo.RESULTS / "tree_tokens.json"))
    a = p.parse_args(argv)

    import torch

    from rollwise import components
    from rollwise.config import load_config
    from rollwise.generate.ec_tree import EcTreeSampler
    from rollwise.generate.etmr import EtmrSampler, leaves, token_ratio
    from rollwise.types import Sampling

    cfg = load_config(None, a.set)
    etmr = load_config(CONFIGS / "etmr.toml", a.set).sampling.etmr  # the presets' options
    ec = load_config(CONFIGS / "ec_tree.toml", a.set).sampling.ec_tree
    task = components.build_task(cfg)
    model, codec = components.build_policy(cfg, task, log=lambda m: None)
    backend = components.build_backend(cfg, model, codec, a.seed)
    smp = Sampling(cfg.sampling.temperature, cfg.sampling.top_p, cfg.sampling.max_new_tokens)
    prompts = [codec.encode_prompt(q) for q in task.train_prompts()[: a.prompts]]
    samplers = {
        "etmr": (EtmrSampler(backend, etmr), leaves(a.etmr_roots, etmr.branches, etmr.forks)),
        "ec_tree": (EcTreeSampler(backend, ec), a.ec_leaves),
    }
    out = {}
    for name, (sampler, n) in samplers.items():
        gen = torch.Generator().manual_seed(a.seed)
        groups, decoded = sampler.generate(prompts, [n] * len(prompts), smp, gen)
        leaf_tokens = sum(len(c.token_ids) for g in groups for c, _ in g)
        gen = torch.Generator().manual_seed(a.seed + 1)
        indep = backend.generate([q for q in prompts for _ in range(n)], smp, gen)
        indep_tokens = sum(len(c.token_ids) for c in indep)
        out[name] = {
            "leaves_per_prompt": n,
            "tree_tokens": decoded,
            "leaf_tokens": leaf_tokens,
            "independent_tokens": indep_tokens,
            "ratio_vs_independent": decoded / indep_tokens,
            "ratio_within_tree": decoded / leaf_tokens,
            "mean_leaf_length": leaf_tokens / (n * len(prompts)),
            "mean_independent_length": indep_tokens / (n * len(prompts)),
            "stats": dict(sampler.last_stats),
        }
        out[name]["options"] = sampler.opts.model_dump()
        if name == "etmr":
            out[name]["M"] = a.etmr_roots
            out[name]["paper_ratio"] = token_ratio(etmr.branches, etmr.forks)
        print(
            f"{name}: {n} leaves/prompt, tree {decoded} tokens vs independent {indep_tokens} "
            f"-> {decoded / indep_tokens:.3f} (within tree {decoded / leaf_tokens:.3f})"
        )
    res = {
        "config_overrides": a.set,
        "prompts": a.prompts,
        "seed": a.seed,
        "sampling": {"temperature": smp.temperature, "top_p": smp.top_p, "max_new_tokens": smp.max_new_tokens},
        "samplers": out,
        "created": benchinfo.stamp(),
        "git": benchinfo.git(),
        "machine": benchinfo.machine(),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    return res


if __name__ == "__main__":
    main()
