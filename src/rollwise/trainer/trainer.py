"""The trainer: turns a ``Batch`` into one optimizer step. It knows nothing of the algorithm:
advantages are in the batch, the objective is a function chosen by name.

Micro-batching is exact: each micro-batch's loss is already divided by the global count of
the optimizer step (``Batch.num_loss_tokens`` / ``num_sequences``), so gradients are summed,
never averaged, across micro-batches (docs/architecture.md §9).

Options the trainer serves (each computed here, its math living in ``objectives/``):

- **Proximal log-probs.** When ``options.needs_prox`` (a behaviour weight is on, always for
  ``decoupled_ppo``), each micro-batch gets ``prox_logprobs`` = the log-probs of the weights
  before this batch's first update, without gradient. With one update epoch (``train.epochs
  = 1``) the weights change only after every micro-batch's backward pass, so these are the
  detached log-probs of the very forward pass that computes the loss: exact, and no extra
  forward. With several epochs they are computed once up front by a no-grad pass and reused.
- **Update epochs** (``train.epochs``, PPO's ``ppo_epochs`` / TRL's ``num_iterations``): the
  batch is optimised that many times, one full-batch optimizer step per epoch (micro-batches
  accumulate within an epoch). The sampler's log-probs stay the ratio's denominator, so the
  clip acts from the second epoch on. Metrics are those of the last epoch.
  Otherwise ``prox_logprobs`` stays None, so the ratio of the other objectives keeps the
  sampler's log-probs (bypass mode) and enabling another option does not change the objective.
- **Reference model.** A frozen copy of the initial weights when the objective has
  ``kl_coef > 0`` (KL in the loss: ``ref_logprobs`` per micro-batch) or ``reference=True`` (KL in
  the reward: :meth:`policy_and_reference_logprobs`, called by ``rollwise.reward``).
- **ESS learning-rate scaling** (``train.ess_lr_scaling``, VCPO arXiv 2602.17616): the
  learning rate of this step is multiplied by ``objectives.ess.ess_lr_scale`` of the sequence
  log-weights ``sum_t m (log pi_prox - log mu)`` of every row of the step (the global batch), and
  restored right after ``optimizer.step()``. Logs ``train/ess_ratio`` and ``train/lr_scale``.
- **Packing** (``train.packing``, issue #42 item 4; ``pack_layout``): whether a micro-batch's
  rows share decoder rows, each sequence with its own position ids (default ``"auto"``: on CUDA;
  on CPU when it saves enough positions to pay for the packed-sequence mask). Loss and gradients are
  those of the padded rows (tests/unit/trainer/test_packing.py); ``"on"`` is refused for a model
  that cannot be packed (``packing_refusal``).
- **Per-row scores** (:meth:`Trainer.row_scores`, VCPO's OPOB: ``advantage.name = "opob"``): each row's
  sequence log-weight and score-gradient norm, one forward and backward per row, before the step.
- The entropy bonus is the objective option ``entropy_coef``; the trainer always passes the
  entropy tensor and logs ``train/entropy``.
- **Data parallel** (``data_parallel``, torchrun; ``rollwise.distributed.data_parallel``): each
  rank trains on its contiguous share of the batch's rows (still divided by the global counts),
  and before clipping the gradients are summed over the ranks, and the loss, metric sums,
  mismatch and ESS log-weights gathered, so every rank takes the one-process step.
- **FSDP2** (``train.fsdp``; ``shard``, ``rollwise.trainer.fsdp``): the trainer trains a sharded
  copy (AdamW over its shards; FSDP sums the gradients in each backward) and keeps the model it
  was given whole as ``full_model``, refreshed after every optimizer step: the sampler's module,
  and what the no-grad whole-batch passes read. Every rank runs the same number of passes.

Speed and memory (issue #13; ``token_logprobs``): log-probs, entropies, proximal and reference
log-probs exist only at completion positions (0 elsewhere, which no objective reads: they all
weight by ``loss_mask``); the micro-batch's rows are packed so the decoder computes no padding;
the LM head and log-softmax run only where a completion token is predicted, in chunks of
``LOGIT_CHUNK`` positions, through ``rollwise.trainer.head`` (gradient by formula; the logits are
kept for the backward when the micro-batch's fit in ``KEEP_LOGITS_BYTES``, rebuilt otherwise).
``compute_dtype`` (``model.compute_dtype``, ``rollwise.hardware.precision``) runs forward and backward under bf16
autocast while the weights, gradients and AdamW state stay fp32 (master weights). ``train.activation_checkpointing``
recomputes each decoder layer's activations in the backward pass (HF gradient checkpointing).
"""

