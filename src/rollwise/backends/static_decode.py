"""The static decode path of the hf sampler (issue #42 items 2-3; ``model.sampler = "static"``).

The eager path (``HFBackend._generate_chunk``) grows a ``DynamicCache`` by concatenation, reads
"done" on the host after every token and, with a left-padded batch, lets transformers' SDPA
repeat each K/V head for its query heads (native grouped-query attention is used only without a
mask). This path keeps what it returns (the same tokens for the same uniforms, their log-probs
under the sampled distribution, entropies, the decode hook, APRIL's stop) and changes how it gets
there, after gpt-fast and nano-vllm (static KV cache, one CUDA graph per batch size, a batch padded
to the next captured size, static input buffers):

- **A preallocated KV cache** (transformers' ``StaticCache``: library first; it writes each step
  in place at its own device-side position counter, so nothing is concatenated and a CUDA graph
  can replay the write). One cache per batch *bucket*: on CUDA the next captured size
  (``BUCKETS``), the padding rows being finished from the start; on a CPU the exact row count.
- **Its own module and weights** (``rollwise.backends.generation_copy``): the decode runs on a
  generation copy of the policy whose linears hold the compute dtype's weights (bf16 under bf16
  autocast: no per-step weight casts), LoRA merged, refreshed in place before a chunk when the
  master changed (one copy after each optimizer step; a CUDA graph's pointers stay valid), while
  the trainer keeps its fp32 master. The copy's config names ``grouped_attention`` once, so the
  trainer's module is never switched (a generator thread under ``train.async`` decodes beside the
  trainer's forwards). The copy is built at the first static decode, so an eager sampler, or a
  backend whose generator decodes (``train.async``: the shallow copy ``HFBackend.__copy__`` makes),
  holds none.
- **Grouped-query attention without repeating K/V** (``grouped_attention``, registered with
  transformers' ``AttentionInterface`` and named by the generation copy's config): the
  query heads that share a K/V head are folded into the query-length axis, (B, H, Q, D) ->
  (B, KVH, G*Q, D), so one plain SDPA call reads each K/V head once, with a padding mask, on
  every kernel (SDPA's own ``enable_gqa`` falls back to the math kernel under a mask on CUDA,
  which repeats K/V internally).
- **The prompt prefilled once per group**: identical prompts (a group's rollouts) are detected by
  their token ids, prefilled once, and their cache rows copied to each row of the group.
- **Sampling in fp32 on the device**: the eager path's inverse CDF (``sampling.sample_rows``) with
  a float32 cumulative sum; row i's t-th token still reads ``u[i, t]`` (the uniforms are drawn
  from the same generator, in the same order, as the eager path draws them), so both paths give
  the same tokens up to float rounding at an interval's edge.
- **"Done" read every ``read_every`` steps** (default ``READ_EVERY`` = 8), not every token: rows
  finish on the device (their further tokens are neither written nor counted), and every k steps
  the host reads the flags once: the chunk ends when all rows are done, APRIL's
  ``stop_when`` is asked, ``on_tokens`` is told the tokens since the last read, and finished rows
  leave the batch (their cache rows are copied into the next smaller bucket). So APRIL's stop acts
  at most k - 1 steps after the eager path would, and a finished row costs up to k - 1 idle
  steps. A decode hook (ARRoL's pruning) is still called before exactly the steps it asks for
  (``hook.wants(t)``): such a step runs outside the CUDA graph (its hidden states go to the host);
  the rows it cuts take no further token.
- **On CUDA, one CUDA graph per bucket** (``torch.cuda.CUDAGraph``): the decode step (forward,
  sampling, bookkeeping) is captured once with static input buffers and replayed; on a CPU the
  same step runs without a graph, and its attention reads only the cache positions written so far.

Prefill runs without a graph (its shape changes with the prompt width).
"""

from __future__ import annotations

import dataclasses

import torch

from rollwise.backends.generation_copy import HALF, GenerationCopy
from rollwise.backends.sampling import completions, entropy, sample_rows, sampling_logprobs
from rollwise.types import Completion, Sampling

ATTENTION = "rollwise_grouped_sdpa"  # the name grouped_attention is registered under
READ_EVERY = 8  # decode steps between two host reads of the rows' "done" flags (module docstring)
BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)  # captured batch sizes (CUDA)
LENGTH_STEP = 64  # on CUDA, cache length and step budget round up to this (fewer shapes to capture)
KEEP_LENGTHS = 2  # cache lengths whose slots are kept between calls (prompt widths vary a little per step)


