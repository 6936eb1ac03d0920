"""Tokens decoded by the entropy-tree samplers against independent sampling at the same number of
leaves (issue #45): ETMR (``rollwise.generate.etmr``; the paper's M = 12 roots, and the preset's N = 2
forks, B = 2 branches: 60 leaves, claimed at 0.6 of the tokens) and EC-Tree (``rollwise.generate.ec_tree``; n
leaves per prompt).

For each of ``--prompts`` training prompts of the configured task, on the run's warm-started policy
(the embedded default unless ``--regime`` or ``--set`` overrides say otherwise; the warm start is the
cached one), with the options of the presets ``configs/etmr.toml`` and ``configs/ec_tree.toml``:

- the tree sampler's group: the tokens it decoded (roots in full, each branch from its fork on,
  EC-Tree's pruned completions and top-ups included) and the total length of its leaves;
- ``leaves`` independent samples of the same prompt by the same backend: their total length.

Reported per sampler: ``ratio_vs_independent`` = tree tokens / independent tokens (the issue's
measure: what the tree costs against sampling its leaf count independently), ``ratio_within_tree``
= tree tokens / the leaves' total length (the share not shared), and for ETMR the paper's formula
``(1 + 0.5 B N) / (1 + B N)``. For EC-Tree also ``signals``: on the independent samples (which are
what its bases are), the share with a branch point (``ec_tree.branch_point``) and the deciles of the
three signals its gate reads (entropy, grouped confidence, entropy jump) from ``min_depth`` on,
which say which gate keeps it from branching. The CPU, torch threads and code commit are recorded.

``--regime cot``: regime 1 (longer chain-of-thought traces, ``docs/regime.md``): the run config is the
``[base]`` of ``benchmarks/regime_cot.toml`` (chain-of-thought arithmetic at levels 3-5, up to 256
new tokens, its cached warm start), and the two options the presets shortened for the embedded
default's ~3-token answers go back to the spec's values for traces of ~40 tokens, as that sweep's
arms scale theirs: ETMR's ``ignore_first`` 4 (the first 4 tokens are never forks) and EC-Tree's
``min_depth`` 4 (the released code's). ``--set`` overrides apply on top of either.

    nice -n 10 python benchmarks/tree_tokens.py                      # -> benchmarks/results/tree_tokens.json
    nice -n 10 python benchmarks/tree_tokens.py --regime cot --prompts 4  # -> .../tree_tokens_cot.json

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
HERE = Path(__file__).resolve().parent

# --regime: the sweep whose [base] is the run config, and the preset options scaled to its traces
REGIMES = {
    "default": (None, []),
    "cot": (HERE / "regime_cot.toml", ["sampling.etmr.ignore_first=4", "sampling.ec_tree.min_depth=4"]),
}


def regime_base(name: str) -> dict:
    """The run config of ``--regime name`` as a nested dict ({} for the embedded default)."""
    sweep_file = REGIMES[name][0]
    if sweep_file is None:
        return {}
    from rollwise.bench.sweep import base_data, load_sweep

    return base_data(load_sweep(sweep_file))


def signal_summary(backend, prompts, comps, sampling, opts) -> dict:
    """EC-Tree's branch signals on completions ``comps`` of ``prompts``: how many have a branch point,
    and the 10th, 50th and 90th percentiles (and the extremes) of H, C^G and dH at positions
    t >= ``min_depth`` (module docstring)."""
    import statistics

    from rollwise.generate.ec_tree import branch_point, signals
    from rollwise.generate.forks import sampler_tables

    sigs = [signals(t, opts) for t in sampler_tables(backend, prompts, [c.token_ids for c in comps], sampling)]

    def spread(xs):
        if len(xs) < 2:
            return None
        q = statistics.quantiles(xs, n=10)
        return {"min": min(xs), "p10": q[0], "p50": q[4], "p90": q[8], "max": max(xs)}

    d = opts.min_depth
    return {
        "completions": len(sigs),
        "with_branch_point": sum(branch_point(s, opts) is not None for s in sigs),
        "positions": sum(max(0, len(s.h) - d) for s in sigs),
        "entropy": spread([x for s in sigs for x in s.h[d:]]),
        "grouped_confidence": spread([x for s in sigs for x in s.cg[d:]]),
        "entropy_jump": spread([x for s in sigs for x in s.dh[d:]]),
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--regime", choices=sorted(REGIMES), default="default", help="what to measure on (module doc)")
    p.add_argument("--set", action="append", default=[], help="config override section.key=value (repeatable)")
    p.add_argument("--prompts", type=int, default=16, help="training prompts measured")
    p.add_argument("--etmr-roots", type=int, default=12, help="M (paper: 12)")
    p.add_argument("--ec-leaves", type=int, default=10, help="EC-Tree's group size n")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="result file (default: benchmarks/results/tree_tokens[_<regime>].json)")
    a = p.parse_args(argv)
    a.out = a.out or str(
        benchinfo.RESULTS / ("tree_tokens.json" if a.regime == "default" else f"tree_tokens_{a.regime}.json")
    )

    import torch

    from rollwise import components
    from rollwise.config import load_config
    from rollwise.generate.ec_tree import EcTreeSampler
    from rollwise.generate.etmr import EtmrSampler, leaves, token_ratio
    from rollwise.types import Sampling

    base, scaled = regime_base(a.regime), REGIMES[a.regime][1]
    cfg = load_config(None, a.set, data=base)
    etmr = load_config(CONFIGS / "etmr.toml", scaled + a.set).sampling.etmr  # the presets' options
    ec = load_config(CONFIGS / "ec_tree.toml", scaled + a.set).sampling.ec_tree
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
        if name == "ec_tree":
            out[name]["signals"] = signal_summary(backend, [q for q in prompts for _ in range(n)], indep, smp, ec)
        if name == "etmr":
            out[name]["M"] = a.etmr_roots
            out[name]["paper_ratio"] = token_ratio(etmr.branches, etmr.forks)
        print(
            f"{name}: {n} leaves/prompt, tree {decoded} tokens vs independent {indep_tokens} "
            f"-> {decoded / indep_tokens:.3f} (within tree {decoded / leaf_tokens:.3f})"
        )
    res = {
        "regime": a.regime,
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
