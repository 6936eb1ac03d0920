"""Where the time of rollwise's training forward + backward goes (issue #13: "if a goal is not
reached, the profile that shows where the time goes").

One micro-batch of ``--rows`` rollouts (prompt ``--prompt-len`` + completion ``--completion-len``
random tokens; ``natural`` draws completion lengths uniformly in [L/3, L] instead), the loss
``-mean(lp)`` over completion tokens, on SmolLM2-135M (``--model``; or a tiny preset). Timed, each
as the median of ``--repeats`` after one warm-up, forward and backward apart:

- ``step``: ``rollwise.trainer.trainer.token_logprobs`` with entropy (what a training step runs);
- ``decoder``: the decoder alone on the same rows (no LM head);
- ``head``: ``rollwise.trainer.head.head_logprobs`` on the completion positions alone (in chunks of
  512, logits rebuilt in the backward: the path beyond ``KEEP_LOGITS_BYTES``);
- ``full_logits``: a plain ``model(...).logits`` forward over every position, log-softmax, gather
  (no entropy): the unpacked, unchunked reference.

Then one ``step`` under ``torch.profiler``: the top operators by self CPU time. The model FLOPs of
the step (decoder 2 P_body per position forward, 4 backward; LM head 2 P_head per completion
position forward, 4 backward, 2 more if its logits are rebuilt) are divided by the measured time and by the best
rate of ``torch.mm`` at the step's own shapes (``gen_throughput.time_matmul``), so the JSON says how
close the step is to what this CPU's matrix products allow.

    HF_HUB_OFFLINE=1 python benchmarks/train_profile.py --out benchmarks/results/train_profile.json
Smoke test::

    python benchmarks/train_profile.py --model tiny-s --rows 4 --repeats 1 --out /tmp/train_profile.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchinfo  # noqa: E402
from gen_throughput import linear_params, load_model, time_matmul  # noqa: E402


def make_batch(rows: int, prompt_len: int, completion_len: int, natural: bool, vocab: int, seed: int = 0):
    import torch

    from rollwise.types import Batch

    g = torch.Generator().manual_seed(seed)
    lens = (
        torch.randint(max(1, completion_len // 3), completion_len + 1, (rows,), generator=g).tolist()
        if natural
        else [completion_len] * rows
    )
    width = prompt_len + max(lens)
    ids = torch.randint(3, vocab, (rows, width), generator=g)
    attn = torch.zeros(rows, width, dtype=torch.bool)
    loss_mask = torch.zeros(rows, width)
    for i, c in enumerate(lens):
        attn[i, : prompt_len + c] = True
        loss_mask[i, prompt_len : prompt_len + c] = 1.0
    ids[~attn] = 0
    n = int(loss_mask.sum())
    return Batch(
        ids,
        attn,
        loss_mask,
        -3.0 * loss_mask,
        torch.zeros(rows),
        torch.zeros(rows),
        torch.zeros(rows, dtype=torch.long),
        torch.zeros(rows, width, dtype=torch.long),
        num_loss_tokens=n,
        num_sequences=rows,
    )


def timed(model, fn, repeats: int) -> dict:
    fwd, bwd = [], []
    for r in range(repeats + 1):
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss = fn()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if r:
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
    return {
        "forward_s": statistics.median(fwd),
        "backward_s": statistics.median(bwd),
        "total_s": statistics.median(fwd) + statistics.median(bwd),
    }


def profile_ops(fn, top: int = 12) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn().backward()
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in rows)
    return [
        {"op": e.key, "self_s": e.self_cpu_time_total / 1e6, "share": e.self_cpu_time_total / total, "calls": e.count}
        for e in rows[:top]
    ]


def step_flops(p_body: int, p_head: int, positions: int, head_positions: int, kept: bool) -> float:
    """Matrix-product FLOPs of forward + backward: decoder 6 P_body per position (2 forward, 4
    backward), LM head 6 P_head per completion position (2 forward, 4 backward), 8 when its
    logits are rebuilt in the backward (not ``kept``, ``trainer.KEEP_LOGITS_BYTES``)."""
    return 6.0 * p_body * positions + (6.0 if kept else 8.0) * p_head * head_positions


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=10)
    p.add_argument("--completion-len", type=int, default=64)
    p.add_argument("--lengths", nargs="+", default=["forced", "natural"], choices=["forced", "natural"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default="benchmarks/results/train_profile.json")
    args = p.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from rollwise.trainer.head import head_logprobs
    from rollwise.trainer.trainer import KEEP_LOGITS_BYTES, token_logprobs

    t_start = time.perf_counter()
    model, tok, _ = load_model(args.model)
    model.train()
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    p_body, p_head = linear_params(model)
    hidden = head.in_features
    out = {
        "benchmark": "train_profile",
        "created": benchinfo.stamp(),
        "git": benchinfo.git(),
        "machine": benchinfo.machine(),
        "command": "python " + " ".join(sys.argv),
        "model": args.model,
        "p_body": p_body,
        "p_head": p_head,
        "torch_threads": torch.get_num_threads(),
        "modes": {},
    }
    for mode in args.lengths:
        b = make_batch(args.rows, args.prompt_len, args.completion_len, mode == "natural", head.out_features)
        positions = int(b.attention_mask.sum())
        comp = b.loss_mask.bool()
        n_head = int(comp.sum())

        def loss_of(lp):
            return -(lp * b.loss_mask).sum() / b.num_loss_tokens

        def step():
            return loss_of(token_logprobs(model, b, 1.0, with_entropy=True)[0])

        def dec_only():
            return decoder(input_ids=b.input_ids, use_cache=False).last_hidden_state.sum()

        h = torch.randn(n_head, hidden, requires_grad=True)
        targets = b.input_ids[comp]

        def head_only():
            return -sum(
                head_logprobs(h[i : i + 512], head, targets[i : i + 512], 1.0, True)[0].sum()
                for i in range(0, n_head, 512)
            )

        def full_logits():
            logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask.long()).logits[:, :-1].float()
            lp = torch.log_softmax(logits, -1).gather(2, b.input_ids[:, 1:, None])[..., 0]
            return loss_of(torch.nn.functional.pad(lp, (1, 0)))

        res = {
            "rows": args.rows,
            "positions": positions,
            "completion_positions": n_head,
            "width": int(b.input_ids.shape[1]),
        }
        for name, fn in (("step", step), ("decoder", dec_only), ("head", head_only), ("full_logits", full_logits)):
            res[name] = timed(model, fn, args.repeats)
            print(mode, name, res[name], flush=True)
        kept = n_head * head.out_features * 4 <= KEEP_LOGITS_BYTES
        flops = step_flops(p_body, p_head, positions, n_head, kept)
        shapes = {
            "mlp_up": time_matmul(positions, hidden, model.config.intermediate_size, 3),
            "lm_head": time_matmul(min(n_head, 512), hidden, head.out_features, 3),
        }
        best = max(s["tflops_best"] for s in shapes.values()) * 1e12
        res.update(
            {
                "head_logits_kept": kept,
                "step_matmul_flops": flops,
                "step_flops_per_s": flops / res["step"]["total_s"],
                "matmul_rate_at_step_shapes": shapes,
                "fraction_of_matmul_rate": flops / res["step"]["total_s"] / best,
                "top_ops": profile_ops(step),
            }
        )
        out["modes"][mode] = res
    out["total_wall_s"] = round(time.perf_counter() - t_start, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
