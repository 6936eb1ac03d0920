"""Does ``torch.compile`` speed up rollwise's ``hf`` generation on this CPU? (issue #13 item 1:
"static cache, torch.compile: keep what a measurement shows helps").

SmolLM2-135M fp32, ``--batch`` prompts x ``--new-tokens`` forced tokens through ``HFBackend``
(finished rows leave the batch, so the batch shape changes: ``torch.compile(model.forward,
dynamic=True)``), eager first, then compiled (its compile time is reported apart: one short
warm-up call), each timed ``--repeats`` times. Not wired into rollwise: this measures whether it
would pay.

    HF_HUB_OFFLINE=1 python benchmarks/gen_compile.py --out benchmarks/results/gen_compile.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="benchmarks/results/gen_compile.json")
    args = p.parse_args(argv)
    import torch

    from rollwise.backends.hf import HFBackend
    from rollwise.trainer.hf_models import load_pretrained
    from rollwise.types import Sampling

    model, tok = load_pretrained("smollm2-135m")
    prompts = [tok.encode(f"{i}+{i * 7}=") for i in range(args.batch)]
    sampling = Sampling(temperature=1.0, top_p=1.0, max_new_tokens=args.new_tokens)

    def timed(backend) -> list[float]:
        out = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            backend.generate(prompts, sampling)
            out.append(time.perf_counter() - t0)
        return out

    res = {
        "benchmark": "gen_compile",
        "created": benchinfo.stamp(),
        "git": benchinfo.git(),
        "machine": benchinfo.machine(),
        "command": "python " + " ".join(sys.argv),
        "batch": args.batch,
        "new_tokens": args.new_tokens,
        "torch_threads": torch.get_num_threads(),
    }
    eager = timed(HFBackend(model, (), tok.pad_token_id, max_batch=256))
    t0 = time.perf_counter()
    model.forward = torch.compile(model.forward, dynamic=True)
    backend = HFBackend(model, (), tok.pad_token_id, max_batch=256)
    backend.generate(prompts[:8], Sampling(temperature=1.0, top_p=1.0, max_new_tokens=4))
    compile_s = time.perf_counter() - t0
    compiled = timed(backend)
    tps = lambda ts: args.batch * args.new_tokens / min(ts)  # noqa: E731
    res.update(
        {
            "eager_s": eager,
            "compiled_s": compiled,
            "compile_warmup_s": compile_s,
            "eager_tokens_per_s_best": tps(eager),
            "compiled_tokens_per_s_best": tps(compiled),
            "speedup_best": min(eager) / min(compiled),
            "calls_to_repay_compile": compile_s / max(min(eager) - min(compiled), 1e-9),
        }
    )
    print(json.dumps({k: v for k, v in res.items() if k not in ("machine", "git")}, indent=1))
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
