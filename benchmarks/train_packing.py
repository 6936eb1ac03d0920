"""The training step with and without packing (issue #42 item 4: ``train.packing``), on this CPU.

For each case, one optimizer step (``Trainer.optimize``: forward, backward and AdamW over every
micro-batch of the step, GRPO) with ``train.packing = "off"`` (one padded row per sequence, plain
causal attention) and ``"on"`` (rows packed into rows of at least ``PACK_ROW_TOKENS``, per-sequence
position ids, transformers' packed-sequence mask), interleaved (off, on, off, on, ...) after one
warm-up round, so that a change in the machine's load hits both alike; the median of each. The JSON
also records the decoder positions of each layout and what ``"auto"`` chooses on this device
(``trainer.pack_layout``), so the default can be checked against the times.

Cases (``--cases``):

- ``default``: the embedded default's shape: the tiny model (``tiny-s``), one step of 256 rows
  (32 prompts x 8) in micro-batches of 128, a 7-token prompt and completions of 2..8 tokens
  (``train_profile.make_batch``'s natural lengths; the arithmetic task's answers and ``<eos>``);
- ``default_forced``: the same with every completion 8 tokens (nothing to gain from packing);
- ``smollm2``: SmolLM2-135M's architecture (30 layers, random weights: time does not depend on
  them), 16 rows of a 10-token prompt and 21..64 completion tokens (``train_profile.py``'s lengths).

    python benchmarks/train_packing.py --out benchmarks/results/train_packing.json
Smoke test::

    python benchmarks/train_packing.py --cases default --rows 8 --repeats 1 --out <file>
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))
import benchinfo  # noqa: E402

CASES = {
    # name: (model, rows, micro_batch, prompt_len, completion_len, natural lengths)
    "default": ("tiny-s", 256, 128, 7, 8, True),
    "default_forced": ("tiny-s", 256, 128, 7, 8, False),
    "smollm2": ("smollm2-arch", 16, 16, 10, 64, True),
}


def build(model_name: str, seed: int = 0):
    """The model of a case (fp32, train mode)."""
    import torch

    if model_name.startswith("tiny"):
        from rollwise.trainer.tiny import build_tiny

        return build_tiny(model_name, seed=seed)[0].train()
    from gpu_check import SMOLLM2_ARCH
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(LlamaConfig(**SMOLLM2_ARCH)).train()


def layouts(batch, micro_batch: int) -> dict:
    """Decoder positions per packing setting over the step's micro-batches, and ``auto``'s choice here."""
    import torch

    from rollwise.trainer.trainer import pack_layout

    out = {"padded_positions": 0, "packed_positions": 0, "packed_rows": 0, "padded_rows": 0, "auto_packs": []}
    for start in range(0, batch.size, micro_batch):
        mb = batch.rows(slice(start, min(start + micro_batch, batch.size)))
        lengths = mb.attention_mask.sum(1).tolist()
        width = max(lengths)
        on, fill = pack_layout(lengths, width, "on", torch.device("cpu"))
        auto, _ = pack_layout(lengths, width, "auto", torch.device("cpu"))
        out["padded_positions"] += len(lengths) * width
        out["padded_rows"] += len(lengths)
        out["packed_positions"] += len(on) * fill
        out["packed_rows"] += len(on)
        out["auto_packs"].append(len(auto) < len(lengths))
    out["real_positions"] = int(batch.attention_mask.sum())
    return out


def run_case(name: str, repeats: int, rows: int | None = None, log=print) -> dict:
    import torch
    from train_profile import make_batch

    from rollwise.config import Config
    from rollwise.objectives import OBJECTIVES
    from rollwise.trainer.trainer import Trainer

    model_name, case_rows, micro, prompt_len, completion_len, natural = CASES[name]
    rows = rows or case_rows  # --rows: a smaller step (the smoke test)
    micro = min(micro, rows)
    model = build(model_name)
    grpo = OBJECTIVES.get("grpo")
    cfg = Config().train.model_copy(update={"micro_batch": micro, "lr": 1e-5})
    trainer = Trainer(model, grpo, grpo.Options(), cfg, temperature=1.0)
    vocab = model.get_input_embeddings().num_embeddings
    batch = make_batch(rows, prompt_len, completion_len, natural, vocab=vocab, seed=0)
    batch = dataclasses.replace(batch, advantages=torch.randn(rows, generator=torch.Generator().manual_seed(1)))
    times: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(repeats + 1):  # round 0 warms up
        for mode in ("off", "on"):
            trainer.packing = mode
            t0 = time.perf_counter()
            trainer.optimize(batch)
            dt = time.perf_counter() - t0
            if r:
                times[mode].append(dt)
            log(f"{name} {mode} round {r}: {dt:.3f} s", flush=True)
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    return {
        "model": model_name,
        "rows": rows,
        "micro_batch": micro,
        "prompt_len": prompt_len,
        "completion_len": f"{max(1, completion_len // 3)}..{completion_len}" if natural else completion_len,
        "layout": layouts(batch, micro),
        "seconds_off": times["off"],
        "seconds_on": times["on"],
        "median_s_off": off,
        "median_s_on": on,
        "speedup_on_over_off": off / on,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rows", type=int, default=None, help="rows per step instead of each case's own")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=str(HERE / "results" / "train_packing.json"))
    args = p.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from rollwise.trainer.trainer import PACK_MAX_ROW_FRACTION, PACK_ROW_TOKENS

    t_start = time.perf_counter()
    out = {
        "benchmark": "train_packing",
        "created": benchinfo.stamp(),
        "git": benchinfo.git(),
        "machine": benchinfo.machine(),
        "command": "python " + " ".join(sys.argv),
        "torch_threads": torch.get_num_threads(),
        "load_average_at_start": os.getloadavg(),
        "pack_row_tokens": PACK_ROW_TOKENS,
        "pack_max_row_fraction": PACK_MAX_ROW_FRACTION,
        "cases": {},
    }
    for name in args.cases:
        out["cases"][name] = run_case(name, args.repeats, args.rows)
        out["total_wall_s"] = round(time.perf_counter() - t_start, 1)
        out["load_average_at_end"] = os.getloadavg()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")  # after every case
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
