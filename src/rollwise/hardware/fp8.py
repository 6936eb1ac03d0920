"""FP8 rollouts, Jet-RL's way: the sampler's linear layers in float8 e4m3 with block scales, and
(``train.matched_quantisation``) the same quantisation in the trainer's forward, so that the policy
that samples is numerically the policy being trained.

Paper: "Jet-RL: Enabling On-Policy FP8 Reinforcement Learning with Unified Training and Rollout
Precision Flow", arXiv 2601.14243 (no code; systems.md §11.1, agents-and-rest.md "FP8/FP4 flows").
BF16-train + FP8-rollout makes the sampler ``mu`` differ from the trainer's ``pi``; the error
compounds over long generations and turns training off-policy (collapse at 16k-token rollouts).
Jet-RL's fix: one FP8 recipe (fine-grained per-block weight scales, per-group activation scales
for every linear GEMM, BF16 master weights) in the rollout *and* the training forward.

What is built here, emulated (fake quantisation: quantise to ``torch.float8_e4m3fn`` and back, so
it runs on any CPU; no speed-up is claimed or measured):

- :func:`fake_quantise`: ``x -> round_e4m3(x / s) * s`` per tile, ``s = amax(tile) / 448`` (448 is
  e4m3's largest finite value), a tile of zeros keeping scale 1. Weights use ``block x block``
  tiles, activations ``1 x block`` groups along the feature axis; ``block`` is
  ``model.fp8_block_size`` (128, the DeepSeek-V3 / DeepGEMM granularity Jet-RL reports building
  on; the paper's exact granularities are not verified: reconstruction).
- :func:`quantise_linears`: every ``nn.Linear`` of the decoder computes ``F.linear(q(x), q(W), b)``
  (its ``forward`` replaced on the instance); the LM head, the embeddings, norms and attention's
  softmax stay in the model's precision, as in the FP8 recipes Jet-RL follows (the output head
  is not an FP8 GEMM there). Gradients pass straight through the quantiser
  (``x + (q(x) - x).detach()``) to the full-precision master weights, so the optimizer is unchanged.
  ``q(W)`` is cached per weight and per in-place version (``Tensor._version``, bumped by every
  optimizer step), so a sampler quantises each weight once per update, not once per token.
- :func:`sampler_copy`: the sampler's module (``model.rollout_precision = "fp8"``): a copy of the
  policy's module tree that **shares** its parameters and buffers (no second copy of the weights:
  every optimizer step is seen at once, as with the colocated sampler), with quantised linears. The
  trainer keeps the original module: full precision unless ``train.matched_quantisation``, which
  quantises it too (:func:`quantise_linears` on the trainer's model), Jet-RL's unified flow.

The sampler/trainer gap (``rollwise.trainer.mismatch``: ``mismatch/abs_mean``, ``mismatch/k3_kl``)
shows the difference: with FP8 rollouts and a full-precision trainer it is the quantisation error;
with the matched trainer only the rounding between a cached decode and a full forward remains.

The Sol-RL variant (an FP8 candidate pool, its contrastive subset re-scored by the full-precision
trainer) is ``rollwise.generate.sol_rl`` (``sampling.sol_rl``), on this module's sampler.

Real FP8 GEMMs (``model.fp8_gemm = "scaled_mm"``, :func:`scaled_linear`): the same quantised operands,
kept in ``float8_e4m3fn``, multiplied by ``torch._scaled_mm`` (FP8 tensor cores on H100/H200; torch's
CPU kernel elsewhere) one ``block`` of the reduction axis at a time, each block's fp32 product scaled
by its activation scales (per token) and weight scales (per output feature, from its tile) and the
blocks summed in fp32. That is the emulated path's product up to the order of fp32 additions (tested),
so the two differ in speed only. The backward of a matched trainer stays in high precision with the
straight-through gradients of the emulated path (``_ScaledLinear``); the block loop is this build's,
not DeepGEMM's single block-scaled kernel, so its speed is a lower bound (the GPU check times it).

Not built: FP8 in the backward pass. Refused at load
(``rollwise.compat.check_rollout_precision``): other backends than ``hf`` (vLLM quantises with its
own kernels), rollout workers, FSDP and LoRA (adapter products would stay unquantised).
"""