from __future__ import annotations

import copy
import dataclasses
import math

import torch

from rollwise.hardware.device import CPU_KEEP_LOGITS_BYTES, available_bytes, check_activations, keep_logits_bytes
from rollwise.hardware.precision import autocast
from rollwise.objectives.ess import ess_lr_scale, ess_ratio
from rollwise.registry import UserError
from rollwise.trainer.head import fusable, head_logprobs, reference_head_logprobs
from rollwise.trainer.mismatch import MismatchMeter, StaleWeightsError
from rollwise.types import Batch

LOGIT_CHUNK = 512  # positions per LM-head + log-softmax chunk (49k vocab: ~100 MB of fp32 logits)
KEEP_LOGITS_BYTES = (
    CPU_KEEP_LOGITS_BYTES  # on CPU a micro-batch whose completion log-probs fit keeps them for the backward
)
# ``train.packing = "auto"`` on CPU packs only when the packed rows hold at most this share of the
# micro-batch's padded positions: position ids make the model build the packed-sequence mask, which
# cost ~14% of SmolLM2's decoder forward + backward against plain causal attention
# (benchmarks/train_profile.py, CPU), so saving less than that loses time; packing every micro-batch
# was no faster on CPU (benchmarks/results/train_packing_{default,smollm2}.json)
PACK_MAX_ROW_FRACTION = 0.85
# packed rows hold at least this many tokens (more when a sequence is longer): short rollouts (the
# embedded default's are 9-15 tokens) share one row instead of pairing within the longest's width,
# while attention, which the packed mask computes over each whole row (transformers' SDPA path),
# stays a small share of a token's FLOPs (SmolLM2: 4 x 256 x 576 against ~7M of linear layers)
PACK_ROW_TOKENS = 256
PACKING_MODES = ("auto", "on", "off")  # train.packing
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def completion_positions(batch: Batch) -> torch.Tensor:
    """(B, T) bool: the positions whose log-prob anyone reads, i.e. the completion tokens (loss
    tokens, and completion tokens outside the loss whose sampler log-prob is set: an APRIL masked
    prefix, an excluded row). Elsewhere ``token_logprobs`` returns 0, as it always did at position 0."""
    return (batch.loss_mask != 0) | (batch.old_logprobs != 0)


def _decoder_and_head(model):
    """(decoder, LM head) of a Hugging Face causal LM (peft-wrapped or not) whose logits are
    exactly ``head(decoder(...).last_hidden_state)``; None for anything else (the full path)."""
    get_dec, get_head = getattr(model, "get_decoder", None), getattr(model, "get_output_embeddings", None)
    config = getattr(model, "config", None)
    if get_dec is None or get_head is None or config is None:
        return None
    if logit_transform(config) is not None:
        return None
    try:
        dec, head = get_dec(), get_head()
    except (AttributeError, NotImplementedError):
        return None
    if dec is None or dec is model or head is None:
        return None
    return dec, head


def logit_transform(config) -> str | None:
    """The first ``_LOGIT_TRANSFORMS`` key that ``config`` (a model config, or ``config.json``'s
    dict) sets to something other than 1: such a model's logits are not its LM head's output, so
    it takes the full path (one forward, every position's logits), never the packed one."""
    get = config.get if isinstance(config, dict) else lambda k: getattr(config, k, None)
    return next((k for k in _LOGIT_TRANSFORMS if get(k) not in (None, 1, 1.0)), None)


def packing_refusal(model) -> str | None:
    """Why ``train.packing = "on"`` cannot apply to ``model``, or None: it must be a Hugging Face
    causal LM whose logits are ``head(decoder(...))`` (``_decoder_and_head``) and whose decoder
    takes ``position_ids``, from which transformers builds the packed-sequence mask."""
    import inspect

    parts = _decoder_and_head(model)
    if parts is None:
        key = logit_transform(getattr(model, "config", None) or {})
        why = f"its config sets {key}" if key else "it is not a Hugging Face causal LM with a decoder and an LM head"
        return f"{type(model).__name__}: {why}, so its logits come from one full forward that cannot be packed"
    try:
        takes = "position_ids" in inspect.signature(parts[0].forward).parameters
    except (TypeError, ValueError):
        takes = False
    if not takes:
        return f"{type(model).__name__}: its decoder ({type(parts[0]).__name__}) takes no position_ids"
    return None


