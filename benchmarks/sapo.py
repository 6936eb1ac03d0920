"""SAPO swarms against the same peers isolated (issue #14 item 4), on the embedded default.

Every arm is one ``rollwise swarm`` (rollwise.distributed.swarm): N peers at once on this machine,
peer k with ``run.seed = k``, each stopped at the same generated-token budget (its own
generation: received rollouts are charged to nobody), evaluated every 25 steps on the default
held-out split (200 prompts x 4 samples). Arms (``--arms``):

- ``isolated_32``: 4 peers, 32 prompts x 8 rollouts per step, ``external = 0`` (no sharing:
  exactly single-node GRPO, the default run). An isolated peer does not depend on the others, so
  peers 0-1 are the 2-peer baseline and peers 0-3 the 4-peer one.
- ``isolated_16``: the same with 16 prompts per step: the control for the SAPO arms, which
  generate 16 groups per step too (a smaller batch alone changes tokens to target).
- ``sapo2_16+16`` / ``sapo4_16+16``: 2 / 4 peers, 16 local + 16 received groups per step (the
  paper's best 4L/4E split, scaled), received groups re-scored by each peer, zero-advantage ones
  skipped (the default).
- ``sapo2_32+32``: 2 peers, 32 local + 32 received (the default's generation, twice the training).

Tokens to target are per peer (its own ``cost/generated_tokens``) and computed as
``rollwise compare`` does (rollwise.bench.analysis), with the peers as seeds; the target is the
embedded default's (``--target``, docs/results.md: uniform's final mean pass@1 at 150k tokens).

    HF_HUB_OFFLINE=1 python benchmarks/sapo.py              # -> benchmarks/results/sapo/sapo.json
    HF_HUB_OFFLINE=1 python benchmarks/sapo.py --arms isolated_32 sapo2_16+16
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
    "isolated_32": (4, ["replay.options.external=0"]),
    "isolated_16": (4, ["control.prompts_per_step=16", "replay.options.external=0"]),
    "sapo2_16+16": (2, ["control.prompts_per_step=16", "replay.options.external=16"]),
    "sapo4_16+16": (4, ["control.prompts_per_step=16", "replay.options.external=16"]),
    "sapo2_32+32": (2, ["replay.options.external=32"]),
}
# the compared arms: (arm, its baseline, peers used from each)
PAIRS = [("sapo2_16+16", "isolated_16", 2), ("sapo2_16+16", "isolated_32", 2), ("sapo4_16+16", "isolated_16", 4),
         ("sapo4_16+16", "isolated_32", 4), ("sapo2_32+32", "isolated_32", 2)]


def run_arm(name: str, runs: Path, budget: int, log=print) -> dict:
    """The arm's swarm summary; a swarm whose peers all finished is not run again."""
    from rollwise.distributed.swarm import run_swarm

    peers, sets = ARMS[name]
    summary = runs / name / "swarm.json"
    if summary.is_file() and all(p["returncode"] == 0 for p in json.loads(summary.read_text())["peers"].values()):
        log(f"{name}: done before, kept")
        return json.loads(summary.read_text())
    t0 = time.perf_counter()
    out = run_swarm(None, BASE + sets + [f"train.budget_generated_tokens={budget}", f"run.dir={runs}", f"run.name={name}",
                                         "run.overwrite=true"], peers, log=lambda m: log(f"[{name}] {m}"))
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    summary.write_text(json.dumps(out, indent=1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--runs", type=Path, default=Path("runs/bench/sapo"))
    ap.add_argument("--budget", type=int, default=150_000, help="generated tokens per peer")
    ap.add_argument("--target", type=float, default=0.5558333333333333, help="held-out pass@1 target (docs/results.md)")
    ap.add_argument("--out", type=Path, default=RESULTS / "sapo" / "sapo.json")
    args = ap.parse_args()
    from rollwise.bench.analysis import analyse
    from rollwise.ledger import read_jsonl

    info = {"machine": machine(), "git": git(), "started": stamp()}
    swarms = {a: run_arm(a, args.runs, args.budget) for a in args.arms}
    evals = {a: {i: read_jsonl(Path(p["run_dir"]) / "eval.jsonl") for i, p in enumerate(s["peers"].values())}
             for a, s in swarms.items()}
    result = {**info, "finished": stamp(), "budget_generated_tokens_per_peer": args.budget, "base_overrides": BASE,
              "arms": {a: {"peers": ARMS[a][0], "overrides": ARMS[a][1], "wall_s": s.get("wall_s"), "peer_summary": s["peers"]}
                       for a, s in swarms.items()},
              "comparisons": {}}
    for arm, base, n in PAIRS:
        if arm not in evals or base not in evals:
            continue
        sub = {arm: {i: evals[arm][i] for i in range(n)}, base: {i: evals[base][i] for i in range(n)}}
        res = analyse(sub, base, float(args.budget), [4], target=args.target)
        for a in res["arms"].values():
            a.pop("curve")  # the eval.jsonl files hold them; the JSON stays readable
        result["comparisons"][f"{arm} vs {base} ({n} peers)"] = res
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for name, c in result["comparisons"].items():
        print(name)
        for a, r in c["arms"].items():
            m = r["metrics"]
            print(f"  {a:14s} tokens to target {m['tokens_to_target']['value']}  per peer {m['tokens_to_target']['per_seed']}  "
                  f"final pass@1 {m['final_pass@1']['value']:.3f} per peer {m['final_pass@1']['per_seed']}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
