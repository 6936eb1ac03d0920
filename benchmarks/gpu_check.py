"""The GPU check (issue #29, item 5): one run on one CUDA GPU that fits ten minutes, one JSON.

``make gpu-check`` (or ``python benchmarks/gpu_check.py --out FILE``) on a machine with one H100
or H200 whose Python has torch, transformers, peft and numpy (the rest of rollwise's pure-Python
dependencies may come as wheels; no vLLM, no internet). Each part is timed and kept apart, so one
that fails records its error and the others still run:

1. ``gpu_tests``: ``pytest tests/gpu`` (pass / fail / skip counts and the tail of its output).
2. ``matmul``: the GPU's bf16 matrix-product rate (8192^3 ``torch.mm``, median of 10 after 3
   warm-ups), the yardstick of the percentages below.
3. ``parity``: the tiny model's training on CUDA against CPU from the same weights and batch, fp32
   compute: three GRPO optimizer steps (loss each step) and the log-probs after them, with the
   tolerance stated in the JSON.
4. ``generation``: SmolLM2-135M's architecture with random weights (speed needs no real weights),
   forced-length sampling through rollwise's ``hf`` backend at batch 64 and 256: tokens/s, model
   FLOP/s as % of the bf16 matmul rate, peak memory.
   ``decode_profile``: one such generation under ``torch.profiler`` (top operators by CPU and CUDA
   time, wall time per decode step against the kernels' time).
   ``decode`` (issue #42 item 6): the ``hf`` sampler's eager and static decode paths and
   transformers' StaticCache + torch.compile, at batch 64 and 256: tokens/s, ms per decode step,
   kernel launches per step and the step's bytes over the bandwidth measured in the same run; the
   static path decodes on its generation copy (bf16 linears; its size in the JSON)
   (``--smoke`` runs this part alone on a CPU at toy sizes).
5. ``training``: the same model, ``Trainer.optimize`` on 64 rows x (32 prompt + 224 completion)
   random tokens: tokens/s (every position) and % of the bf16 rate, peak memory.
   ``training_packing``: the same rows with natural completion lengths (75..224), ``train.packing``
   off against on: real tokens/s and their FLOPs as % of the bf16 rate (issue #42 item 4).
6. ``demo``: the embedded default (``rollwise train`` with no settings) on the GPU: seconds and
   held-out pass@1 before and after.
7. ``regime2``: ``benchmarks/regime_smollm2_gpu.toml``, uniform, ``wise`` and GRESO x 3 seeds as 9
   concurrent processes on the GPU, ``--regime2-budget`` generated tokens each (default 6,000, ~10
   uniform steps: the ~4.5 minutes left after the parts above, measured at 210-240 s on an H200,
   at an estimated 6 s per uniform step and 10 s per evaluation with 9 processes sharing the GPU,
   about half the window, since none of it was measured on a GPU yet); tokens to target and final
   held-out pass@1 per arm with their intervals, from compare.json. The sweep is killed at
   ``--deadline`` (540 s from the start), and the rest of the JSON is still written (it is
   rewritten after every part). Needs SmolLM2's real weights: skipped with the reason when absent.

SmolLM2's GGUF (93.8 MiB) and the wheels regime 2 needs exceed one device call's 64 MiB, so they
come in two calls, back to back (the machine keeps ignored files while it stays warm); ``make
gpu-bundle`` writes them here first (``benchmarks/gpu_bundle.py``, ``gpu_bundle/`` is ignored):

1. carry ``gpu_bundle/smollm2.gguf.part1`` and ``gpu_bundle/manifest.json`` (60.0 MiB); command
   ``python3 benchmarks/gpu_bundle.py check 1`` (part 1 arrived: size and sha256; nothing else);
2. carry ``gpu_bundle/smollm2.gguf.part2``, ``gpu_bundle/manifest.json`` and ``gpu_bundle/wheels``
   (48.5 MiB; not ``gpu_bundle`` whole, which would replace part 1); command
   ``make gpu-check; cp benchmarks/results/gpu/gpu_check.json $OUT/``.

With ``gpu_bundle/manifest.json`` present, the part ``bundle`` runs first: it reassembles the GGUF
(a missing or damaged part is named and regime 2 is skipped with that message), installs the
wheels the machine lacks into ``gpu_bundle/site`` and sets ``$ROLLWISE_SMOLLM2_GGUF``.

FLOPs: generation as ``gen_throughput.generation_flops``; training 6 x linear parameters per
position (forward 2, backward 4) plus the LM head's rebuild, as ``train_profile.step_flops``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "src"))

PARITY_RTOL = 2e-3  # CUDA vs CPU, fp32 compute (TF32 off): loss and log-probs after three steps
SMOLLM2_ARCH = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
    rope_theta=10000.0,
)


def part(results: dict, name: str, fn, *args) -> None:
    t0 = time.perf_counter()
    try:
        results[name] = fn(*args)
        results[name]["seconds"] = round(time.perf_counter() - t0, 2)
        print(f"[gpu-check] {name}: ok ({time.perf_counter() - t0:.1f} s)", flush=True)
    except Exception as e:  # noqa: BLE001 - a part that fails is recorded, the others still run
        results[name] = {
            "error": f"{type(e).__name__}: {e}",
            "traceback": traceback.format_exc()[-3000:],
            "seconds": round(time.perf_counter() - t0, 2),
        }
        print(f"[gpu-check] {name}: FAILED {type(e).__name__}: {e}", flush=True)


def environment() -> dict:
    import torch
    import transformers

    dev = torch.device("cuda:0")
    props = torch.cuda.get_device_properties(dev)
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "gpu": torch.cuda.get_device_name(dev),
        "gpu_memory_gib": round(props.total_memory / 2**30, 2),
        "multiprocessors": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
        "bf16_supported": torch.cuda.is_bf16_supported(),
        "host_cpu": platform.processor() or platform.machine(),
        "host_cpus": os.cpu_count(),
    }


def gpu_tests() -> dict:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]),
    )
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/gpu"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    tail = (p.stdout + p.stderr)[-2500:]
    last = [
        ln for ln in p.stdout.splitlines() if " in " in ln and ("passed" in ln or "failed" in ln or "skipped" in ln)
    ]
    return {"returncode": p.returncode, "summary": last[-1] if last else None, "output_tail": tail}


def matmul(n: int = 8192) -> dict:
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    med = times[len(times) // 2]
    return {"shape": [n, n, n], "bf16_tflops": 2 * n**3 / med / 1e12}


def _grpo_trainer(model, compute_dtype):
    from rollwise.config import Config
    from rollwise.objectives import OBJECTIVES
    from rollwise.trainer.trainer import Trainer

    obj = OBJECTIVES.resolve("grpo").obj
    train_cfg = Config().train.model_copy(update={"lr": 1e-3, "warmup_steps": 1})
    return Trainer(model, obj, obj.Options(), train_cfg, 1.0, compute_dtype=compute_dtype)


def parity() -> dict:
    import copy

    import torch
    from train_profile import make_batch

    from rollwise.trainer.tiny import build_tiny
    from rollwise.trainer.trainer import token_logprobs

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, tok = build_tiny("tiny-s", seed=0)
    batch = make_batch(8, 10, 24, natural=True, vocab=len(tok), seed=1)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        old = token_logprobs(model, batch, 1.0)[0] * batch.loss_mask
    batch = dataclasses.replace(batch, advantages=torch.randn(batch.size, generator=g), old_logprobs=old)
    out = {}
    for name in ("cpu", "cuda"):
        m = copy.deepcopy(model).to(name)
        trainer = _grpo_trainer(m, torch.float32)
        losses = [trainer.optimize(batch)["train/loss"] for _ in range(3)]
        with torch.no_grad():
            lp = token_logprobs(m, batch.to(name), 1.0)[0].float().cpu()
        out[name] = {"losses": losses, "logprobs": lp}
    lp_c, lp_g = out["cpu"]["logprobs"], out["cuda"]["logprobs"]
    mask = batch.loss_mask.bool()
    lp_diff = float((lp_c - lp_g)[mask].abs().max())
    loss_rel = max(abs(a - b) / max(abs(a), 1e-6) for a, b in zip(out["cpu"]["losses"], out["cuda"]["losses"]))
    return {
        "steps": 3,
        "losses_cpu": out["cpu"]["losses"],
        "losses_cuda": out["cuda"]["losses"],
        "max_loss_relative_diff": loss_rel,
        "max_logprob_abs_diff": lp_diff,
        "tolerance": PARITY_RTOL,
        "within_tolerance": bool(loss_rel <= PARITY_RTOL and lp_diff <= PARITY_RTOL),
    }


def _smollm2_random(device: str = "cuda", layers: int | None = None):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    arch = dict(SMOLLM2_ARCH, **({"num_hidden_layers": layers} if layers else {}))
    return LlamaForCausalLM(LlamaConfig(**arch)).to(device).eval()


# ---------------------------------------------------------------- decode: eager vs static vs library


def decode_step_bytes(
    params: int, weight_bytes: int, batch: int, context: int, layers: int, kv_heads: int, head_dim: int, vocab: int
) -> int:
    """Bytes one decode step must move at least: every weight once (``weight_bytes`` each, the
    compute dtype's size), each row's K and V cache over ``context`` positions in every layer (same
    size), and the (batch, vocab) fp32 logits written and read once."""
    kv = batch * context * layers * 2 * kv_heads * head_dim * weight_bytes
    return params * weight_bytes + kv + batch * vocab * 4 * 2


def memory_bandwidth(device: str, mib: int = 1024, repeats: int = 10) -> float:
    """Bytes/s of a device-to-device copy of ``mib`` MiB (read + write counted), median of ``repeats``."""
    import statistics

    import torch

    x = torch.empty(mib * 2**20 // 4, device=device)
    y = torch.empty_like(x)
    times = []
    for _ in range(repeats + 2):
        _sync(device)
        t0 = time.perf_counter()
        y.copy_(x)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * x.numel() * 4 / statistics.median(times[2:])


def _sync(device: str) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _launches(prof) -> dict:
    """Counts in a profile: kernels that ran on the GPU, the host's kernel / graph launch calls, and
    (on a CPU) the operators the host dispatched."""
    from torch.autograd import DeviceType

    ev = prof.events()
    return {
        "gpu_kernels": sum(1 for e in ev if e.device_type == DeviceType.CUDA),
        "host_launches": sum(1 for e in ev if e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch")),
        "cpu_ops": sum(1 for e in ev if e.device_type == DeviceType.CPU and e.name.startswith("aten::")),
    }


def _decoder(path: str, model, dtype, batch: int):
    """A callable (prompt rows, new tokens) -> None for one decode path, and the ``hf`` backend
    behind it (None for the library path)."""
    import torch

    from rollwise.backends.hf import HFBackend
    from rollwise.hardware.precision import autocast
    from rollwise.types import Sampling

    if path in ("eager", "static"):
        backend = HFBackend(model, eos_ids=(), pad_id=0, max_batch=batch, seed=0, compute_dtype=dtype, sampler=path)

        def run(rows, new_tokens):
            out = backend.generate(rows, Sampling(1.0, 1.0, new_tokens))
            assert {len(c.token_ids) for c in out} == {new_tokens}

        return run, backend
    # transformers' own fast path: StaticCache, and on CUDA its automatic torch.compile of the decode
    # step (mode "reduce-overhead": CUDA graphs); the scores are returned, as rollwise needs log-probs
    dev = next(model.parameters()).device

    def run(rows, new_tokens):
        ids = torch.tensor(rows, device=dev)
        with torch.no_grad(), autocast(dtype, dev):
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                cache_implementation="static",
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=0,
            )
        assert out.sequences.shape[1] == ids.shape[1] + new_tokens

    return run, None


def generation_copy(backend) -> dict | None:
    """What the static path decodes on (``rollwise.backends.generation_copy``): the dtype of its
    linears and the MiB it holds beside the master weights; None for another path."""
    gen = getattr(getattr(backend, "_static", None), "gen", None)
    if gen is None:
        return None
    dtype = str(gen.dtype or next(gen.master.parameters()).dtype).removeprefix("torch.")
    return {"linear_dtype": dtype, "own_mib": round(gen.own_bytes() / 2**20, 1), "own_tensors": len(gen.own)}


def decode(
    batches=(64, 256),
    prompt_len: int = 32,
    new_tokens: int = 128,
    device: str = "cuda",
    layers: int | None = None,
    profile_steps: int = 8,
    bandwidth_mib: int = 1024,
    paths=("eager", "static", "library"),
) -> dict:
    """Decode pace against the ceiling (issue #42 item 6), SmolLM2-135M's architecture with random
    weights, one prompt repeated per batch (a group), forced length: for each batch and path (the
    ``hf`` sampler's eager and static paths, transformers' StaticCache + torch.compile) tokens/s and
    ms per decode step (one timed call after a warm-up of the same shape, prefill included), the
    kernel launches per step (``torch.profiler`` over a call of 1 + ``profile_steps`` steps minus a
    call of 1 step, per step), the static path's generation copy (``generation_copy``: the weights it
    decodes on, linears in the compute dtype), and the step's bytes (``decode_step_bytes`` at the mean context)
    over the bandwidth measured here: the memory floor of a step and the share of it reached. A
    path that fails records its error; the others still run."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from rollwise.hardware.precision import resolve_compute_dtype

    model = _smollm2_random(device, layers)
    cfg = model.config
    dtype = resolve_compute_dtype("auto", device) if device.startswith("cuda") else torch.float32  # smoke: fp32
    weight_bytes = 2 if dtype == torch.bfloat16 else 4
    bandwidth = memory_bandwidth(device, bandwidth_mib)
    params = sum(p.numel() for p in model.parameters())
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    prompt = [5 + i % 1000 for i in range(prompt_len)]
    rows_out = []
    for b in batches:
        rows = [prompt] * b
        step_bytes = decode_step_bytes(
            params,
            weight_bytes,
            b,
            prompt_len + new_tokens // 2,
            cfg.num_hidden_layers,
            cfg.num_key_value_heads,
            head_dim,
            cfg.vocab_size,
        )
        floor_ms = 1000 * step_bytes / bandwidth
        for path in paths:
            row = {"batch": b, "path": path, "step_bytes": step_bytes, "floor_ms_per_step": round(floor_ms, 4)}
            try:
                run, backend = _decoder(path, model, dtype, b)
                for n in (new_tokens, 1, 1 + profile_steps):  # warm-ups (graphs and compiled shapes)
                    run(rows, n)
                if generation_copy(backend) is not None:
                    row["generation_copy"] = generation_copy(backend)
                _sync(device)
                t0 = time.perf_counter()
                run(rows, new_tokens)
                _sync(device)
                sec = time.perf_counter() - t0
                counts = []
                for n in (1, 1 + profile_steps):
                    with profile(activities=acts) as prof:
                        run(rows, n)
                        _sync(device)
                    counts.append(_launches(prof))
                per_step = {k: round((counts[1][k] - counts[0][k]) / profile_steps, 1) for k in counts[0]}
                ms = 1000 * sec / new_tokens
                row.update(
                    seconds=round(sec, 3),
                    tokens_per_s=round(b * new_tokens / sec, 1),
                    ms_per_step=round(ms, 3),
                    percent_of_memory_floor=round(100 * floor_ms / ms, 2),
                    launches_per_step=per_step,
                )
            except Exception as e:  # noqa: BLE001 - one path's failure is recorded, the others still run
                row["error"] = f"{type(e).__name__}: {e}"
            rows_out.append(row)
            print(f"[gpu-check] decode {path} batch {b}: {row.get('tokens_per_s', row.get('error'))}", flush=True)
        _sync(device)
    return {
        "model": "SmolLM2-135M architecture, random weights" + (f", {layers} layers" if layers else ""),
        "device": device,
        "compute_dtype": str(dtype),
        "prompt_tokens": prompt_len,
        "new_tokens": new_tokens,
        "bandwidth_gb_s": round(bandwidth / 1e9, 1),
        "rows": rows_out,
    }


def generation(bf16_tflops: float, batches=(64, 256), prompt_len: int = 32, new_tokens: int = 128) -> dict:
    import torch
    from gen_throughput import generation_flops, linear_params

    from rollwise.backends.hf import HFBackend
    from rollwise.hardware.precision import resolve_compute_dtype
    from rollwise.types import Sampling

    model = _smollm2_random()
    dtype = resolve_compute_dtype("auto", "cuda")
    backend = HFBackend(model, eos_ids=(), pad_id=0, max_batch=max(batches), seed=0, compute_dtype=dtype)
    p_body, p_head = linear_params(model)
    cfg = model.config
    prompt = tuple(range(5, 5 + prompt_len))
    rows = []
    for b in batches:
        sampling = Sampling(1.0, 1.0, new_tokens)
        backend.generate([prompt] * b, Sampling(1.0, 1.0, 8))  # warm-up
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = backend.generate([prompt] * b, sampling)
        torch.cuda.synchronize()
        sec = time.perf_counter() - t0
        assert {len(c.token_ids) for c in out} == {new_tokens}
        flops = generation_flops(p_body, p_head, cfg.num_hidden_layers, cfg.hidden_size, prompt_len, new_tokens, b)
        rows.append(
            {
                "batch": b,
                "seconds": round(sec, 3),
                "tokens_per_s": b * new_tokens / sec,
                "model_tflops": flops / sec / 1e12,
                "percent_of_bf16_matmul": 100 * flops / sec / (bf16_tflops * 1e12),
                "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
            }
        )
    return {
        "model": "SmolLM2-135M architecture, random weights",
        "compute_dtype": str(dtype),
        "prompt_tokens": prompt_len,
        "new_tokens": new_tokens,
        "params": sum(p.numel() for p in model.parameters()),
        "batches": rows,
    }


def decode_profile(batch: int = 64, new_tokens: int = 16, top: int = 12) -> dict:
    """Where a decode step of the ``hf`` sampler spends its time on the GPU: ``torch.profiler`` over
    one generation (SmolLM2 architecture, random weights), the top operators by self CPU time and
    by self CUDA time, and the wall time per decode step against the summed CUDA kernel time (a
    step far longer than its kernels is launch- or Python-bound)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from rollwise.backends.hf import HFBackend
    from rollwise.hardware.precision import resolve_compute_dtype
    from rollwise.types import Sampling

    model = _smollm2_random()
    backend = HFBackend(
        model, eos_ids=(), pad_id=0, max_batch=batch, seed=0, compute_dtype=resolve_compute_dtype("auto", "cuda")
    )
    prompt = tuple(range(5, 37))
    backend.generate([prompt] * batch, Sampling(1.0, 1.0, 4))  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        backend.generate([prompt] * batch, Sampling(1.0, 1.0, new_tokens))
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    rows = prof.key_averages()
    cuda_attr = "self_device_time_total" if hasattr(rows[0], "self_device_time_total") else "self_cuda_time_total"
    cuda_total = sum(getattr(e, cuda_attr) for e in rows) / 1e6

    def by(attr):
        return [
            {"op": e.key, "self_s": getattr(e, attr) / 1e6, "calls": e.count}  # noqa: E731
            for e in sorted(rows, key=lambda e: -getattr(e, attr))[:top]
        ]

    return {
        "batch": batch,
        "new_tokens": new_tokens,
        "wall_s_profiled": round(wall, 3),
        "wall_s_per_decode_step": round(wall / new_tokens, 4),
        "cuda_kernel_s_total": round(cuda_total, 4),
        "top_self_cpu": by("self_cpu_time_total"),
        "top_self_cuda": by(cuda_attr),
    }


def training(
    bf16_tflops: float, rows: int = 64, prompt_len: int = 32, completion_len: int = 224, steps: int = 3
) -> dict:
    import torch
    from gen_throughput import linear_params
    from train_profile import make_batch, step_flops

    from rollwise.hardware.device import keep_logits_bytes
    from rollwise.hardware.precision import resolve_compute_dtype

    model = _smollm2_random().train()
    dtype = resolve_compute_dtype("auto", "cuda")
    trainer = _grpo_trainer(model, dtype)
    trainer.cfg = trainer.cfg.model_copy(update={"micro_batch": rows})
    batch = make_batch(rows, prompt_len, completion_len, natural=False, vocab=model.config.vocab_size, seed=0)
    batch = dataclasses.replace(batch, advantages=torch.randn(rows, generator=torch.Generator().manual_seed(3)))
    trainer.optimize(batch)  # warm-up
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        trainer.optimize(batch)
    torch.cuda.synchronize()
    sec = (time.perf_counter() - t0) / steps
    p_body, p_head = linear_params(model)
    positions = rows * (prompt_len + completion_len)
    kept = rows * completion_len * p_head // model.config.hidden_size * 4 <= keep_logits_bytes(torch.device("cuda"))
    flops = step_flops(p_body, p_head, positions, rows * completion_len, kept)
    return {
        "model": "SmolLM2-135M architecture, random weights",
        "compute_dtype": str(dtype),
        "rows": rows,
        "tokens_per_step": positions,
        "seconds_per_step": round(sec, 4),
        "tokens_per_s": positions / sec,
        "model_tflops": flops / sec / 1e12,
        "percent_of_bf16_matmul": 100 * flops / sec / (bf16_tflops * 1e12),
        "logits_kept": bool(kept),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
    }


def training_packing(
    bf16_tflops: float,
    rows: int = 64,
    prompt_len: int = 32,
    completion_len: int = 224,
    steps: int = 3,
    device: str = "cuda",
    arch: dict | None = None,
) -> dict:
    """Issue #42 item 4: the training step with ``train.packing`` off (one padded row per sequence)
    and on (packed rows, per-sequence position ids), SmolLM2's architecture (``arch``), rows of
    natural lengths (completions uniform in [L/3, L]), compute dtype ``auto``, interleaved after a
    warm-up of each. Tokens/s counts the real (non-padding) tokens; ``useful_percent_of_bf16_matmul``
    the model FLOPs of those tokens (``train_profile.step_flops``) over the bf16 matmul rate measured
    in the same run. ``device`` and ``arch`` let a CPU test run it small."""
    import statistics

    import torch
    from gen_throughput import linear_params
    from train_profile import make_batch, step_flops
    from transformers import LlamaConfig, LlamaForCausalLM

    from rollwise.hardware.device import keep_logits_bytes
    from rollwise.hardware.precision import resolve_compute_dtype

    dev = torch.device(device)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**(arch or SMOLLM2_ARCH))).to(dev).train()
    dtype = resolve_compute_dtype("auto", dev) if dev.type == "cuda" else torch.float32  # CPU: the small test
    trainer = _grpo_trainer(model, dtype)
    trainer.cfg = trainer.cfg.model_copy(update={"micro_batch": rows})
    batch = make_batch(rows, prompt_len, completion_len, natural=True, vocab=model.config.vocab_size, seed=0)
    batch = dataclasses.replace(batch, advantages=torch.randn(rows, generator=torch.Generator().manual_seed(3)))

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    times: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(steps + 1):  # round 0 warms up both
        for mode in ("off", "on"):
            trainer.packing = mode
            sync()
            t0 = time.perf_counter()
            trainer.optimize(batch)
            sync()
            if r:
                times[mode].append(time.perf_counter() - t0)
    p_body, p_head = linear_params(model)
    real = int(batch.attention_mask.sum())
    completions = int(batch.loss_mask.sum())
    kept = completions * model.config.vocab_size * 4 <= keep_logits_bytes(dev)
    flops = step_flops(p_body, p_head, real, completions, kept)
    out = {
        "model": "SmolLM2-135M architecture, random weights" if arch is None else "given architecture",
        "device": str(dev),
        "compute_dtype": str(dtype),
        "rows": rows,
        "padded_positions": int(batch.attention_mask.numel()),
        "real_tokens_per_step": real,
    }
    for mode, sec in times.items():
        med = statistics.median(sec)
        out[mode] = {
            "seconds_per_step": round(med, 4),
            "tokens_per_s": real / med,
            "useful_percent_of_bf16_matmul": 100 * flops / med / (bf16_tflops * 1e12),
        }
    out["speedup_on_over_off"] = out["off"]["seconds_per_step"] / out["on"]["seconds_per_step"]
    return out


def demo(run_dir: Path, timeout_s: int) -> dict:
    code = (
        f"import rollwise; cfg = rollwise.load_config(overrides=['run.dir={run_dir}', 'run.name=demo', "
        "'run.progress=false']); r = rollwise.train(cfg); print('RESULT', r.summary())"
    )
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        ROLLWISE_CACHE=str(run_dir / "cache"),
        HF_HUB_OFFLINE="1",
    )
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout_s)
        rc, text = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, text = "timeout", (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    sec = time.perf_counter() - t0
    evals = (
        [json.loads(ln) for ln in (run_dir / "demo" / "eval.jsonl").read_text().splitlines()]
        if (run_dir / "demo" / "eval.jsonl").exists()
        else []
    )
    metrics = (
        (run_dir / "demo" / "metrics.jsonl").read_text().splitlines()
        if (run_dir / "demo" / "metrics.jsonl").exists()
        else []
    )
    last = json.loads(metrics[-1]) if metrics else {}
    return {
        "returncode": rc,
        "wall_s": round(sec, 1),
        "steps": len(metrics),
        "pass_at_1_first": evals[0].get("eval/pass@1") if evals else None,
        "pass_at_1_last": evals[-1].get("eval/pass@1") if evals else None,
        "eval_steps": [e["step"] for e in evals],
        "device": {k: v for k, v in last.items() if k.startswith("device/")},
        "log_tail": [ln for ln in text.splitlines() if ln.strip()][-12:],
    }


REGIME2_SWEEP = HERE / "regime_smollm2_gpu.toml"
REGIME2_BUDGET = 6000  # generated tokens per run: ~10 uniform steps (see --regime2-budget)
REGIME2_MIN_S = 120  # below this many seconds left, regime 2 is skipped rather than started
RUN_ROOT = Path("/tmp/rollwise-gpu-check")


def _child_env() -> dict:
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p),
        ROLLWISE_CACHE=str(RUN_ROOT / "cache"),
        HF_HUB_OFFLINE="1",
    )


def _run_group(code: str, log: Path, timeout: float, env: dict) -> tuple[object, float]:
    """``python -c code`` in its own process group (compare's spawned workers included), output to
    ``log``; past ``timeout`` seconds the whole group is killed. Returns (returncode or "timeout", seconds)."""
    import signal

    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = "timeout"
    return rc, round(time.perf_counter() - t0, 1)


def _tail(path: Path, n: int = 15) -> list[str]:
    return [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()][-n:] if path.exists() else []


def regime2_sweep(out: Path, budget: int, sweep: Path = REGIME2_SWEEP, set_: dict | None = None) -> Path:
    """The sweep file regime 2 runs: ``sweep`` with the budget replaced and its runs under ``out``
    (fresh each time); ``set_`` joins the base (the CPU test replaces model.device)."""
    import tomli_w

    from rollwise.config import read_toml

    raw = read_toml(Path(sweep))
    raw["budget"] = {"generated_tokens": int(budget)}
    raw["out_dir"] = str(out)
    raw["runs_dir"] = str(out / "runs")
    raw["base"].update(set_ or {})
    path = out / "sweep.toml"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(raw))
    return path


def _runs_progress(runs_dir: Path) -> dict:
    """Each run's progress from its ledger (what a sweep cut by the timeout leaves)."""
    out = {}
    for d in sorted(p for p in runs_dir.glob("*") if p.is_dir()):
        metrics = (d / "metrics.jsonl").read_text().splitlines() if (d / "metrics.jsonl").exists() else []
        evals = (d / "eval.jsonl").read_text().splitlines() if (d / "eval.jsonl").exists() else []
        last = json.loads(metrics[-1]) if metrics else {}
        ev = [json.loads(e) for e in evals]
        out[d.name] = {
            "steps": len(metrics),
            "generated_tokens": last.get("cost/generated_tokens"),
            "pass_at_1": [(e.get("step"), e.get("eval/pass@1")) for e in ev],
            "done": (d / "done.json").exists(),
        }
    return out


def _compare_summary(c: dict) -> dict:
    arms = {}
    for name, a in c["arms"].items():
        m = a["metrics"]
        arms[name] = {
            "tokens_to_target": m["tokens_to_target"],
            "final_pass@1": m["final_pass@1"],
            "pass_at_1_start": a["curve"]["mean"][0] if a["curve"].get("mean") else None,
            "ratios_vs_baseline": a["ratios"],
            "per_seed": {
                s: {k: r[k] for k in ("steps", "generated_tokens", "final_pass@1", "wall_s", "stopped_by")}
                for s, r in a["runs"].items()
            },
        }
    return {"target": c["target"], "arms": arms, "warnings": c["warnings"]}


def regime2(budget: int = REGIME2_BUDGET, seconds: float = 300.0, bundle_error: str | None = None) -> dict:
    """Regime 2 (``benchmarks/regime_smollm2_gpu.toml``): uniform, ``wise`` and GRESO x 3 seeds as 9
    concurrent processes on the GPU, ``budget`` generated tokens each, all within ``seconds``.

    First one process converts the GGUF and trains the warm start every run shares (cached under
    $ROLLWISE_CACHE, so the 9 runs only load it); then ``rollwise compare --jobs 9`` in its own
    process group, killed at the deadline. Records tokens to target and final held-out pass@1 per
    arm with their intervals (compare.json), or, when cut, each run's progress."""
    try:
        from rollwise.trainer.hf_models import smollm2_gguf_path

        path = smollm2_gguf_path()
    except Exception as e:  # noqa: BLE001
        why = f"bundle: {bundle_error}" if bundle_error else f"{type(e).__name__}: {e}"
        return {
            "skipped": f"SmolLM2 weights not present here ({why}); the GGUF (98 MB) exceeds one 64 MiB transfer: "
            "bring it in two parts (benchmarks/gpu_bundle.py, make gpu-bundle)"
        }
    if seconds < REGIME2_MIN_S:
        return {
            "skipped": f"weights at {path}, but only {seconds:.0f} s left of the check's deadline (< {REGIME2_MIN_S})"
        }
    deadline = time.perf_counter() + seconds
    out = RUN_ROOT / "regime2"
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    sweep = regime2_sweep(out, budget)
    env = _child_env()
    res: dict = {"gguf": str(path), "sweep": str(sweep), "budget_generated_tokens": budget, "seconds_allowed": seconds}
    prep = (
        "from rollwise.bench.sweep import load_sweep, plan; from rollwise.session import Run; "
        f"spec = plan(load_sweep({str(sweep)!r}))[0]; "
        f"run = spec.cfg.run.model_copy(update={{'dir': {str(out / 'prep')!r}, 'name': 'prep'}}); "
        "Run(spec.cfg.model_copy(update={'run': run})); print('prep done')"
    )
    rc, sec = _run_group(prep, out / "prep.log", deadline - time.perf_counter(), env)
    res["prep"] = {"returncode": rc, "seconds": sec, "log_tail": _tail(out / "prep.log", 8)}
    if rc != 0:
        res["error_note"] = "GGUF conversion / warm start failed or ran out of time; the sweep did not start"
        return res
    code = f"from rollwise.bench.runner import compare; compare({str(sweep)!r}, jobs=9)"
    rc, sec = _run_group(code, out / "compare.log", deadline - time.perf_counter(), env)
    res["compare"] = {"returncode": rc, "seconds": sec, "log_tail": _tail(out / "compare.log")}
    res["timed_out"] = rc == "timeout"
    if (out / "compare.json").exists():  # written before the report (which needs matplotlib)
        res.update(_compare_summary(json.loads((out / "compare.json").read_text())))
    res["runs"] = _runs_progress(out / "runs")
    return res


def _time(fn, device: str, repeats: int = 20) -> float:
    """Median seconds of ``fn()`` after 3 warm-up calls."""
    for _ in range(3):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def fp8_gemm(device: str = "cuda", tokens=(64, 4096), shapes=((576, 1536), (1536, 576)), block: int = 128) -> dict:
    """FP8 linear layers (issue #45 item 7, ``rollwise.hardware.fp8``) at SmolLM2-135M's MLP shapes: seconds of
    a bf16 ``F.linear``, the emulated FP8 path (quantise to e4m3 and back, bf16 matmul), the real one
    (``model.fp8_gemm = "scaled_mm"``: e4m3 codes through ``torch._scaled_mm`` per 128-block of the reduction
    axis) and one whole-matrix tensor-scaled ``torch._scaled_mm`` (the kernel's own speed, no block scales),
    with the real path's largest difference from the emulated one relative to the output's scale."""
    rows = [_fp8_row(device, m, k, n, block) for m in tokens for k, n in shapes]
    return {"device": device, "block": block, "rows": rows}


def _fp8_row(device: str, m: int, k: int, n: int, block: int) -> dict:
    import torch
    import torch.nn.functional as F

    from rollwise.hardware.fp8 import E4M3, fp8_operand, k_blocks, quantise_activation, quantise_weight, scaled_matmul

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(m * 7 + k)
    x = torch.randn(m, k, device=device, dtype=dtype, generator=g)
    w = torch.randn(n, k, device=device, dtype=dtype, generator=g) / k**0.5
    wq, ws = fp8_operand(w, block, block)
    wb = k_blocks(wq, block)
    qw = quantise_weight(w, block)  # the same codes times their scales (tests/unit/hardware/test_fp8.py)
    x8, w8, one = x.to(E4M3), w.to(E4M3), torch.ones((), device=device)

    def emulated():
        return F.linear(quantise_activation(x, block), qw)

    def real():
        xq, xs = fp8_operand(x, 1, block)
        return scaled_matmul(k_blocks(xq, block), xs, wb, ws, m, n, block)

    def kernel():
        return torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, out_dtype=dtype)

    ref = emulated().float()
    row = {"tokens": m, "in": k, "out": n}
    row["max_rel_diff_real_vs_emulated"] = float((real() - ref).abs().max() / ref.abs().max())
    plain = "bf16" if device == "cuda" else "model_dtype"
    for name, fn in ((plain, lambda: F.linear(x, w)), ("emulated", emulated), ("scaled_mm_blocks", real)):
        row[f"{name}_s"] = _time(fn, device)
        row[f"{name}_tflops"] = 2 * m * k * n / row[f"{name}_s"] / 1e12
    try:
        row["scaled_mm_tensorwise_s"] = _time(kernel, device)
        row["scaled_mm_tensorwise_tflops"] = 2 * m * k * n / row["scaled_mm_tensorwise_s"] / 1e12
    except RuntimeError as e:  # a layout or size the device's kernel refuses: recorded, the rest still stands
        row["scaled_mm_tensorwise_error"] = f"{type(e).__name__}: {e}"[:300]
    return row


def smoke(out: Path) -> int:
    """The parts a CPU can run, at toy sizes, with the JSON written after each (the smoke test)."""
    results: dict = {"check": "rollwise gpu-check --smoke", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ")}
    out.parent.mkdir(parents=True, exist_ok=True)
    part(results, "decode", decode, (2, 4), 8, 4, "cpu", 2, 2, 16)
    part(results, "fp8_gemm", fp8_gemm, "cpu", (16,), ((64, 48),), 32)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0 if all("error" not in results[k] for k in ("decode", "fp8_gemm")) else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(HERE / "results" / "gpu" / "gpu_check.json"))
    p.add_argument("--demo-timeout", type=int, default=240)
    p.add_argument(
        "--regime2-budget",
        type=int,
        default=REGIME2_BUDGET,
        help=f"generated tokens per regime-2 run (default {REGIME2_BUDGET:,}: ~10 uniform steps, sized to fit)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=540.0,
        help="seconds from the check's start by which regime 2 is cut (the rest of the JSON is still written); "
        "a device call allows 600",
    )
    p.add_argument("--bundle", default=str(ROOT / "gpu_bundle"), help="gpu_bundle.py's folder (if present)")
    p.add_argument(
        "--skip",
        nargs="*",
        default=[],
        help="parts to skip (gpu_tests parity generation decode decode_profile fp8_gemm training training_packing "
        "demo regime2)",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="on a CPU, at toy sizes: the decode comparison (2 layers, batches 2 and 4, 4 new tokens) and the FP8 "
        "products",
    )
    args = p.parse_args(argv)
    import torch

    if args.smoke:
        return smoke(Path(args.out))
    if not torch.cuda.is_available():
        print("gpu-check: torch sees no CUDA device; nothing to check", file=sys.stderr)
        return 2
    results: dict = {"check": "rollwise gpu-check", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    t_all = time.perf_counter()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every part: a call cut short still leaves the parts done
        results["total_seconds"] = round(time.perf_counter() - t_all, 1)
        out.write_text(json.dumps(results, indent=2, default=str) + "\n")

    if (Path(args.bundle) / "manifest.json").exists():  # before rollwise is imported (wheels, the GGUF)
        from gpu_bundle import prepare

        part(results, "bundle", prepare, Path(args.bundle))
    part(results, "environment", environment)
    if "gpu_tests" not in args.skip:
        part(results, "gpu_tests", gpu_tests)
        save()
    part(results, "matmul", matmul)
    peak = results["matmul"].get("bf16_tflops", 0) or 1.0
    for name, fn, fargs in (
        ("parity", parity, ()),
        ("generation", generation, (peak,)),
        ("decode", decode, ()),
        ("decode_profile", decode_profile, ()),
        ("fp8_gemm", fp8_gemm, ()),
        ("training", training, (peak,)),
        ("training_packing", training_packing, (peak,)),
        ("demo", demo, (RUN_ROOT, args.demo_timeout)),
    ):
        if name not in args.skip:
            part(results, name, fn, *fargs)
            save()
    if "regime2" not in args.skip:
        left = args.deadline - (time.perf_counter() - t_all)
        part(results, "regime2", regime2, args.regime2_budget, left, results.get("bundle", {}).get("error"))
    save()
    print(f"[gpu-check] wrote {out} ({results['total_seconds']} s)")
    return 0 if all("error" not in v for v in results.values() if isinstance(v, dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
