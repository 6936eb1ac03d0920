"""FSDP2 training (``train.fsdp = true``): the data-parallel path (``rollwise.distributed.data_parallel``)
with the training state sharded across the ranks by ``torch.distributed.fsdp.fully_shard``, for
models whose weights, gradients and AdamW moments do not fit one device together.

What changes against plain data parallel (the loop, the generation shares, the row shards and the
global loss normaliser stay as they are):

- **Two copies of the policy per rank.** The model the run builds stays whole on every rank: it is
  the ``hf`` sampler's model (generation), the module ``final/`` and the checkpoints are written
  from, and the one no-grad scoring passes read (``Trainer.policy_logprobs``, entropies, proximal
  log-probs up front). The trainer takes a deep copy of it after rank 0's weights are broadcast
  (``DataParallel.lead``) and shards that (:func:`shard`): one FSDP group per decoder layer and the
  rest (embeddings, final norm, LM head) in the root group, on a 1-D mesh of every rank. AdamW is
  built over the sharded parameters (DTensors), so each rank keeps 1/W of the trained weights,
  their gradients and both fp32 moments. After every optimizer step the whole copy is refreshed
  from the shards (:func:`copy_full`, an all-gather per parameter), so ranks decode independently:
  the ``hf`` sampler cannot decode on a sharded model, because FSDP's per-layer all-gathers would
  need every rank to run the same number of forwards, and ranks decode different lengths. This is
  what verl's colocated engines do too: generation needs one full copy per rank, training state is
  what is sharded. Setting up holds a second full copy for a moment (the copy before it is sharded).
- **Gradients.** FSDP reduce-scatters each micro-batch's gradient in its backward pass. The loss is
  already divided by the step's *global* loss-token count, so the step's gradient is the SUM over
  the ranks; FSDP's default mean is turned off (``set_gradient_divide_factor(1.0)``, and sum-only
  collectives, as gloo has no pre-multiplied sum), and ``DataParallel.all_reduce_grads`` does not
  run. Clipping reads the DTensor gradients' global norm (``clip_grad_norm_`` handles DTensors).
- **Equal passes.** Every forward/backward through the sharded model is a collective, so every rank
  must run as many as the others. A rank whose row shard has fewer micro-batches with loss tokens
  runs zero-weight passes (loss ``0 * sum(log-probs)`` of one row that has loss tokens, so the pass
  reaches the parameters a real one reaches) until the counts match
  (``Trainer._pad_passes``). Whole-batch passes through the trainer's model (GDRO's per-response
  losses) run on every rank with the same batch, so they match already. The trainer reads the
  decoder and the LM head's weight directly, so its passes run inside a call of the root module
  (:func:`call_as_root`), whose hooks gather the root group's parameters and reduce-scatter
  their gradients.
- **Reference model.** Kept whole on every rank (``Trainer.ref_model``, frozen): it is weights only
  (no gradient, no moments: at most a quarter of the sharded state's unsharded size), its forwards
  stay local (row shards of different sizes need no padding passes), and checkpoints save it as
  before. Sharding it is a follow-up for models whose frozen copy alone does not fit.
- **Checkpoints.** Rank 0 writes the format of a one-process run: the whole model (the generation
  copy, refreshed after the step) and the optimizer state with every moment gathered to a full
  tensor (:func:`full_optimizer_state`, a collective: every rank takes part in ``Run.checkpoint``).
  A resumed run loads it into the whole model and a plain AdamW first (as always), and the trainer
  shards both (:func:`shard_optimizer_state`: each rank takes its own rows of every moment, no
  communication). ``final/`` is exported as usual.

Memory per rank (``trainer.device.training_memory`` with ``shards = W``): weights, gradients and
fp32 AdamW moments divided by W, plus the whole generation copy, plus the whole reference copy when
there is one, plus activations.

Refused (``rollwise.compat.check_fsdp``, naming the key): ``train.fsdp`` without torchrun data
parallel (WORLD_SIZE > 1), and with ``model.lora`` (its trained state is the adapters, well under
1% of the weights). vLLM, Ray workers and asynchrony are refused by data parallel already.
"""

from __future__ import annotations

import copy

import torch


def decoder_layers(model) -> list[torch.nn.Module]:
    """The decoder layers of a Hugging Face causal LM (``get_decoder().layers``), else []."""
    get = getattr(model, "get_decoder", None)
    try:
        dec = get() if callable(get) else None
    except (AttributeError, NotImplementedError):
        dec = None
    layers = getattr(dec, "layers", None)
    return list(layers) if isinstance(layers, torch.nn.ModuleList) else []


def shard(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A deep copy of ``model`` (identical on every rank) sharded with FSDP2 over every rank of the
    default process group: one group per decoder layer, the root holding the rest; gradients
    summed, not averaged (module docstring)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    sharded = copy.deepcopy(model)
    for layer in decoder_layers(sharded):
        fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh, reshard_after_forward=True)  # no-grad passes leave no whole copy behind
    for m in sharded.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)  # the SUM over ranks (the loss has the global normaliser)
            m.set_force_sum_reduction_for_comms(True)  # a plain sum: gloo has no PREMUL_SUM
    return sharded


def is_sharded(model) -> bool:
    """Whether ``model`` is an FSDP2 module (:func:`shard`)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def call_as_root(model, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` run as the forward of the FSDP root ``model``. The trainer calls the
    decoder and the LM head's weight directly (``trainer.token_logprobs``), not the root's forward,
    whose hooks gather the root group's parameters (embeddings, final norm, LM head) and, in the
    backward, reduce-scatter their gradients; running ``fn`` inside a call of the root fires them."""
    model.forward = lambda: fn(*args, **kwargs)  # an instance attribute, removed again below
    try:
        return model()
    finally:
        del model.forward


def local_numel(params) -> int:
    """Elements this rank holds of ``params`` (a DTensor's local shard, a tensor's whole)."""
    from torch.distributed.tensor import DTensor

    return sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params)


@torch.no_grad()
def copy_full(sharded: torch.nn.Module, full: torch.nn.Module) -> None:
    """Copy the trained parameters of ``sharded`` into the whole model ``full`` (the same names):
    an all-gather per parameter, so every rank calls it, in the same order."""
    whole = dict(full.named_parameters())
    for name, p in sharded.named_parameters():
        if p.requires_grad:
            whole[name].copy_(p.full_tensor())


def full_optimizer_state(state: dict) -> dict:
    """``optimizer.state_dict()`` of an optimizer over DTensors with every DTensor gathered to a
    full tensor: the format of an optimizer over the whole model. A collective (every rank calls
    it, with the same state layout)."""
    from torch.distributed.tensor import DTensor

    return {
        "state": {
            i: {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in s.items()}
            for i, s in state["state"].items()
        },
        "param_groups": state["param_groups"],
    }


def shard_optimizer_state(state: dict, params: list) -> dict:
    """``state`` (an optimizer state dict with full tensors, parameter indices into ``params``)
    with every per-parameter tensor of the parameter's full shape replaced by this rank's shard,
    placed like the parameter (no communication: every rank holds the same full tensors)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    out = {}
    for i, s in state["state"].items():
        p = params[i]
        out[i] = {
            k: distribute_tensor(v.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
            if isinstance(p, DTensor) and torch.is_tensor(v) and not isinstance(v, DTensor) and v.shape == p.shape
            else v
            for k, v in s.items()
        }
    return {"state": out, "param_groups": state["param_groups"]}
