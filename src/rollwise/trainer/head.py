"""Log-probs and entropies of chosen tokens straight from hidden states: the LM head, the
temperature and the log-softmax in one autograd function (issue #13, "LM head and log-softmax only
at completion positions, chunked so that peak memory stays bounded").

``head_logprobs(h, head, targets, temperature, with_entropy, compute_dtype)`` returns, per row of
``h`` (n, d), ``lp = log softmax(head(h) / T)[target]`` and the entropy ``H = -sum_v p_v log p_v``
of that distribution. It saves only its inputs: the (n, V) logits are rebuilt in the backward
pass (as activation checkpointing would), so a chunk's logits live only inside one call, unless
``keep`` asks to hold its fp32 log-probs until the backward (one product fewer). The
gradient is written out instead of being left to autograd, which would keep or rebuild the
log-softmax, the gather's zero-filled scatter and the entropy's products over the whole vocabulary
(several passes over n x V floats each way). With ``z = head(h) / T`` and ``p = softmax(z)``:

    d lp / d z_v = [v = target] - p_v
    d H  / d z_v = -p_v (log p_v + H)

then ``d/dh = (dz) W / T`` and ``d/dW = (dz)^T h / T`` (``dz`` the upstream-weighted sum of the two
rows above, ``W`` the head's weight). Under ``compute_dtype`` (bf16) the two matrix products run
in that dtype and everything over the vocabulary (log-sum-exp, softmax, the gradient rows) in fp32,
as autocast does; gradients come back in the inputs' dtypes (fp32 master weights).

Only a plain ``torch.nn.Linear`` head takes this path (``fusable``); others (a LoRA-wrapped head,
test doubles) go through autograd on the same formula (``reference_head_logprobs``).
"""

from __future__ import annotations

import torch


def fusable(head) -> bool:
    """True for a plain ``nn.Linear`` head (the fused function knows its weight and bias)."""
    return type(head) is torch.nn.Linear


def _logits(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, inv_t: float, dtype: torch.dtype | None
) -> torch.Tensor:
    """fp32 ``(h W^T + b) / T``, the product in ``dtype`` (None: the weights' own)."""
    dt = dtype or weight.dtype  # .to is a no-op where the dtype already matches
    z = torch.nn.functional.linear(h.to(dt), weight.to(dt), None if bias is None else bias.to(dt))
    z = z.to(torch.promote_types(z.dtype, torch.float32))  # fp32 (fp64 stays fp64: gradcheck)
    if inv_t != 1.0:
        z.mul_(inv_t)
    return z


class _HeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, bias, targets, inv_t, with_entropy, dtype, keep):
        logp = _logits(h, weight, bias, inv_t, dtype)
        logp.sub_(torch.logsumexp(logp, dim=-1, keepdim=True))  # now log p
        lp = logp.gather(1, targets[:, None])[:, 0]
        ent = -(logp.exp() * logp).sum(-1) if with_entropy else torch.zeros_like(lp)
        ctx.save_for_backward(h, weight, bias, targets, logp if keep else None)
        ctx.inv_t, ctx.with_entropy, ctx.dtype = inv_t, with_entropy, dtype
        ctx.set_materialize_grads(False)
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        h, weight, bias, targets, kept = ctx.saved_tensors
        if g_lp is None and (g_ent is None or not ctx.with_entropy):
            return (None,) * 8
        if kept is not None:  # read only below
            logp = kept
        else:
            logp = _logits(h, weight, bias, ctx.inv_t, ctx.dtype)
            logp.sub_(torch.logsumexp(logp, dim=-1, keepdim=True))
        p = logp.exp()
        if g_ent is not None and ctx.with_entropy:  # dz = -g_ent * p (log p + H) - g_lp * p
            ent = -(p * logp).sum(-1, keepdim=True)
            dz = (logp + ent).mul_(p).mul_(-g_ent[:, None])
            if g_lp is not None:
                dz.sub_(p.mul_(g_lp[:, None]))
        else:
            dz = p.mul_(-g_lp[:, None])
        if g_lp is not None:
            dz[torch.arange(dz.shape[0], device=dz.device), targets] += g_lp
        if ctx.inv_t != 1.0:
            dz.mul_(ctx.inv_t)
        mm = ctx.dtype or weight.dtype  # the forward's product dtype (_logits)
        dzc = dz.to(mm)
        g_h = (dzc @ weight.to(mm)).to(h.dtype) if ctx.needs_input_grad[0] else None
        g_w = (dzc.T @ h.to(mm)).to(weight.dtype) if ctx.needs_input_grad[1] else None
        g_b = dz.sum(0).to(bias.dtype) if bias is not None and ctx.needs_input_grad[2] else None
        return g_h, g_w, g_b, None, None, None, None, None


def reference_head_logprobs(
    h: torch.Tensor, head, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same values through autograd: any head module (caller's autocast applies)."""
    logits = head(h).float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    lp = logp.gather(1, targets[:, None])[:, 0]
    ent = -(logp.exp() * logp).sum(-1) if with_entropy else torch.zeros_like(lp)
    return lp, ent


def head_logprobs(
    h: torch.Tensor,
    head: torch.nn.Linear,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    compute_dtype: torch.dtype | None = None,
    keep: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(lp, entropy), each (n,) fp32, of ``targets`` under ``softmax(head(h) / temperature)``
    (temperature <= 0 means 1, as greedy decoding has no temperature to divide by); the fused
    function above, for a plain ``nn.Linear`` head. ``keep`` saves the (n, V) fp32 log-probs for the
    backward pass instead of rebuilding them there (one LM-head product fewer, n x V x 4 bytes
    held until the backward: the caller decides when that fits, ``trainer.KEEP_LOGITS_BYTES``)."""
    inv_t = 1.0 / temperature if temperature > 0 else 1.0
    dtype = None if compute_dtype in (None, torch.float32) else compute_dtype
    return _HeadLogprobs.apply(
        h, head.weight, head.bias, targets, inv_t, with_entropy, dtype, keep and torch.is_grad_enabled()
    )