def grouped_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """SDPA over a static cache without repeating K/V (module docstring): query (B, H, Q, D), key and
    value (B, KVH, L, D) with H = G * KVH and head h reading K/V head h // G (transformers'
    ``repeat_kv`` order), ``attention_mask`` (B, 1, Q, N) bool, True = attend. Only the first N
    cache positions are read (a CPU step passes the positions written so far; a CUDA graph the
    whole cache). Returns ((B, Q, H, D), None) as transformers' attention functions do."""
    b, h, q, d = query.shape
    n = attention_mask.shape[-1]
    key, value = key[:, :, :n], value[:, :, :n]
    kvh = key.shape[1]
    g = h // kvh
    folded = query.reshape(b, kvh, g * q, d)
    mask = attention_mask
    if g > 1 and q > 1:  # rows (j, i) of the folded query read the mask row of position i
        mask = mask[:, :, None].expand(b, 1, g, q, n).reshape(b, 1, g * q, n)
    out = torch.nn.functional.scaled_dot_product_attention(folded, key, value, attn_mask=mask, scale=scaling)
    return out.view(b, h, q, d).transpose(1, 2), None


def register_attention() -> None:
    """Make ``grouped_attention`` known to transformers (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, grouped_attention)


def supports(model) -> str | None:
    """Why ``model`` cannot take the static path, or None if it can: its attention must dispatch
    through transformers' ``AttentionInterface`` (``_supports_attention_backend``) and every layer
    of its ``StaticCache`` must be a plain full-length ``StaticLayer`` (a sliding-window or
    recurrent layer keeps other positions than the mask this path builds)."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(base, "_supports_attention_backend", False):
        return f"{type(base).__name__} does not dispatch its attention through transformers' AttentionInterface"
    try:
        layers = StaticCache(config=base.config, max_cache_len=1).layers
    except Exception as e:  # noqa: BLE001 - any failure to build the cache is a reason not to use it
        return f"no StaticCache for {type(base).__name__}: {e}"
    odd = sorted({type(layer).__name__ for layer in layers if type(layer) is not StaticLayer})
    return f"{type(base).__name__}'s cache has {', '.join(odd)} layers" if odd else None


def bucket(n: int, graphs: bool, cap: int) -> int:
    """Rows of the decode batch for ``n`` live rows: on CUDA the next captured size (at most
    ``cap``, the backend's ``max_batch``, itself always a size), on a CPU ``n`` itself."""
    if not graphs:
        return n
    return min([s for s in BUCKETS if s >= n and s < cap] + [cap])


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def prefill_mask(valid: torch.Tensor) -> torch.Tensor:
    """(U, 1, W, W) bool attention mask of a left-padded prefill: causal, padding keys masked; a
    padding position attends to itself only, so that no row is fully masked (whose SDPA output,
    NaN, would reach the cache)."""
    w = valid.shape[1]
    causal = torch.ones((w, w), dtype=torch.bool, device=valid.device).tril()
    eye = torch.eye(w, dtype=torch.bool, device=valid.device)
    return (causal & valid[:, None, None, :]) | eye


