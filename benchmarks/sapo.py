"""SAPO swarms against the same peers isolated (issue #14 item 4), on the embedded default.

Every arm is one ``rollwise swarm`` (rollwise.distributed.swarm): N peers at once on this machine,
peer k with ``run.seed = k`` and one torch thread, each stopped at the same generated-token budget
of its own generation (received rollouts are charged to nobody), evaluated every 25 steps on the
default held-out split (200 prompts x 4 samples). Arms (``--arms``; ``--parallel`` swarms at once):

- ``isolated_32``: 2 peers, 32 prompts x 8 rollouts per step, ``external = 0`` (no sharing:
  exactly single-node GRPO, i.e. the default run).
- ``isolated_16``: the same with 16 prompts per step: the control for the SAPO arms, which
  generate 16 groups per step too (a smaller batch alone changes tokens to target).
- ``sapo2_16+16`` / ``sapo4_16+16``: 2 / 4 peers, 16 local + 16 received groups per step (the
  paper's best 4L/4E split, in groups), received groups re-scored by each peer, zero-advantage
  ones skipped (the default).
- ``sapo2_32+32``: 2 peers, 32 local + 32 received (the default's generation, twice the training).

An isolated peer does not depend on the others, so an isolated arm's peers are simply seeds
0..n-1 of that configuration; the 4-peer swarm is compared with the isolated arm's peers as they
are. Tokens to target are per peer (its own ``cost/generated_tokens``), computed as ``rollwise
compare`` does (rollwise.bench.analysis) with the peers as seeds, for ``--target`` (the embedded
default's on the 2-core AVX2 EPYC of docs/results.md, where the warm start scores ~0.18: the
``seedalgos`` sweep's uniform final mean pass@1 at 100k tokens, 0.247) and for the baseline arm's
own final mean pass@1 (``rollwise compare``'s default).

    HF_HUB_OFFLINE=1 python benchmarks/sapo.py                  # -> benchmarks/results/sapo/sapo.json
    HF_HUB_OFFLINE=1 python benchmarks/sapo.py --arms isolated_16 sapo2_16+16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchinfo import RESULTS, git, machine, stamp  # noqa: E402

BASE = ["train.steps=5000", "eval.every=25", "run.checkpoint_every=0", "run.progress=false"]
ARMS = {  # name: (peers, overrides)
    "isolated_16": (2, ["control.prompts_per_step=16", "replay.options.external=0"]),
    "isolated_32": (2, ["replay.options.external=0"]),
    "sapo2_16+16": (2, ["control.prompts_per_step=16", "replay.options.external=16"]),
    "sapo4_16+16": (4, ["control.prompts_per_step=16", "replay.options.external=16"]),
    "sapo2_32+32": (2, ["replay.options.external=32"]),
}
# the compared arms: (arm, its baseline); an isolated peer does not depend on the others, so a
# baseline's peers are seeds 0..n-1 of that configuration whatever the arm's swarm size
PAIRS = [
    ("sapo2_16+16", "isolated_16"),
    ("sapo4_16+16", "isolated_16"),
    ("sapo2_16+16", "isolated_32"),
    ("sapo2_32+32", "isolated_32"),
    ("isolated_16", "isolated_32"),
]


def run_arm(name: str, runs: Path, budget: int, log=print) -> dict:
    """The arm's swarm summary; a swarm whose peers all finished is not run again."""
    from rollwise.distributed.swarm import run_swarm

    peers, sets = ARMS[name]
    summary = runs / name / "swarm.json"
    if summary.is_file():
        done = json.loads(summary.read_text())
        if done.get("budget") == budget and all(p["returncode"] == 0 for p in done["peers"].values()):
            log(f"{name}: done before, kept")
            return done
    t0 = time.perf_counter()
    out = run_swarm(
        None,
        BASE
        + sets
        + [f"train.budget_generated_tokens={budget}", f"run.dir={runs}", f"run.name={name}", "run.overwrite=true"],
        peers,
        log=lambda m: log(f"[{name}] {m}"),
    )
    out.update(wall_s=round(time.perf_counter() - t0, 1), budget=budget, git=git(), finished=stamp())
    summary.write_text(json.dumps(out, indent=1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--runs", type=Path, default=Path("runs/bench/sapo"))
    ap.add_argument("--budget", type=int, default=100_000, help="generated tokens per peer")
    ap.add_argument(
        "--target",
        type=float,
        default=0.247,
        help="held-out pass@1 target: the embedded default's on this CPU (docs/results.md, seedalgos: uniform's "
        "final mean pass@1 at 100k tokens); the baseline's own final mean is reported too",
    )
    ap.add_argument("--parallel", type=int, default=2, help="swarms run at once")
    ap.add_argument("--out", type=Path, default=RESULTS / "sapo" / "sapo.json")
    args = ap.parse_args()
    from rollwise.bench.analysis import analyse
    from rollwise.ledger import read_jsonl

    info = {"machine": machine(), "git": git(), "started": stamp()}
    from concurrent.futures import ThreadPoolExecutor

    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: F401  (lazy imports are not thread-safe: once, here)

    with ThreadPoolExecutor(args.parallel) as pool:  # each swarm waits on its peer processes
        swarms = dict(zip(args.arms, pool.map(lambda a: run_arm(a, args.runs, args.budget), args.arms)))
    evals = {
        a: {i: read_jsonl(Path(p["run_dir"]) / "eval.jsonl") for i, p in enumerate(s["peers"].values())}
        for a, s in swarms.items()
    }
    result = {
        **info,
        "finished": stamp(),
        "budget_generated_tokens_per_peer": args.budget,
        "base_overrides": BASE,
        "parallel_swarms": args.parallel,
        "arms": {
            a: {"peers": ARMS[a][0], "overrides": ARMS[a][1], "wall_s": s.get("wall_s"), "peer_summary": s["peers"]}
            for a, s in swarms.items()
        },
        "comparisons": {},
    }
    for target in (args.target, "gain:1"):  # gain:1: the baseline's final mean pass@1 (the default before #43)
        for arm, base in PAIRS:
            if arm not in evals or base not in evals:
                continue
            res = analyse({arm: evals[arm], base: evals[base]}, base, float(args.budget), [4], target=target)
            for a in res["arms"].values():
                a.pop("curve")  # the eval.jsonl files hold them; the JSON stays readable
            result["comparisons"][f"{arm} vs {base}, target {res['target']['value']:.3f}"] = res
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for name, c in result["comparisons"].items():
        print(name)
        for a, r in c["arms"].items():
            m = r["metrics"]
            print(
                f"  {a:14s} tokens to target {m['tokens_to_target']['value']}  per peer "
                f"{m['tokens_to_target']['per_seed']}  final pass@1 {m['final_pass@1']['value']:.3f} per peer "
                f"{m['final_pass@1']['per_seed']}"
            )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