from __future__ import annotations

import copy
import functools

import torch
import torch.nn.functional as F

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)  # 448


def fake_quantise(x: torch.Tensor, block_rows: int, block_cols: int) -> torch.Tensor:
    """``x`` (..., R, C) quantised to e4m3 per ``block_rows x block_cols`` tile of its last two axes
    and dequantised, in ``x``'s dtype. Each tile's scale is ``amax / 448``, so its largest entry is
    exactly representable; edge tiles are the remainders. Example: the tile [[1, 0.3]] has scale
    1 / 448; 0.3 * 448 = 134.4 rounds to e4m3's 128 (3 mantissa bits: a step of 16 in [128, 256)),
    so it comes back as 128 / 448 = 0.28571."""
    if x.numel() == 0:
        return x
    *lead, rows, cols = x.shape
    pr, pc = -rows % block_rows, -cols % block_cols
    xf = F.pad(x.float(), (0, pc, 0, pr))
    tiles = xf.reshape(*lead, (rows + pr) // block_rows, block_rows, (cols + pc) // block_cols, block_cols)
    amax = tiles.abs().amax(dim=(-3, -1), keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (tiles / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).float() * scale
    return q.reshape(*lead, rows + pr, cols + pc)[..., :rows, :cols].to(x.dtype)


def quantise_weight(w: torch.Tensor, block: int) -> torch.Tensor:
    """``w`` (out, in) with ``block x block`` tile scales (Jet-RL's per-block weight scales)."""
    return fake_quantise(w, block, block)


def quantise_activation(x: torch.Tensor, block: int) -> torch.Tensor:
    """``x`` (..., features) with one scale per ``block`` consecutive features of each token
    (Jet-RL's per-group activation scales)."""
    flat = x.reshape(-1, 1, x.shape[-1]) if x.dim() >= 1 else x
    return fake_quantise(flat, 1, block).reshape(x.shape)


def _straight_through(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``q`` in the forward, the identity's gradient in the backward (when ``x`` needs one)."""
    return x + (q - x).detach() if torch.is_grad_enabled() and x.requires_grad else q


class _WeightCache:
    """``make(W, block)`` of one weight (its fake-quantised value, or its e4m3 codes and scales), kept
    while the weight's storage and in-place version are the same."""

    def __init__(self, make=None) -> None:
        self.make = make or quantise_weight
        self.key = None
        self.value = None

    def get(self, w: torch.Tensor, block: int):
        key = (w.data_ptr(), w._version, w.dtype, w.device, block)
        if key != self.key:
            with torch.no_grad():
                self.value = self.make(w.detach(), block)
            self.key = key
        return self.value


def _fp8_forward(module: torch.nn.Linear, block: int, cache: _WeightCache, x: torch.Tensor) -> torch.Tensor:
    w = module.weight
    qw = _straight_through(w, cache.get(w, block).to(w.dtype))
    qx = _straight_through(x, quantise_activation(x, block))
    return F.linear(qx, qw.to(qx.dtype) if qx.dtype != qw.dtype else qw, module.bias)


def fp8_operand(x: torch.Tensor, block_rows: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (R, C) as e4m3 codes and scales: ``(q, s)`` with ``q`` (R, C') ``float8_e4m3fn`` (C padded with
    zeros to a multiple of ``block``) and ``s`` (ceil(R / block_rows), C' / block) fp32, one per tile, so
    that ``q.float() * s`` (each scale spread over its tile) is :func:`fake_quantise`'s value."""
    rows, cols = x.shape
    pr, pc = -rows % block_rows, -cols % block
    xf = F.pad(x.detach().float(), (0, pc, 0, pr))
    tiles = xf.reshape((rows + pr) // block_rows, block_rows, (cols + pc) // block, block)
    amax = tiles.abs().amax(dim=(1, 3), keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (tiles / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).reshape(rows + pr, cols + pc)[:rows]
    return q, scale[:, 0, :, 0]


def k_blocks(q: torch.Tensor, block: int) -> torch.Tensor:
    """(R, C') e4m3 codes as (C'/block, R', block) contiguous blocks of the reduction axis, rows padded
    with zeros to a multiple of 16 (what the FP8 kernels take)."""
    rows, cols = q.shape
    pad = -rows % 16
    if pad:
        q = torch.cat([q, torch.zeros(pad, cols, dtype=q.dtype, device=q.device)])
    return q.reshape(rows + pad, cols // block, block).transpose(0, 1).contiguous()


def scaled_matmul(xb, xs, wb, ws, m: int, n: int, block: int) -> torch.Tensor:
    """``x @ W.T`` (m, n) in fp32 from e4m3 codes in reduction blocks (:func:`k_blocks`): ``xb`` with
    per-token scales ``xs`` (m, blocks), ``wb`` with tile scales ``ws`` (ceil(n/block), blocks); one
    ``torch._scaled_mm`` per block (unit scales, fp32 out), scaled by the outer product of its scales,
    summed in fp32."""
    one = torch.ones((), device=xb.device)
    out = None
    for kb in range(xb.shape[0]):
        part = torch._scaled_mm(xb[kb], wb[kb].t(), scale_a=one, scale_b=one, out_dtype=torch.float32)[:m, :n]
        part = part * xs[:, kb : kb + 1] * ws[:, kb].repeat_interleave(block)[:n]
        out = part if out is None else out + part
    return out


def _dequantised(b: torch.Tensor, s: torch.Tensor, rows: int, cols: int, block_rows: int, block: int):
    """The high-precision value ``q * s`` (rows, cols) of codes in reduction blocks (:func:`k_blocks`)."""
    q = b.transpose(0, 1).reshape(b.shape[1], -1)[:rows].float()
    scale = s.repeat_interleave(block_rows, 0)[:rows].repeat_interleave(block, 1)
    return (q * scale)[:, :cols]


class _ScaledLinear(torch.autograd.Function):
    """``F.linear`` of quantised operands through :func:`scaled_matmul`; the backward is the emulated
    path's straight-through one, in high precision: ``dx = dy @ q(W)``, ``dW = dy.T @ q(x)``."""

    @staticmethod
    def forward(ctx, x, w, bias, wb, ws, block):
        lead, k, n = x.shape[:-1], x.shape[-1], w.shape[0]
        x2 = x.reshape(-1, k)
        xq, xs = fp8_operand(x2, 1, block)
        xb = k_blocks(xq, block)
        y = scaled_matmul(xb, xs, wb, ws, x2.shape[0], n, block)
        if bias is not None:
            y = y + bias.float()
        ctx.block, ctx.has_bias, ctx.m, ctx.k, ctx.n = block, bias is not None, x2.shape[0], k, n
        ctx.save_for_backward(xb, xs, wb, ws)
        ctx.x_dtype, ctx.w_dtype = x.dtype, w.dtype
        return y.to(x.dtype).reshape(*lead, n)

    @staticmethod
    def backward(ctx, dy):
        xb, xs, wb, ws = ctx.saved_tensors
        block, k = ctx.block, ctx.k
        d2 = dy.reshape(-1, dy.shape[-1]).float()
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = (d2 @ _dequantised(wb, ws, ctx.n, k, block, block)).to(ctx.x_dtype).reshape(*dy.shape[:-1], k)
        if ctx.needs_input_grad[1]:
            dw = (d2.t() @ _dequantised(xb, xs, ctx.m, k, 1, block)).to(ctx.w_dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = d2.sum(0).to(ctx.w_dtype)
        return dx, dw, db, None, None, None


def _fp8_weight(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight's e4m3 codes in reduction blocks (:func:`k_blocks`) and its tile scales."""
    q, scale = fp8_operand(w, block, block)
    return k_blocks(q, block), scale


def _scaled_forward(module: torch.nn.Linear, block: int, cache: _WeightCache, x: torch.Tensor) -> torch.Tensor:
    wb, ws = cache.get(module.weight, block)
    return _ScaledLinear.apply(x, module.weight, module.bias, wb, ws, block)


def scaled_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, block: int) -> torch.Tensor:
    """``F.linear(q(x), q(W), bias)`` with real FP8 products (module docstring)."""
    return _ScaledLinear.apply(x, w, bias, *_fp8_weight(w, block), block)


def _head(model) -> torch.nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    try:
        return get() if callable(get) else None
    except (AttributeError, NotImplementedError):
        return None


def quantised(model) -> bool:
    """Whether :func:`quantise_linears` was applied to ``model``."""
    return bool(getattr(model, "_rollwise_fp8_block", None))


GEMMS = ("emulated", "scaled_mm")


def quantise_linears(model, block: int = 128, gemm: str = "emulated"):
    """Every ``nn.Linear`` of ``model`` except its LM head computes in e4m3 (module docstring): fake
    quantisation (``gemm = "emulated"``) or real FP8 products (``"scaled_mm"``); returns ``model``.
    Idempotent; the weights themselves are not changed."""
    if block < 1:
        raise ValueError(f"fp8 block size must be >= 1, got {block}")
    if gemm not in GEMMS:
        raise ValueError(f"fp8 gemm must be one of {GEMMS}, got {gemm!r}")
    if quantised(model):
        return model
    head = _head(model)
    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear) and mod is not head:
            if gemm == "scaled_mm":
                mod.forward = functools.partial(_scaled_forward, mod, block, _WeightCache(_fp8_weight))
            else:
                mod.forward = functools.partial(_fp8_forward, mod, block, _WeightCache())
    model._rollwise_fp8_block = block
    return model


def sampler_copy(model, block: int = 128, gemm: str = "emulated"):
    """The sampler's module: ``model``'s module tree sharing its parameters and buffers, with
    quantised linears (module docstring); ``model`` itself is not changed."""
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return quantise_linears(copy.deepcopy(model, memo=shared), block, gemm)


def check_scaled_mm(device: torch.device) -> None:
    """``model.fp8_gemm = "scaled_mm"`` needs ``torch._scaled_mm`` and, on a GPU, FP8 tensor cores (compute
    capability 8.9 or newer: Ada, Hopper, Blackwell); a clear error otherwise."""
    from rollwise.registry import UserError

    if not hasattr(torch, "_scaled_mm"):
        raise UserError(
            f"model.fp8_gemm = 'scaled_mm' needs torch._scaled_mm, which torch {torch.__version__} lacks: "
            "use model.fp8_gemm = 'emulated'"
        )
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        cap = ".".join(map(str, torch.cuda.get_device_capability(device)))
        raise UserError(
            f"model.fp8_gemm = 'scaled_mm' needs FP8 tensor cores (compute capability 8.9 or newer), and "
            f"{torch.cuda.get_device_name(device)} has {cap}: use model.fp8_gemm = 'emulated'"
        )


def for_run(cfg, model, log=print):
    """``(sampler's module, trainer's module)`` of a run (the assembler, ``rollwise.components``): with
    ``model.rollout_precision = "fp8"`` the sampler gets :func:`sampler_copy`, and with
    ``train.matched_quantisation`` the trainer's ``model`` is quantised as well; otherwise both are
    ``model``, unchanged."""
    if cfg.model.rollout_precision != "fp8":
        return model, model
    block, gemm = cfg.model.fp8_block_size, cfg.model.fp8_gemm
    if gemm == "scaled_mm":
        check_scaled_mm(next(model.parameters()).device)
    sampler = sampler_copy(model, block, gemm)
    matched = bool(cfg.train.matched_quantisation)
    if matched:
        quantise_linears(model, block, gemm)
    how = "emulated" if gemm == "emulated" else "in FP8 products (torch._scaled_mm)"
    log(
        f"rollout precision: fp8 e4m3 {how} ({block}x{block} weight tiles, 1x{block} activation groups); "
        f"trainer {'matched (same quantisation)' if matched else 'in model precision (unmatched)'}"
    )
    return sampler, model
