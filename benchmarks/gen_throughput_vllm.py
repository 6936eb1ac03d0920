"""The ``vllm`` arm of ``benchmarks/gen_throughput.py``: generation throughput of
``model.backend = "vllm"`` (rollwise.backends.vllm) beside the ``hf`` backend, SmolLM2-135M, on the
same forced-length work and against the same fp32 matmul bound (its helpers are imported, so the
FLOP count and the bound are the same code).

Work: ``batch`` copies of one chat prompt, every completion forced to ``--new-tokens`` tokens
(vLLM: ``ignore_eos``; hf: no EOS ids), temperature 1, top-p 1, one untimed warm-up call per
batch size, then ``--repeats`` timed calls; tokens/s = batch x new tokens / median seconds. Each
(backend, dtype) runs in its own subprocess (vLLM's CPU engine is one per process). bf16: vLLM
runs the model in bfloat16; hf runs fp32 weights under bf16 autocast (model.compute_dtype).

    HF_HUB_OFFLINE=1 python benchmarks/gen_throughput_vllm.py   # -> benchmarks/results/gen_throughput_vllm.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def arm(backend: str, dtype: str, batches: list[int], new_tokens: int, repeats: int) -> dict:
    import torch

    sys.path.insert(0, str(HERE))
    from gen_throughput import generation_flops, linear_params

    from rollwise.tokens import Codec
    from rollwise.trainer.hf_models import load_pretrained
    from rollwise.types import Prompt, Sampling

    model, tok = load_pretrained("smollm2-135m")
    codec = Codec(tok, use_chat=True)
    prompt = list(
        codec.encode_prompt(Prompt("0", "t", "What is 17+25?", None, ({"role": "user", "content": "What is 17+25?"},)))
    )
    body, head = linear_params(model)
    c = model.config
    flops_seq = generation_flops(body, head, c.num_hidden_layers, c.hidden_size, len(prompt), new_tokens)
    smp = Sampling(1.0, 1.0, new_tokens)
    if backend == "vllm":
        from vllm import SamplingParams

        from rollwise.backends.vllm import VLLMBackend
        from rollwise.config import ModelConfig
        from rollwise.distributed.weights import policy_weights

        eng = VLLMBackend.from_policy(model, [], ModelConfig(name="smollm2-135m", dtype=dtype, max_batch=max(batches)))
        eng.load_weights(0, policy_weights(model))

        def run(b):
            params = SamplingParams(
                temperature=1.0, max_tokens=new_tokens, ignore_eos=True, detokenize=False, logprobs=0, seed=0
            )
            out = eng.llm.generate([{"prompt_token_ids": prompt}] * b, params, use_tqdm=False)
            assert all(len(o.outputs[0].token_ids) == new_tokens for o in out)
    else:
        from rollwise.backends.hf import HFBackend

        b_ = HFBackend(
            model,
            [],
            codec.pad_id,
            max_batch=max(batches),
            compute_dtype=torch.bfloat16 if dtype == "bfloat16" else torch.float32,
        )

        def run(b):
            out = b_.generate([prompt] * b, smp)
            assert all(len(x.token_ids) == new_tokens for x in out)

    rows = []
    for b in batches:
        run(b)  # warm-up
        secs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run(b)
            secs.append(time.perf_counter() - t0)
        med = statistics.median(secs)
        rows.append(
            {
                "batch": b,
                "seconds": secs,
                "median_s": med,
                "tokens_per_s": b * new_tokens / med,
                "flops_per_s": b * flops_seq / med,
            }
        )
    return {"backend": backend, "dtype": dtype, "new_tokens": new_tokens, "prompt_tokens": len(prompt), "rows": rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[8, 32, 64, 128])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--backends", nargs="+", default=["hf", "vllm"])
    ap.add_argument("--out", default=str(HERE / "results" / "gen_throughput_vllm.json"))
    ap.add_argument("--arm", nargs=2, metavar=("BACKEND", "DTYPE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.arm:  # child process: one (backend, dtype)
        print(json.dumps(arm(a.arm[0], a.arm[1], a.batch_sizes, a.new_tokens, a.repeats)))
        return
    sys.path.insert(0, str(HERE))
    from gen_throughput import time_matmul

    bound = max(time_matmul(n, n, n, 3)["tflops_median"] for n in (512, 1024, 2048)) * 1e12
    arms = []
    for dtype in a.dtypes:
        for backend in a.backends:
            cmd = [
                sys.executable,
                __file__,
                "--arm",
                backend,
                dtype,
                "--new-tokens",
                str(a.new_tokens),
                "--repeats",
                str(a.repeats),
                "--batch-sizes",
                *map(str, a.batch_sizes),
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
            if out.returncode:
                raise SystemExit(f"{backend}/{dtype} failed:\n{out.stderr[-3000:]}")
            res = json.loads(out.stdout.strip().splitlines()[-1])
            for r in res["rows"]:
                r["fraction_of_fp32_matmul_bound"] = r["flops_per_s"] / bound
                print(
                    f"{backend:5s} {dtype:9s} batch {r['batch']:4d}: {r['tokens_per_s']:7.1f} tok/s, "
                    f"{100 * r['fraction_of_fp32_matmul_bound']:.1f}% of the fp32 matmul bound",
                    flush=True,
                )
            arms.append(res)
    from benchinfo import git, machine, stamp

    result = {
        "benchmark": "gen_throughput_vllm",
        "created": stamp(),
        "git": git(),
        "machine": machine(),
        "command": "python benchmarks/gen_throughput_vllm.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "bound_flops_per_s": bound,
        "loadavg_at_end": os.getloadavg(),
        "threads": os.cpu_count(),
        "arms": arms,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
