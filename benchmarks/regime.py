"""A regime's waste statistics (issue #18): what a sweep base's task and model give at step 0,
and how they move through training, beside the published figures of docs/regime.md.

Step 0: the sweep's baseline arm is built as ``rollwise compare`` would build it (task, warm start,
sampling), and ``--group-size`` rollouts are sampled for each of the first ``--prompts`` training
prompts with the step-0 weights (no training). Reported: the share of all-correct (AC), all-wrong
(AW) and zero-variance groups, the AC and AW groups' shares of the generated tokens (what a perfect
skip would not generate), the per-prompt pass-rate histogram (bins of 1/G) with its mean and
spread, per level when the task has levels, and response lengths in tokens (median, p90, p95, p99,
max, the share cut at ``max_new_tokens``, the share of tokens in the longest 5% of responses,
p90/p50 and p99/p50).

Warm-start examples: the supervised examples the sweep's warm start trains on (the task's
``sft_examples``, as many and with the seed that ``rollwise.trainer.warm_start`` uses), without any
model: per level, the share whose target does not verify (an arithmetic ramble, ``task.options.ramble``)
and the target lengths in characters plus the end token (the built-in tiny model's tokens). Written
whenever the task has such examples; cheap, so a candidate's traces can be read before its warm start runs.

Through training: with ``--runs DIR``, each run's ``metrics.jsonl`` in DIR (the per-step
``groups/all_correct_frac``, ``groups/all_wrong_frac``, ``length/*`` written by every run) is
summarised at the start, the middle and the end of the runs whose name starts with ``--arm``, with
what its levers did (``levers``: steps, degenerate share, prompts skipped, tokens ARRoL pruned) and
their mean over the runs.

    python benchmarks/regime.py benchmarks/regime_cot.toml --prompts 256
    python benchmarks/regime.py benchmarks/regime_cot.toml --prompts 0 --runs runs/compare/regime_cot
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", help="a sweep TOML (its baseline arm, seed 0, is probed)")
    p.add_argument("--prompts", type=int, default=256, help="training prompts probed at step 0 (0 = skip the probe)")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--batch", type=int, default=32, help="prompts per generate call")
    p.add_argument("--runs", default=None, help="a sweep's runs directory: statistics through training")
    p.add_argument("--arm", default=None, help="the arm read with --runs (default: the sweep's baseline)")
    p.add_argument("--set", nargs="*", default=[], help="extra KEY=VALUE overrides of the probed config")
    p.add_argument("--out", default=None, help="JSON output (default benchmarks/results/regime_<sweep name>.json)")
    return p.parse_args(argv)


def length_stats(lengths: list[int], cut: int) -> dict:
    """Length quantiles (rollwise.session.percentile, nearest rank), cut share and tail token share."""
    from rollwise.session import percentile

    s = sorted(lengths)
    top = s[-max(1, len(s) // 20) :]
    p50 = percentile(s, 0.5)
    return {
        "n": len(s),
        "mean": round(sum(s) / len(s), 2),
        "p50": p50,
        "p90": percentile(s, 0.9),
        "p95": percentile(s, 0.95),
        "p99": percentile(s, 0.99),
        "max": s[-1],
        "truncated_frac": round(cut / len(s), 4),
        "top5pct_token_share": round(sum(top) / sum(s), 4),
        "p90_over_p50": round(percentile(s, 0.9) / p50, 2),
        "p99_over_p50": round(percentile(s, 0.99) / p50, 2),
    }


def group_stats(groups, g: int) -> dict:
    """All-correct / all-wrong shares as every run logs them (rollwise.session.regime_metrics), and
    the per-prompt pass rates (groups with two or more verified rewards) as a histogram."""
    from rollwise.control.history import CORRECT
    from rollwise.session import regime_metrics

    m = regime_metrics(groups)
    ac, aw = m["groups/all_correct_frac"], m["groups/all_wrong_frac"]
    # per group with two or more verified rewards: its pass rate, and the tokens of the degenerate ones
    # (what a perfect skip would not generate; its saving's cap is 1 / (1 - share))
    rates, tok = [], {"all_wrong": 0, "all_correct": 0, "all": 0}
    for grp in groups:
        v, t = grp.verified_rewards(), sum(len(r.completion_ids) for r in grp.rollouts)
        tok["all"] += t
        if len(v) >= 2:
            rates.append(sum(x >= CORRECT for x in v) / len(v))
            tok["all_correct"] += t if rates[-1] == 1 else 0
            tok["all_wrong"] += t if rates[-1] == 0 else 0
    n = max(1, len(rates))
    hist = [0] * (g + 1)
    for r in rates:
        hist[round(r * g)] += 1
    return {
        "groups": len(rates),
        "all_correct_frac": round(ac, 4),
        "all_wrong_frac": round(aw, 4),
        "zero_variance_frac": round(ac + aw, 4),
        "pass_rate_mean": round(sum(rates) / n, 4),
        "pass_rate_sd": round(statistics.pstdev(rates), 4) if rates else None,
        f"pass_rate_hist_k_of_{g}": hist,
        "token_share_all_wrong": round(tok["all_wrong"] / max(1, tok["all"]), 4),
        "token_share_all_correct": round(tok["all_correct"] / max(1, tok["all"]), 4),
    }


def example_stats(examples, task, max_new_tokens: int) -> dict:
    """Warm-start ``(prompt, target)`` examples: how many, the share whose target the task's verifier
    scores 0 (overall and per ``kind_of``), and the target lengths (characters + 1 end token;
    ``length_stats``, "truncated" = longer than ``max_new_tokens``)."""
    lengths = [len(t) + 1 for _, t in examples]
    wrong = [task.verify(p, t).score == 0.0 for p, t in examples]
    by: dict = defaultdict(list)
    for (p, _), w in zip(examples, wrong):
        by[kind_of(p)].append(w)
    return {
        "n": len(examples),
        "wrong_frac": round(sum(wrong) / len(wrong), 4),
        "wrong_frac_by_level": {k: round(sum(v) / len(v), 4) for k, v in sorted(by.items())},
        "lengths": length_stats(lengths, sum(n > max_new_tokens for n in lengths)),
    }


def warm_start_examples(sweep_path: str) -> dict | None:
    """``example_stats`` of the examples the sweep's baseline warm start trains on (None: the task has none)."""
    from rollwise.bench.sweep import load_sweep, plan
    from rollwise.tasks import build

    sweep = load_sweep(sweep_path)
    cfg = next(s for s in plan(sweep) if s.arm == sweep.baseline).cfg
    ws, task = cfg.model.warm_start, build(cfg)
    try:
        examples = task.sft_examples(ws.steps * ws.batch_size, ws.seed)
    except (NotImplementedError, AttributeError):
        return None
    return example_stats(examples, task, cfg.sampling.max_new_tokens) if examples else None