def pack_layout(lengths: list[int], width: int, packing: str, device: torch.device) -> tuple[list[list[int]], int]:
    """``(layout, row width)``: which sequences (their ``lengths``, the longest ``width``) share each
    decoder row under ``train.packing``, and the rows' width. ``"off"``: one sequence per row of
    ``width``. ``"on"``: ``pack_rows`` into rows of ``max(width, PACK_ROW_TOKENS)`` tokens, trimmed
    to the fullest. ``"auto"``: packed on CUDA; elsewhere only when the packed rows hold at most
    ``PACK_MAX_ROW_FRACTION`` of the padded rows' positions, since there the packed-sequence mask
    costs more than the FLOPs it saves unless enough padding goes."""
    if packing not in PACKING_MODES:
        raise ValueError(f"train.packing = {packing!r}; valid: {', '.join(PACKING_MODES)}")
    alone = [[i] for i in range(len(lengths))], width
    if packing == "off":
        return alone
    layout = pack_rows(lengths, max(width, PACK_ROW_TOKENS))
    fill = max((sum(lengths[i] for i in members) for members in layout), default=width)
    if (
        packing == "auto"
        and device.type != "cuda"
        and len(layout) * fill > PACK_MAX_ROW_FRACTION * len(lengths) * width
    ):
        return alone
    return layout, fill