def static_cache(config, length: int, rows: int, spec: tuple):
    """transformers' ``StaticCache`` of ``rows`` x ``length`` positions, allocated now in ``spec``'s
    (K/V heads, head size, dtype, device), whose layers cast what they store to that dtype."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    class CastingLayer(StaticLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            return super().update(key_states.to(self.keys.dtype), value_states.to(self.values.dtype), *args, **kwargs)

    heads, head_dim, dtype, device = spec
    cache = StaticCache(config=config, max_cache_len=length)
    cache.layers = [CastingLayer(max_cache_len=length) for _ in cache.layers]  # all plain StaticLayers (supports)
    cache.early_initialization(batch_size=rows, num_heads=heads, head_dim=head_dim, dtype=dtype, device=device)
    return cache


@dataclasses.dataclass
class _Slot:
    """The static state of one decode batch of ``rows`` rows (one bucket): its KV cache and every
    buffer the decode step reads or writes, so that a CUDA graph can replay the step."""

    rows: int
    length: int  # cache positions
    budget: int  # steps the output buffers hold
    cache: object  # transformers StaticCache
    tok: torch.Tensor  # (R, 1) the token fed next
    pos: torch.Tensor  # (R, 1) its position id
    valid: torch.Tensor  # (R, L) bool: cache positions a row attends to
    done: torch.Tensor  # (R,) bool
    n_new: torch.Tensor  # (R,) tokens generated
    lim: torch.Tensor  # (R,) token budgets
    u: torch.Tensor  # (R, S) float32 uniforms
    tidx: torch.Tensor  # (1,) the step being sampled
    ids: torch.Tensor  # (R, S)
    lp: torch.Tensor  # (R, S)
    ent: torch.Tensor | None  # (R, S) or None
    graph: object = None  # torch.cuda.CUDAGraph of the decode step, once captured
    graph_key: tuple = ()

    @property
    def cum(self) -> torch.Tensor:
        """The cache position the next forward writes (the cache's own device-side counter)."""
        return self.cache.layers[0].cumulative_length

    def set_position(self, p: int) -> None:
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(p)


class StaticDecoder:
    """The static decode path of one ``HFBackend`` (module docstring); ``generate_chunk`` has the
    contract of ``HFBackend._generate_chunk``."""

    def __init__(
        self, backend, read_every: int = READ_EVERY, graphs: bool | None = None, pad_buckets: bool | None = None
    ):
        """``graphs``: capture CUDA graphs (None: on CUDA; never on a CPU). ``pad_buckets``: pad the
        batch to ``BUCKETS`` and round the cache length (None: when graphs are captured; True on a
        CPU runs the CUDA path's shapes without graphs, which the CPU tests use)."""
        if read_every < 1:
            raise ValueError("read_every must be >= 1")
        register_attention()
        self.backend = backend
        self.read_every = read_every
        self._graphs = graphs
        self._pad = pad_buckets
        self._slots: dict = {}  # (rows, length, budget) -> _Slot, kept between calls on CUDA
        self._pool = None  # CUDA graphs share one memory pool
        self.captures = 0  # CUDA graphs captured so far (a test reads it)
        self.gen: GenerationCopy | None = None  # the generation copy, built at the first decode (generation)

    def for_backend(self, backend) -> StaticDecoder:
        """A decoder with these settings for another backend (``HFBackend.__copy__``): slots, graphs
        and the generation copy belong to one backend's model."""
        return StaticDecoder(backend, self.read_every, self._graphs, self._pad)

    def generation(self) -> GenerationCopy:
        """The generation copy of the backend's model in its compute dtype, refreshed: the one call
        that keeps it current (``GenerationCopy.refresh``: copies only when the master changed, so once
        after each optimizer step). A new copy when the backend's model or compute dtype changed."""
        be = self.backend
        if self.gen is None or not self.gen.follows(be.model, be.compute_dtype):
            self.gen = None  # the old copy's memory is free before the new one is made
            self.gen = GenerationCopy(be.model, be.compute_dtype, ATTENTION)
        else:
            self.gen.refresh()
        return self.gen

    def uses_graphs(self, device: torch.device) -> bool:
        return device.type == "cuda" and self._graphs is not False

    def pads(self, device: torch.device) -> bool:
        return self.uses_graphs(device) if self._pad is None else self._pad

    # ------------------------------------------------------------------ one chunk
    def generate_chunk(
        self, seqs, sampling: Sampling, gen, limits=None, stop=None, hook=None, offset=0
    ) -> list[Completion]:
        be = self.backend
        b = len(seqs)
        if b == 0:
            return []
        dev = next(be.model.parameters()).device
        steps = sampling.max_new_tokens if limits is None else max(list(limits) + [0])
        lim = torch.tensor([steps] * b if limits is None else list(limits), dtype=torch.long)
        # the same draw as the eager path: one uniform per (row, step), up front
        u = (
            torch.rand((b, steps), generator=gen, dtype=torch.float64, device=gen.device)
            if sampling.temperature > 0 and steps
            else None
        )
        empty = torch.zeros((b, 0))
        if steps == 0 or not bool((lim > 0).any()):
            return completions(
                empty.long(),
                empty,
                None,
                torch.zeros(b, dtype=torch.long),
                lim,
                torch.zeros(b, dtype=torch.bool),
                False,
                be._eos_set,
            )
        return self._decode(self.generation().module, seqs, sampling, u, lim, steps, stop, hook, offset, dev)

    def _decode(self, model, seqs, sampling, u, lim, steps, stop, hook, offset, dev) -> list[Completion]:
        be = self.backend
        b = len(seqs)

        # ---- prefill: each distinct prompt once
        firsts: dict[tuple, int] = {}
        grp = torch.tensor([firsts.setdefault(tuple(s), len(firsts)) for s in seqs], dtype=torch.long)
        ids, mask2, pos2 = be.left_pad(list(firsts))
        width = ids.shape[1]
        spec = self._cache_spec(model, dev)
        pre = static_cache(model.config, width, len(firsts), spec)
        want0 = hook is not None and bool(hook.wants(0))
        res = be._forward(ids, prefill_mask(mask2.bool()), pos2, pre, hidden=want0, model=model)
        g = grp.to(dev)
        logits = res.logits[:, -1, :].float()[g]
        hidden = res.hidden_states[-1][:, -1, :][g] if want0 else None

        pad, graphs = self.pads(dev), self.uses_graphs(dev)
        budget = _round_up(steps, LENGTH_STEP) if pad else steps
        length = _round_up(width + budget, LENGTH_STEP) if pad else width + steps
        slot = self._slot(model, bucket(b, pad, be.max_batch), length, budget, spec, sampling, pad, graphs)
        if slot.rows > b:  # the bucket's padding rows (finished from the start) sample from zeros
            logits = torch.cat([logits, logits.new_zeros((slot.rows - b, logits.shape[1]))])
        # ---- load the slot: row r of the batch is chunk row act[r]
        act = torch.arange(b)
        with torch.no_grad():
            for dst, src in zip(slot.cache.layers, pre.layers):
                for d, s in ((dst.keys, src.keys), (dst.values, src.values)):
                    d[:b, :, :width].copy_(s.index_select(0, g))
                    d[:b, :, width:].zero_()
                    d[b:].zero_()
            slot.set_position(width)
            slot.valid.zero_()
            slot.valid[:b, :width] = mask2.bool()[g]
            slot.pos.zero_()
            slot.pos[:b, 0] = pos2[g, -1]
            slot.tok.fill_(be.pad_id)
            slot.done.fill_(True)
            slot.done[:b] = (lim <= 0).to(dev)
            slot.n_new.zero_()
            slot.lim.zero_()
            slot.lim[:b] = lim.to(dev)
            slot.u.zero_()
            if u is not None:
                slot.u[:b, :steps] = u.to(dev, torch.float32)
            slot.tidx.zero_()
            slot.ids.fill_(be.pad_id)
            slot.lp.zero_()
            if slot.ent is not None:
                slot.ent.zero_()

        eos = be.eos_ids.to(dev)
        new_ids = torch.full((b, steps), be.pad_id, dtype=torch.long)
        new_lp = torch.zeros((b, steps))
        new_ent = torch.zeros((b, steps)) if be.record_entropy else None
        n_new = torch.zeros(b, dtype=torch.long)
        pruned = torch.zeros(b, dtype=torch.bool)
        reported = 0
        stopped = False

        def report(slot, act) -> None:  # on_tokens: the tokens since the last read
            nonlocal reported
            counted = int(slot.n_new[: len(act)].sum()) + int(n_new.sum()) - int(n_new[act].sum())
            if be.on_tokens is not None and counted > reported:
                be.on_tokens(counted - reported)
            reported = counted

        def unload(slot, act):  # the slot's rows back into the chunk's buffers
            n = len(act)
            new_ids[act] = slot.ids[:n, :steps].cpu()
            new_lp[act] = slot.lp[:n, :steps].float().cpu()
            if new_ent is not None:
                new_ent[act] = slot.ent[:n, :steps].float().cpu()
            n_new[act] = slot.n_new[:n].cpu()

        for t in range(steps):
            if t:
                want = hook is not None and bool(hook.wants(t))
                if want or slot.graph is None:
                    logits, hidden = self._forward(model, slot, want, None if pad else width + t)
            else:
                want = want0
            if want:  # the decode hook, before token t is sampled (eager path's contract)
                n = len(act)
                done_all = torch.ones(b, dtype=torch.bool)
                done_all[act] = slot.done[:n].cpu()
                if bool(done_all.all()):  # as on the eager path, a hook is not called once all rows are done
                    report(slot, act)
                    break
                full = hidden.new_zeros((b, hidden.shape[-1]))
                full[act.to(full.device)] = hidden[:n]
                cut = hook(t, torch.arange(offset, offset + b), full, ~done_all)
                if cut is not None:
                    cut = cut.cpu() & ~done_all
                    pruned |= cut
                    slot.done[:n] |= cut[act].to(dev)
            if t and not want and slot.graph is not None:
                slot.graph.replay()
            else:
                self._sample(slot, sampling, logits, eos)
            if (t + 1) % self.read_every == 0 or t + 1 == steps:
                n = len(act)
                done_rows = slot.done[:n].cpu()
                report(slot, act)
                if bool(done_rows.all()) or t + 1 == steps:
                    break
                chunk_done = torch.ones(b, dtype=torch.bool)
                chunk_done[act] = done_rows
                if stop is not None and stop(chunk_done.tolist()):
                    stopped = True
                    break
                keep = (~done_rows).nonzero()[:, 0]
                rows = bucket(len(keep), pad, be.max_batch)
                if rows < slot.rows:  # finished rows leave: the live ones move to a smaller bucket
                    unload(slot, act)
                    smaller = self._slot(model, rows, length, budget, spec, sampling, pad, graphs)
                    self._move(slot, smaller, keep.to(dev))
                    slot, act = smaller, act[keep]
        unload(slot, act)
        return completions(new_ids, new_lp, new_ent, n_new, lim, pruned, stopped, be._eos_set)

    # ------------------------------------------------------------------ the decode step
    def _forward(self, model, slot: _Slot, hidden: bool, width: int | None):
        """Feed each row's last token at its position through ``model`` (the generation copy); (logits
        (R, V) fp32, last hidden (R, H) or None). ``width``: cache positions attended (None: all, as a
        CUDA graph must)."""
        slot.valid.index_fill_(1, slot.cum.view(1), True)
        mask = slot.valid[:, None, None, :] if width is None else slot.valid[:, None, None, :width]
        res = self.backend._forward(slot.tok, mask, slot.pos, slot.cache, hidden=hidden, model=model)
        h = res.hidden_states[-1][:, -1, :] if hidden else None
        return res.logits[:, -1, :].float(), h

    def _sample(self, slot: _Slot, sampling: Sampling, logits: torch.Tensor, eos: torch.Tensor) -> None:
        """Sample step ``tidx`` of every row in fp32 from ``u[:, tidx]`` and record it, all on the
        device: a finished row takes no token (pad, log-prob 0, not counted)."""
        logp = sampling_logprobs(logits, sampling)
        u = slot.u.index_select(1, slot.tidx)[:, 0] if sampling.temperature > 0 else None
        tok, lp = sample_rows(logits, sampling, logp, u, cdf_dtype=torch.float32)
        live = ~slot.done
        tok = torch.where(live, tok, torch.full_like(tok, self.backend.pad_id))
        slot.ids.index_copy_(1, slot.tidx, tok[:, None])
        slot.lp.index_copy_(1, slot.tidx, torch.where(live, lp, torch.zeros_like(lp))[:, None])
        if slot.ent is not None:
            slot.ent.index_copy_(1, slot.tidx, torch.where(live, entropy(logp), torch.zeros_like(lp))[:, None])
        slot.n_new.add_(live.long())
        slot.done.logical_or_(torch.isin(tok, eos) | (slot.n_new >= slot.lim))
        slot.tok.copy_(tok[:, None])
        slot.pos.add_(1)
        slot.tidx.add_(1)

    # ------------------------------------------------------------------ slots and graphs
    def _slot(self, model, rows, length, budget, spec, sampling, pad, graphs) -> _Slot:
        """The decode state of ``rows`` rows: with padded buckets kept between calls (and on CUDA its
        step captured: one graph per bucket, recaptured when the sampling settings or the weights'
        storage change), else fresh. ``spec``: the cache's (K/V heads, head size, dtype, device)."""
        key = (rows, length, budget, spec, self.backend.record_entropy)
        if pad and key not in self._slots:  # slots (and graphs) of the last KEEP_LENGTHS cache lengths stay
            lengths = list(dict.fromkeys(k[1] for k in self._slots))
            if length not in lengths and len(lengths) >= KEEP_LENGTHS:
                self._slots = {k: v for k, v in self._slots.items() if k[1] != lengths[0]}
        slot = self._slots.get(key) if pad else None
        if slot is None:
            slot = self._new_slot(model, rows, length, budget, spec)
            if pad:
                self._slots[key] = slot
        if graphs:
            gkey = self._graph_key(model, sampling)
            if slot.graph is None or slot.graph_key != gkey:
                self._capture(model, slot, sampling, gkey)
        return slot

    def _cache_spec(self, model, dev: torch.device) -> tuple:
        """(K/V heads, head size, dtype, device) of the cache: under bf16 / fp16 autocast the compute
        dtype (what autocast's SDPA reads K and V in; without a fixed dtype transformers' layer would
        take the dtype of the first keys, fp32 after the rotary embedding, while the values are
        bf16), else the weights' dtype."""
        be = self.backend
        cfg = model.config.get_text_config(decoder=True)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        dtype = be.compute_dtype if be.compute_dtype in HALF else next(model.parameters()).dtype
        return (kv, head_dim, dtype, dev)

    def _new_slot(self, model, rows, length, budget, spec) -> _Slot:
        be = self.backend
        dev = spec[3]
        cache = static_cache(model.config, length, rows, spec)

        def z(*shape, dtype=torch.long):
            return torch.zeros(shape, dtype=dtype, device=dev)

        return _Slot(
            rows=rows,
            length=length,
            budget=budget,
            cache=cache,
            tok=z(rows, 1),
            pos=z(rows, 1),
            valid=z(rows, length, dtype=torch.bool),
            done=z(rows, dtype=torch.bool),
            n_new=z(rows),
            lim=z(rows),
            u=z(rows, budget, dtype=torch.float32),
            tidx=z(1),
            ids=z(rows, budget),
            lp=z(rows, budget, dtype=torch.float32),
            ent=z(rows, budget, dtype=torch.float32) if be.record_entropy else None,
        )

    def _graph_key(self, model, sampling: Sampling) -> tuple:
        be = self.backend
        weights = tuple(p.data_ptr() for p in model.parameters())  # the generation copy's: kept by refreshes
        return (sampling.temperature, sampling.top_p, be.record_entropy, be.compute_dtype, hash(weights))

    def _move(self, src: _Slot, dst: _Slot, keep: torch.Tensor) -> None:
        """Copy the rows ``keep`` of ``src`` into the first rows of ``dst`` (its other rows: finished)."""
        n = len(keep)
        with torch.no_grad():
            for a, c in zip(dst.cache.layers, src.cache.layers):
                for d, s in ((a.keys, c.keys), (a.values, c.values)):
                    d[:n].copy_(s.index_select(0, keep))
                    d[n:].zero_()
            dst.set_position(int(src.cum))
            for name in ("tok", "pos", "valid", "done", "n_new", "lim", "u", "ids", "lp", "ent"):
                d, s = getattr(dst, name), getattr(src, name)
                if d is None:
                    continue
                d[:n].copy_(s.index_select(0, keep))
                if n < dst.rows:
                    d[n:] = True if name in ("done",) else 0
            dst.tidx.copy_(src.tidx)

    def _capture(self, model, slot: _Slot, sampling: Sampling, gkey: tuple) -> None:
        """Capture one decode step (forward over the whole cache, sampling, bookkeeping) of ``slot``
        into a CUDA graph, after warm-up steps on a side stream (PyTorch's CUDA graph recipe); the
        state the warm-up and the capture wrote is reset by the slot's next load. Autocast's weight
        cast cache cannot live across a capture, so it is off here."""
        be = self.backend
        eos = be.eos_ids.to(slot.tok.device)
        saved = be._autocast_cache
        be._autocast_cache = False

        def step():
            logits, _ = self._forward(model, slot, False, None)
            self._sample(slot, sampling, logits, eos)

        def reset():
            slot.set_position(0)
            slot.tidx.zero_()
            slot.done.fill_(True)
            slot.valid.zero_()

        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    reset()
                    step()
            torch.cuda.current_stream().wait_stream(stream)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            reset()
            # thread_local: under train.async the trainer's thread keeps launching its own work meanwhile
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                step()
            torch.cuda.synchronize()
        finally:
            be._autocast_cache = saved
        reset()
        for layer in slot.cache.layers:  # the warm-up wrote into the cache: no stale values remain
            layer.keys.zero_()
            layer.values.zero_()
        slot.graph, slot.graph_key = graph, gkey
        self.captures += 1