def kind_of(prompt) -> str:
    """A prompt's level (arithmetic), else its reasoning-gym source dataset (composite), else 'all'."""
    m = prompt.metadata
    if "level" in m:
        return str(m["level"])
    return str(((m.get("entry") or {}).get("metadata") or {}).get("source_dataset") or m.get("dataset") or "all")


def probe(sweep_path: str, n_prompts: int, g: int, batch: int, overrides: list[str]) -> dict:
    from rollwise.bench.sweep import load_sweep, plan
    from rollwise.config import load_config
    from rollwise.session import Run, percentile
    from rollwise.types import Plan, Request

    sweep = load_sweep(sweep_path)
    spec = next(s for s in plan(sweep) if s.arm == sweep.baseline)
    data = spec.cfg.model_dump(mode="json")
    tmp = tempfile.mkdtemp(prefix="regime-")
    data["run"].update({"dir": tmp, "name": "probe", "progress": False, "report_to": []})
    for kv in overrides:
        key, _, value = kv.partition("=")
        node = data
        *path, last = key.split(".")
        for part in path:
            node = node[part]
        node[last] = json.loads(value) if value[:1] in "[{0123456789-tf" else value
    cfg = load_config(data=data)
    try:
        run = Run(cfg, log=lambda *a: None)  # the warm start: an interrupted one is kept (see main)
        prompts = list(run.task.train_prompts())[:n_prompts]
        groups = []
        for i in range(0, len(prompts), batch):
            groups += run.pool.generate(Plan(tuple(Request(p, g) for p in prompts[i : i + batch])), [], 0)
        run.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the probe's run directory: nothing in it is kept
    lengths = [len(r.completion_ids) for grp in groups for r in grp.rollouts]
    cut = sum(r.finish == "length" for grp in groups for r in grp.rollouts)
    by_level: dict = defaultdict(list)
    for grp in groups:
        by_level[kind_of(grp.prompt)].append(grp)
    out = {
        "config": {
            "task": cfg.task.model_dump(mode="json"),
            "model": cfg.model.name,
            "warm_start": {k: getattr(cfg.model.warm_start, k) for k in ("steps", "batch_size", "lr", "seed")},
            "max_new_tokens": cfg.sampling.max_new_tokens,
            "temperature": cfg.sampling.temperature,
            "group_size": g,
            "prompts": len(prompts),
        },
        **group_stats(groups, g),
        "lengths": length_stats(lengths, cut),
        "by_level": {
            str(k): {
                **group_stats(v, g),
                "length_p50": percentile([len(r.completion_ids) for x in v for r in x.rollouts], 0.5),
            }
            for k, v in sorted(by_level.items(), key=lambda kv: str(kv[0]))
        },
    }
    return out