def pack_rows(lengths: list[int], width: int) -> list[list[int]]:
    """First-fit-decreasing packing of sequences (their ``lengths``) into rows of ``width``
    tokens; each row lists the sequences it holds, in placement order. Ties keep input order."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for r, room in enumerate(free):
            if lengths[i] <= room:
                rows[r].append(i)
                free[r] -= lengths[i]
                break
        else:
            rows.append([i])
            free.append(width - lengths[i])
    return rows


def token_logprobs(
    model,
    batch: Batch,
    temperature: float,
    with_entropy: bool = False,
    where: torch.Tensor | None = None,
    compute_dtype: torch.dtype | None = None,
    chunk: int = LOGIT_CHUNK,
    packing: str = "auto",
):
    """(B, T) log-probs of ``input_ids`` under ``model`` at the positions ``where`` (default
    ``completion_positions``; 0 elsewhere, and at position 0) and, with ``with_entropy``, the
    entropy of the distribution there.

    For a Hugging Face causal LM (issues #13 and #42, "no compute on padding"): the right-padded
    rows are packed first-fit into rows of at least ``PACK_ROW_TOKENS``, each sequence keeping its own
    position ids (the model's packed-sequence mask keeps them apart), as ``packing``
    (``train.packing``, ``pack_layout``) says; the decoder runs on the packed rows;
    only the hidden states that predict a ``where`` token reach the LM head and the log-softmax,
    ``chunk`` positions at a time (``rollwise.trainer.head.head_logprobs`` for a plain linear head,
    activation checkpointing otherwise); beyond ``device.keep_logits_bytes`` of fp32 log-probs (512 MiB
    on CPU, a quarter of the free memory on CUDA) they are
    rebuilt in the backward instead of kept, so peak memory stays bounded. Position ids (and so
    the model's packed-sequence mask) go to the decoder only when a row holds two sequences.
    Other models (test doubles) take the full path: one forward, every position's logits.
    ``compute_dtype`` runs the forward under autocast; logits are cast to fp32 before the
    log-softmax either way. An FSDP-sharded model (``rollwise.trainer.fsdp``) runs it inside a
    call of its root module, which gathers the root group's parameters.
    """
    from rollwise.trainer import fsdp

    if fsdp.is_sharded(model):
        return fsdp.call_as_root(
            model, _token_logprobs, model, batch, temperature, with_entropy, where, compute_dtype, chunk, packing
        )
    return _token_logprobs(model, batch, temperature, with_entropy, where, compute_dtype, chunk, packing)


def _token_logprobs(model, batch, temperature, with_entropy, where, compute_dtype, chunk, packing):
    ids, attn = batch.input_ids, batch.attention_mask.bool()
    where = (completion_positions(batch) if where is None else where.bool()) & attn
    where[:, 0] = False
    dev = ids.device
    parts = _decoder_and_head(model)
    if parts is None:
        with autocast(compute_dtype, dev):
            logits = model(input_ids=ids, attention_mask=attn.long()).logits[:, :-1]
        lp, ent = reference_head_logprobs(
            logits.reshape(-1, logits.shape[-1]), lambda x: x, ids[:, 1:].reshape(-1), temperature, with_entropy
        )
        keep = where[:, 1:].to(lp.dtype)
        lp = torch.nn.functional.pad(lp.view(ids.shape[0], -1) * keep, (1, 0))
        ent = torch.nn.functional.pad(ent.view(ids.shape[0], -1) * keep, (1, 0)) if with_entropy else None
        return lp, ent
    decoder, head = parts
    b, width = ids.shape
    lengths = attn.sum(1).tolist()
    layout, row_width = pack_layout(lengths, width, packing, dev)
    # position ids only where a row holds several sequences; a lone sequence in a row needs none
    # (its padding tail comes after it, unseen by it)
    shared = any(len(members) > 1 for members in layout)
    packed = torch.zeros((len(layout), row_width), dtype=ids.dtype, device=dev)
    ppos = torch.zeros((len(layout), row_width), dtype=torch.long, device=dev)
    row_of, off_of = [0] * b, [0] * b
    for r, members in enumerate(layout):
        off = 0
        for i in members:
            n = lengths[i]
            packed[r, off : off + n] = ids[i, :n]
            ppos[r, off : off + n] = torch.arange(n, device=dev)
            row_of[i], off_of[i] = r, off
            off += n
        if off < row_width:  # the row's free tail is a block of its own (a fresh position 0..)
            ppos[r, off:] = torch.arange(row_width - off, device=dev)
    with autocast(compute_dtype, dev):
        hidden = decoder(input_ids=packed, position_ids=ppos if shared else None, use_cache=False).last_hidden_state
    tb, tt = where.nonzero(as_tuple=True)
    src_r = torch.tensor(row_of, device=dev)[tb]
    src_c = torch.tensor(off_of, device=dev)[tb] + tt - 1  # the hidden state that predicts (tb, tt)
    h, targets = hidden[src_r, src_c], ids[tb, tt]
    lps, ents = [], []
    fused = fusable(head)
    keep = fused and len(targets) * head.out_features * 4 <= keep_logits_bytes(dev)
    for lo in range(0, len(targets), chunk):
        args = (h[lo : lo + chunk], head, targets[lo : lo + chunk], temperature, with_entropy)
        if fused:  # rollwise.trainer.head: gradient by formula, logits kept or rebuilt for the backward
            lp_c, ent_c = head_logprobs(*args, compute_dtype=compute_dtype, keep=keep)
        else:
            with autocast(compute_dtype, dev):
                if torch.is_grad_enabled():
                    lp_c, ent_c = torch.utils.checkpoint.checkpoint(reference_head_logprobs, *args, use_reentrant=False)
                else:
                    lp_c, ent_c = reference_head_logprobs(*args)
        lps.append(lp_c)
        ents.append(ent_c)
    lp_flat = torch.cat(lps) if lps else h.new_zeros(0, dtype=torch.float32)
    lp = torch.zeros((b, width), dtype=torch.float32, device=dev).index_put((tb, tt), lp_flat)
    if not with_entropy:
        return lp, None
    ent_flat = torch.cat(ents) if ents else lp_flat
    return lp, torch.zeros((b, width), dtype=torch.float32, device=dev).index_put((tb, tt), ent_flat)


@dataclasses.dataclass
class Accumulated:
    """What an optimizer step sums over its micro-batches besides the gradients."""

    loss: float = 0.0
    sums: dict = dataclasses.field(default_factory=dict)  # objective metric sums
    log_w: list = dataclasses.field(default_factory=list)  # per-row sequence log-weights (ESS scaling)
    has_tokens: list = dataclasses.field(default_factory=list)
    gap: MismatchMeter = dataclasses.field(default_factory=MismatchMeter)  # sampler vs trainer log-probs


class Trainer:
    def __init__(
        self,
        model,
        objective,
        options,
        train_cfg,
        temperature: float,
        reference: bool = False,
        compute_dtype: torch.dtype | None = None,
        data_parallel=None,
    ):
        self.model = model
        self.dp = data_parallel  # rollwise.distributed.data_parallel.DataParallel, or None (one process)
        self.compute_dtype = compute_dtype  # autocast dtype of forward and backward; weights stay as they are
        self.checkpointing = bool(getattr(train_cfg, "activation_checkpointing", False))
        if self.checkpointing:
            if not hasattr(model, "gradient_checkpointing_enable"):
                raise ValueError(
                    "train.activation_checkpointing needs a Hugging Face model (gradient_checkpointing_enable)"
                )
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.objective, self.options = objective, options
        self.cfg = train_cfg
        self.packing = getattr(train_cfg, "packing", "auto")  # train.packing (pack_layout)
        if self.packing == "on":  # before any pass; config.load_config refused what config.json shows
            why = packing_refusal(model)
            if why is not None:
                raise UserError(f"train.packing = 'on' cannot apply to this model ({why}); set it to 'auto' or 'off'")
        self.temperature = temperature
        self.needs_prox = bool(getattr(options, "needs_prox", False))
        self.kl_in_loss = bool(getattr(options, "kl_coef", 0.0))
        self._host_available = False  # MemAvailable at the first training pass (device.check_activations)
        self.full_model = None  # FSDP (``shard``): the whole model the sampler and the scoring passes read
        self.optimizer, self.scheduler = self._optimizer(model)
        self.gap_guard = None  # mismatch.GapGuard, set by the session when the sampler is a separate engine
        self.ref_model = None
        if self.kl_in_loss or reference:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)

    def _optimizer(self, model):
        """AdamW over ``model``'s trainable parameters and its linear warm-up schedule."""
        c = self.cfg
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=c.lr, betas=tuple(c.betas), weight_decay=c.weight_decay)
        warm = max(1, c.warmup_steps)
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warm))

    @property
    def fsdp(self) -> bool:
        """Whether the trained model is sharded (``shard``)."""
        return self.full_model is not None

    @property
    def scoring_model(self):
        """The model no-grad passes over whole batches read: the whole copy under FSDP (the same
        weights, no collectives), else the trained model."""
        return self.full_model if self.fsdp else self.model

    def shard(self) -> None:
        """FSDP2 (``train.fsdp``; ``rollwise.trainer.fsdp``): train a sharded copy of the model
        with AdamW over its shards, and keep ``self.model`` whole as ``full_model`` (refreshed after
        every optimizer step). The optimizer and scheduler state (a resumed run's) carries over.
        Every data-parallel rank calls it, with the same weights (after ``DataParallel.lead``)."""
        from rollwise.trainer import fsdp

        if self.fsdp:
            return
        state = self.state_dict()  # a plain AdamW: full tensors
        device = next(self.model.parameters()).device
        self.full_model, self.model = self.model, fsdp.shard(self.model, device)
        self.optimizer, self.scheduler = self._optimizer(self.model)
        self.load_state_dict(state)

    def micro_batches(self, batch: Batch, shard: bool = False, on_device: bool = True):
        """Yield ``(rows, micro_batch)``: the slice of ``batch`` and its rows trimmed to their
        longest sequence, on the model's device (``on_device``; else where ``batch`` is), global
        counts kept (``Batch.rows``). With ``shard`` and data parallel, only this rank's rows
        (``DataParallel.shard``)."""
        device = next(self.scoring_model.parameters()).device if on_device else batch.input_ids.device
        here = self.dp.shard(batch.size) if shard and self.dp is not None else range(batch.size)
        for start in range(here.start, here.stop, self.cfg.micro_batch):
            rows = slice(start, min(start + self.cfg.micro_batch, here.stop))
            yield rows, batch.rows(rows).to(device)

    def _logprobs(self, model, mb: Batch, with_entropy: bool = False):
        """``token_logprobs`` at the completion positions under this trainer's temperature and dtype."""
        return token_logprobs(
            model,
            mb,
            self.temperature,
            with_entropy=with_entropy,
            compute_dtype=self.compute_dtype,
            packing=self.packing,
        )

    @torch.no_grad()
    def _with_reference(self, mb: Batch) -> Batch:
        if not self.kl_in_loss:
            return mb
        return dataclasses.replace(mb, ref_logprobs=self._logprobs(self.ref_model, mb)[0])

    @torch.no_grad()
    def policy_logprobs(self, batch: Batch, model=None) -> torch.Tensor:
        """(B, T) log-probs of ``batch.input_ids`` under ``model`` (default: the current weights)
        at the completion positions, without gradient, micro-batched, zero-padded back to the
        batch's width (the KL reference; SAPO's received rollouts, rollwise.replay.sapo)."""
        return self._whole_batch(batch, self.scoring_model if model is None else model, entropy=False)

    @torch.no_grad()
    def _whole_batch(self, batch: Batch, model, entropy: bool) -> torch.Tensor:
        """``_logprobs`` of every micro-batch of ``batch`` (its entropies with ``entropy``), without
        gradient, zero-padded back to the batch's width."""
        out = torch.zeros_like(batch.old_logprobs)
        for rows, mb in self.micro_batches(batch):
            out[rows, : mb.input_ids.shape[1]] = self._logprobs(model, mb, with_entropy=entropy)[int(entropy)].to(
                out.device
            )
        return out

    def policy_and_reference_logprobs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) log-probs of ``batch.input_ids`` under the current weights and under the frozen
        reference (``policy_logprobs`` of each)."""
        if self.ref_model is None:
            raise ValueError("no reference model: construct the Trainer with reference=True (reward.kl.coef > 0)")
        return self.policy_logprobs(batch), self.policy_logprobs(batch, self.ref_model)

    @torch.no_grad()
    def token_entropy(self, batch: Batch) -> torch.Tensor:
        """(B, T) entropy of the current policy at each position (as ``token_logprobs``), without
        gradient, micro-batched, zero-padded back to the batch's width (D3S token scores)."""
        return self._whole_batch(batch, self.scoring_model, entropy=True)

    def row_scores(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(B,) sequence log-weights ``sum_t m (log pi - log mu)`` and (B,) norms of each row's score
        gradient ``|| grad_theta (sum_t m log pi(y_t) / sum_t m) ||`` over the trainable parameters,
        at the current weights (VCPO's OPOB, ``objectives/ess.py``): one forward and backward per
        row, through ``torch.autograd.grad`` (the parameters' ``.grad`` is left untouched). Rows
        without loss tokens get 0 and 0."""
        model = self.scoring_model
        params = [p for p in model.parameters() if p.requires_grad]
        device = next(model.parameters()).device
        log_w, norms = torch.zeros(batch.size), torch.zeros(batch.size)
        for i in range(batch.size):
            mb = batch.rows(slice(i, i + 1)).to(device)
            m = mb.loss_mask
            if m.sum() == 0:
                continue
            lp = self._logprobs(model, mb)[0]
            log_w[i] = float(((lp.detach() - mb.old_logprobs) * m).sum())
            score = (lp * m).sum() / m.sum()
            grads = torch.autograd.grad(score, params, allow_unused=True)
            norms[i] = float(torch.sqrt(sum((g.detach().double() ** 2).sum() for g in grads if g is not None)))
        return log_w, norms

    def _ess_scale(self, log_w: list[torch.Tensor], has_tokens: list[torch.Tensor]) -> tuple[float, float]:
        """(rho, lr scale) of the step from per-row sequence log-weights, gathered over micro-batches."""
        opts = self.cfg.ess_lr_scaling
        lw = torch.cat(log_w)[:, None]
        mask = torch.cat(has_tokens).to(lw.dtype)[:, None]
        return ess_ratio(lw, mask), ess_lr_scale(lw, mask, opts.rule, opts.base_ess_ratio)

    def optimize(self, batch: Batch) -> dict[str, float]:
        """``train.epochs`` optimizer steps over ``batch`` (one per epoch); returns the last
        epoch's ``train/*`` metrics."""
        if batch.num_loss_tokens == 0:
            return {"train/loss": 0.0, "train/skipped": 1.0}
        epochs = getattr(self.cfg, "epochs", 1)
        prox = self._prox_up_front(batch) if epochs > 1 and self.needs_prox else None
        for _ in range(epochs):
            metrics = self._epoch(batch, prox)
        return metrics

    @torch.no_grad()
    def _prox_up_front(self, batch: Batch) -> list[torch.Tensor]:
        """Log-probs of the pre-update weights per micro-batch (several update epochs), in train
        mode like the one-epoch path, whose prox is the loss forward's own."""
        model = self.scoring_model  # under FSDP the whole copy: row shards differ in micro-batches
        was_training = model.training
        model.train()
        try:
            return [self._logprobs(model, mb)[0] for _, mb in self.micro_batches(batch, shard=True)]
        finally:
            model.train(was_training)

    def _epoch(self, batch: Batch, prox_up_front: list[torch.Tensor] | None) -> dict[str, float]:
        """One optimizer step over every micro-batch of ``batch``."""
        return self.step(batch, self.accumulate(batch, prox_up_front))

    def accumulate(
        self, batch: Batch, prox_up_front: list[torch.Tensor] | None = None, acc: Accumulated | None = None
    ) -> Accumulated:
        """Forward and backward of every micro-batch of ``batch``: gradients are added to the
        parameters' ``.grad`` and the step's sums to ``acc`` (a new one when None). Periodic
        asynchrony calls it once per arriving group (rollwise.trainer.streaming)."""
        self.model.train()
        acc = acc if acc is not None else Accumulated()
        ess_on = bool(getattr(self.cfg, "ess_lr_scaling", None) and self.cfg.ess_lr_scaling.enabled)
        # the checks that may fail on one rank, before any pass; FSDP: the passes the other ranks run beyond this
        # rank's (each pass is a collective)
        if self.dp is None:
            self._preflight(batch)
            padding = 0
        else:
            counts = self.dp.agree(lambda: self._preflight(batch))
            padding = max(counts) - counts[self.dp.rank] if self.fsdp else 0
        for i, (_, mb) in enumerate(self.micro_batches(batch, shard=True)):
            if mb.loss_mask.sum() == 0:
                continue
            self._pass(mb, i, prox_up_front, acc, ess_on)
        if padding:
            self._pad_passes(batch, padding)
        return acc

    def _pass(self, mb: Batch, i: int, prox_up_front, acc: Accumulated, ess_on: bool) -> None:
        """Forward and backward of micro-batch ``mb`` (the ``i``-th of this rank's), its sums into ``acc``."""
        mb = self._with_reference(mb)
        new_lp, ent = self._logprobs(self.model, mb, with_entropy=True)
        # pre-update policy: this forward before the first update (module docstring)
        prox = new_lp.detach() if prox_up_front is None else prox_up_front[i]
        acc.gap.add(prox, mb.old_logprobs, mb.loss_mask)
        if self.needs_prox:
            mb = dataclasses.replace(mb, prox_logprobs=prox)
        if ess_on:
            m = mb.loss_mask
            acc.log_w.append(torch.where(m != 0, (prox - mb.old_logprobs) * m, torch.zeros_like(prox)).sum(dim=1))
            acc.has_tokens.append(m.sum(dim=1) > 0)
        out = self.objective(mb, new_lp, self.options, entropy=ent)
        out.loss.backward()
        acc.loss += float(out.loss.detach())
        for k, v in out.metrics.items():
            acc.sums[k] = acc.sums.get(k, 0.0) + float(v)
        if "entropy_sum" not in out.metrics:  # objectives built on common.finish report it already
            acc.sums["entropy_sum"] = acc.sums.get("entropy_sum", 0.0) + float((ent.detach() * mb.loss_mask).sum())

    def _preflight(self, batch: Batch) -> int:
        """Check every micro-batch of this rank that has loss tokens before the first pass (the
        token ids against the model's embedding, ``_check_memory``); returns how many there are.
        Under data parallel every rank's result meets in ``DataParallel.agree``, so a failure on
        one rank stops all of them with its message instead of leaving them in a collective."""
        vocab = self._vocab_size()
        passes = 0
        for rows, mb in self.micro_batches(batch, shard=True, on_device=False):
            if mb.loss_mask.sum() == 0:
                continue
            ids = mb.input_ids[mb.attention_mask.bool()]
            if vocab is not None and ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < vocab):
                bad = int(ids.max()) if int(ids.max()) >= vocab else int(ids.min())
                raise ValueError(
                    f"batch rows {rows.start}-{rows.stop - 1} hold token id {bad}, outside the model's {vocab}-token "
                    "embedding (the tokenizer and the model disagree)"
                )
            self._check_memory(mb)
            passes += 1
        return passes

    def _vocab_size(self) -> int | None:
        """Rows of the model's input embedding (None where the model does not say)."""
        get = getattr(self.scoring_model, "get_input_embeddings", None)
        try:
            emb = get() if callable(get) else None
        except (AttributeError, NotImplementedError):
            emb = None
        n = getattr(emb, "num_embeddings", None)
        return n if isinstance(n, int) else None

    def _check_memory(self, mb: Batch) -> None:
        """``device.check_activations`` of a training pass, against the memory available at the first."""
        if self._host_available is False:
            self._host_available = available_bytes()
        param = next(self.model.parameters())
        elem = torch.finfo(self.compute_dtype or param.dtype).bits // 8
        check_activations(self.model, param.device, *mb.input_ids.shape, elem, self.checkpointing, self._host_available)

    def _pad_passes(self, batch: Batch, n: int) -> None:
        """FSDP: ``n`` zero-weight forward/backward passes, so this rank runs as many as the rank
        with the most (each pass is a collective). A pass reads one row with loss tokens, so it
        reaches every parameter a real pass reaches; its gradient is exactly zero."""
        row = int((batch.loss_mask != 0).any(dim=1).nonzero()[0])
        mb = batch.rows(slice(row, row + 1)).to(next(self.scoring_model.parameters()).device)
        for _ in range(n):
            (self._logprobs(self.model, mb)[0].sum() * 0.0).backward()

    def step(self, batch: Batch, acc: Accumulated, grad_scale: float = 1.0) -> dict[str, float]:
        """Clip and take the optimizer step on the accumulated gradients (first multiplied by
        ``grad_scale``, as is the reported loss); returns the step's ``train/*`` metrics."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.dp is not None:  # data parallel: the step's gradient is the sum over every rank's rows
            if not self.fsdp:  # FSDP summed them in each backward (reduce-scatter)
                self.dp.all_reduce_grads(params)
            acc.loss, acc.sums, acc.gap, acc.log_w, acc.has_tokens = self.dp.combine(
                acc.loss, acc.sums, acc.gap, acc.log_w, acc.has_tokens
            )
        if (
            self.gap_guard is not None
        ):  # stale weights in a separate sampler: stop before the update (mismatch.GapGuard)
            stop = self.gap_guard.check(acc.gap.metrics().get("mismatch/abs_mean", 0.0))
            if stop is not None:
                self.optimizer.zero_grad(set_to_none=True)
                raise StaleWeightsError(stop)
        if grad_scale != 1.0:
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(grad_scale)
        clip = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
        grad_norm = float(
            grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        )  # FSDP: a DTensor
        extra = {}
        scale = 1.0
        if acc.log_w:
            rho, scale = self._ess_scale(acc.log_w, acc.has_tokens)
            extra = {"train/ess_ratio": rho, "train/lr_scale": scale}
        base_lrs = [g["lr"] for g in self.optimizer.param_groups]
        for g, lr in zip(self.optimizer.param_groups, base_lrs):
            g["lr"] = lr * scale
        self.optimizer.step()
        for g, lr in zip(self.optimizer.param_groups, base_lrs):  # the scale holds for this step only
            g["lr"] = lr
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.fsdp:  # the sampler's whole copy takes the new weights
            from rollwise.trainer.fsdp import copy_full

            copy_full(self.model, self.full_model)
        metrics = {
            "train/loss": acc.loss * grad_scale,
            "train/grad_norm": grad_norm,
            "train/lr": self.scheduler.get_last_lr()[0],
            **extra,
            **acc.gap.metrics(),
        }
        for k, v in acc.sums.items():
            if k.endswith("_sum"):  # objectives report sums over loss tokens
                metrics["train/" + k.removesuffix("_sum")] = v / batch.num_loss_tokens
        return metrics

    def state_dict(self) -> dict:
        """Optimizer and scheduler state; under FSDP the moments gathered to full tensors (the format
        of one process; a collective: every rank calls it)."""
        opt = self.optimizer.state_dict()
        if self.fsdp:
            from rollwise.trainer.fsdp import full_optimizer_state

            opt = full_optimizer_state(opt)
        return {"optimizer": opt, "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, s: dict) -> None:
        opt = s["optimizer"]
        if self.fsdp:  # full tensors (state_dict's format): this rank's shard of each
            from rollwise.trainer.fsdp import shard_optimizer_state

            opt = shard_optimizer_state(opt, [p for g in self.optimizer.param_groups for p in g["params"]])
        self.optimizer.load_state_dict(opt)
        self.scheduler.load_state_dict(s["scheduler"])