def through_training(runs_dir: str, arm: str) -> dict:
    """Per run: the regime metrics at the first step, the middle one and the last one."""
    out = {}
    for d in sorted(Path(runs_dir).glob(f"{arm}-s*")):
        lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]
        lines = [x for x in lines if "groups/all_correct_frac" in x]
        if not lines:
            continue
        keys = (
            "groups/all_correct_frac",
            "groups/all_wrong_frac",
            "length/p50",
            "length/p90",
            "length/p99",
            "length/max",
            "length/truncated_frac",
        )
        pick = {"first": lines[0], "middle": lines[len(lines) // 2], "last": lines[-1]}
        out[d.name] = {
            when: {"step": x["step"], **{k.split("/")[-1]: x.get(k) for k in keys}} for when, x in pick.items()
        }
        out[d.name]["mean_over_steps"] = {
            k.split("/")[-1]: round(sum(x[k] for x in lines) / len(lines), 4) for k in keys[:2]
        }
        out[d.name]["levers"] = levers(lines)
    runs = [v["levers"] for v in out.values()]
    if runs:
        out["levers_mean_over_runs"] = {k: round(sum(r[k] for r in runs) / len(runs), 4) for k in runs[0]}
    return out


def levers(lines: list[dict]) -> dict:
    """What a run's levers did, from its ledger: optimizer steps, the mean share of degenerate groups
    trained, prompt visits a skip left out (``control/*_skipped``) and tokens ARRoL pruned."""
    return {
        "steps": len(lines),
        "degenerate_frac_mean": round(sum(x.get("groups/degenerate_frac", 0.0) for x in lines) / len(lines), 4),
        "skipped_prompts": sum(
            v for x in lines for k, v in x.items() if k.startswith("control/") and k.endswith("_skipped")
        ),
        "arrol_pruned_tokens": sum(x.get("arrol/pruned_tokens", 0) for x in lines),
    }


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv=None) -> int:
    """SIGTERM and SIGINT (even when a shell started the probe in the background, where SIGINT is
    ignored) stop it as Ctrl-C does, so an interrupted warm start is saved in the cache at its last
    step and the next probe of the same sweep continues it (rollwise.trainer.warm_start)."""
    import signal

    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    a = parse_args(argv)
    from rollwise.bench.sweep import load_sweep

    sweep = load_sweep(a.sweep)
    result = {"sweep": a.sweep, "date": benchinfo.stamp(), "machine": benchinfo.machine(), "git": benchinfo.git()}
    if (examples := warm_start_examples(a.sweep)) is not None:
        result["warm_start_examples"] = examples
    if a.prompts > 0:
        result["step0"] = probe(a.sweep, a.prompts, a.group_size, a.batch, a.set)
    if a.runs:
        result["through_training"] = through_training(a.runs, a.arm or sweep.baseline)
    out = Path(a.out or benchinfo.RESULTS / f"regime_{sweep.name}.json")
    if out.exists():  # keep the other half (step 0 or through training) of an earlier call
        old = json.loads(out.read_text())
        result = {**{k: v for k, v in old.items() if k in ("step0", "through_training")}, **result}
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"warm_start_examples": result.get("warm_start_examples")}, indent=1))
    print(json.dumps({k: v for k, v in result.get("step0", {}).items() if k != "by_level"}, indent=1))
    for lv, s in result.get("step0", {}).get("by_level", {}).items():
        print(lv, {k: s[k] for k in ("groups", "all_correct_frac", "all_wrong_frac", "pass_rate_mean", "length_p50")})
    print("->", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
