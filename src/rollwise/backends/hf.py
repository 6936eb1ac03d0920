"""Hugging Face backend: batched sampling with a KV cache that *continues* token sequences.

Contract: ``generate(sequences, sampling, generator=None) -> list[Completion]``. Each input is
prompt ids plus any already generated ids (a partial rollout to resume); each output holds only
the new ids, the sampler's log-prob of each (under the temperature-scaled, top-p renormalised
distribution that was actually sampled from; temperature 0 is greedy and reports the
temperature-1 log-prob), and a finish reason: "stop" (EOS emitted, included in the ids) or
"length" (``max_new_tokens`` reached).

Sequences are left-padded into chunks of at most ``max_batch`` rows; position ids skip the
padding, so a row's result does not depend on what it was batched with beyond float rounding.

Speed (issue #13): a row that finishes (EOS, its budget, a decode hook's cut) leaves the decode
batch at once, and its rows of the KV cache are dropped (``Cache.batch_select_indices``), so the
tail of a chunk costs what its live rows cost. Every forward asks the model for the logits of the
last position only (``logits_to_keep=1``: the prompt positions of the prefill never reach the LM
head). Sampling is inverse-CDF with one uniform per (row, step) drawn from the generator before
the first forward, so row i's t-th token reads ``u[i, t]`` however many rows have left the batch:
a row's tokens do not depend on compaction (nor on its batch-mates, beyond float rounding). The
tokens are still draws from exactly the distribution whose log-probs are reported. This consumes
the generator differently from the former ``torch.multinomial`` sampler, so a seed now gives
other samples than before issue #13. ``compute_dtype`` (``rollwise.hardware.precision``) runs the
forwards under bf16 autocast; the log-softmax of the sampled distribution is always fp32.

Two decode paths (``model.sampler``, ``resolve_sampler``): this module's ``_generate_chunk``
("eager", the description above) and ``rollwise.backends.static_decode`` ("static": a
preallocated cache per batch bucket, grouped-query attention without K/V copies, each distinct
prompt prefilled once, fp32 sampling on the device, "done" read every 8 steps, CUDA graphs on
CUDA), which decodes on a generation copy of the model (``rollwise.backends.generation_copy``:
linears in the compute dtype, LoRA merged, refreshed in place when the weights change). Both read
the same uniforms ``u[i, t]`` and return the same completions up to float rounding; ``compact``
concerns the eager path only. ``score``, ``prompt_states`` and ``forward_step`` read the model
itself on either path.

Optional extras (off by default, so the default path is unchanged):

- ``record_entropy = True`` (set by the run when D3S token selection reads sampler entropies,
  ``rollwise.batch.d3s``): each ``Completion.entropies[t]`` is the entropy of the distribution
  token t was drawn from (same temperature / top-p as its log-prob).
- ``generate(..., decode_hook=hook)``: a decode-time hook (ARRoL pruning,
  ``rollwise.generate.arrol``). Before sampling token t (t = tokens generated so far) the backend
  asks ``hook.wants(t)``; if True the forward also returns hidden states and
  ``hook(t, rows, hidden, alive)`` is called with the rows' indices into ``sequences`` (B,),
  the last layer's hidden state at each row's current position (B, H) and the rows still
  generating (B,) bool. It returns None or a (B,) bool of rows to stop now: they keep the t ids
  they have and come back with finish "partial".
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rollwise.backends.sampling import (  # noqa: F401 (sample_next, top_p_logprobs: re-exported, hf is their old home)
    completions,
    entropy,
    sample_next,
    sample_rows,
    sampling_logprobs,
    top_p_logprobs,
)
from rollwise.backends.static_decode import StaticDecoder, supports
from rollwise.hardware.precision import autocast
from rollwise.registry import Compat
from rollwise.types import Completion, Sampling


class HFBackend:
    compat = Compat(
        engine="trainer"
    )  # the trainer's module in this process: decode hooks, scoring, entropies, one per rank
    record_entropy: bool = False  # fill Completion.entropies (module docstring)
    compact: bool = True  # finished rows leave the decode batch (False: the pre-#13 behaviour, for A/B tests)
    on_tokens = None  # callable(n) told the tokens of every decode step (a Ray worker reports progress)
    _autocast_cache = True  # autocast caches the weights' casts (off while a CUDA graph is captured)

    @classmethod
    def for_run(cls, cfg, codec, model, config=None, compute_dtype: torch.dtype | None = None) -> HFBackend:
        """The sampler on ``model`` (``rollwise.backends.build``); ``compute_dtype`` None: ``model.compute_dtype``
        resolved for the device of the model's weights."""
        if compute_dtype is None:
            from rollwise.hardware.precision import resolve_compute_dtype

            weights = next(model.parameters())
            compute_dtype = resolve_compute_dtype(
                cfg.model.compute_dtype, weights.device, model.config, weights_dtype=weights.dtype
            )
        return cls(
            model,
            codec.eos_ids,
            codec.pad_id,
            cfg.model.max_batch,
            cfg.run.seed,
            compute_dtype=compute_dtype,
            sampler=cfg.model.sampler,
        )

    def __init__(
        self,
        model,
        eos_ids: Sequence[int],
        pad_id: int,
        max_batch: int = 256,
        seed: int = 0,
        compute_dtype: torch.dtype | None = None,
        sampler: str = "eager",
    ):
        self.model = model
        self.compute_dtype = compute_dtype  # autocast dtype of the forwards (None / float32: none)
        self._keeps_logits = _accepts_logits_to_keep(model)
        self._cache = _cache_argument(model)
        self.eos_ids = torch.tensor(sorted(set(eos_ids)), dtype=torch.long)
        self._eos_set = frozenset(int(i) for i in eos_ids)
        self.pad_id = pad_id
        self.max_batch = max_batch
        self.generator = torch.Generator().manual_seed(seed)
        self.sampler = resolve_sampler(sampler, next(model.parameters()).device, model)
        self._static = StaticDecoder(self) if self.sampler == "static" else None

    def __copy__(self) -> HFBackend:
        """A shallow copy (the same sampling RNG) with a static decoder of its own: the asynchronous
        generator's backend (``distributed.async_pool.build``), which then takes a model of its own,
        must not decode through this backend's decoder, slots and generation copy."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        if self._static is not None:
            new._static = self._static.for_backend(new)
        return new

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])

    @torch.no_grad()
    def generate(
        self,
        sequences: Sequence[Sequence[int]],
        sampling: Sampling,
        generator: torch.Generator | None = None,
        max_new_tokens: Sequence[int] | None = None,
        stop_when=None,
        decode_hook=None,
    ) -> list[Completion]:
        """``max_new_tokens`` (optional, one per sequence) overrides ``sampling.max_new_tokens``
        row by row (a resumed rollout's remaining budget). ``stop_when(done) -> bool`` (optional)
        is called after every decode step with one flag per input sequence (True = finished,
        sequences of earlier chunks included); once it returns True generation stops: unfinished
        rows (and rows of chunks not started) come back with finish "partial" and the ids so far
        (APRIL, ``rollwise.generate.april``)."""
        gen = generator or self.generator
        out: list[Completion] = []
        was_training = self.model.training
        self.model.eval()
        halted = False  # stop_when fired: later chunks do not start
        try:
            for start in range(0, len(sequences), self.max_batch):
                chunk = sequences[start : start + self.max_batch]
                if halted:
                    out.extend(Completion((), (), "partial") for _ in chunk)
                    continue
                limits = None if max_new_tokens is None else max_new_tokens[start : start + len(chunk)]
                stop = None
                if stop_when is not None:
                    before, after = [True] * start, [False] * (len(sequences) - start - len(chunk))
                    stop = (lambda b, a: lambda done: stop_when(b + done + a))(before, after)
                decode = self._generate_chunk if self._static is None else self._static.generate_chunk
                done = decode(chunk, sampling, gen, limits, stop, hook=decode_hook, offset=start)
                halted = (
                    stop is not None
                    and len(sequences) > start + len(chunk)
                    and stop([c.finish != "partial" for c in done])
                )
                out.extend(done)
        finally:
            self.model.train(was_training)
        return out

    @torch.no_grad()
    def score(
        self, sequences: Sequence[Sequence[int]], starts: Sequence[int], sampling: Sampling, full: bool = False
    ) -> list:
        """One forward pass (in chunks of ``max_batch``) scoring given tokens under the current
        weights: for sequence i, the log-prob of every id at positions ``starts[i]..`` given the ids
        before it, under the same distribution ``generate`` samples from (temperature-scaled, top-p
        renormalised; temperature 0 scores at temperature 1). Returns one tuple of floats per
        sequence, or with ``full`` one ``(len - start, V)`` tensor of log-probs over the vocabulary
        (SPEC-RL's verification pass, ``rollwise.generate.spec_rl``)."""
        out: list = []
        was_training = self.model.training
        self.model.eval()
        dev = next(self.model.parameters()).device
        try:
            for start in range(0, len(sequences), self.max_batch):
                seqs, st = sequences[start : start + self.max_batch], starts[start : start + self.max_batch]
                width = max(len(s) for s in seqs)
                ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
                mask = torch.zeros((len(seqs), width), dtype=torch.long)
                for i, s in enumerate(seqs):
                    ids[i, : len(s)] = torch.tensor(list(s), dtype=torch.long)
                    mask[i, : len(s)] = 1
                with autocast(self.compute_dtype, dev):
                    logits = self.model(input_ids=ids.to(dev), attention_mask=mask.to(dev)).logits.float()
                for i, s in enumerate(seqs):
                    lo, hi = max(1, st[i]), len(s)
                    lp = sampling_logprobs(logits[i, lo - 1 : hi - 1], sampling)
                    if full:
                        out.append(lp.cpu())
                    else:
                        tok = torch.tensor(list(s[lo:hi]), dtype=torch.long, device=lp.device)
                        out.append(tuple(lp.gather(1, tok[:, None])[:, 0].tolist()))
        finally:
            self.model.train(was_training)
        return out

    def _forward(self, inp, mask, pos, cache, hidden: bool = False, model=None):
        """One cached forward of ``model`` (default: the backend's model; the static path passes its
        generation copy) under the compute dtype; logits only at the last position."""
        kw = {"output_hidden_states": True} if hidden else {}
        if self._keeps_logits:
            kw["logits_to_keep"] = 1  # the LM head only where a token is sampled (prefill included)
        with autocast(self.compute_dtype, inp.device, cache_enabled=self._autocast_cache):
            kw[self._cache] = cache
            return (self.model if model is None else model)(
                input_ids=inp, attention_mask=mask, position_ids=pos, use_cache=True, **kw
            )

    def _generate_chunk(
        self, seqs, sampling: Sampling, gen, limits=None, stop=None, hook=None, offset=0
    ) -> list[Completion]:
        b = len(seqs)
        if b == 0:
            return []
        ids, mask, pos = self.left_pad(seqs)
        dev = ids.device
        steps = sampling.max_new_tokens if limits is None else max(list(limits) + [0])
        lim = (
            torch.full((b,), steps, dtype=torch.long, device=dev)
            if limits is None
            else torch.tensor(list(limits), dtype=torch.long, device=dev)
        )
        # one uniform per (row, step), drawn up front: row i's t-th token reads u[i, t] whatever
        # rows have left the batch, so compaction cannot change a row's tokens (module docstring)
        u = (
            torch.rand((b, steps), generator=gen, dtype=torch.float64, device=gen.device)
            if sampling.temperature > 0 and steps
            else None
        )
        new_ids = torch.full((b, steps), self.pad_id, dtype=torch.long, device=dev)
        new_lp = torch.zeros((b, steps), device=dev)
        done = lim <= 0
        n_new = torch.zeros(b, dtype=torch.long, device=dev)
        eos_ids = self.eos_ids.to(dev)
        cache = None
        act = (~done).nonzero()[:, 0]  # chunk rows still in the decode batch, in cache order
        inp, mask, pos = ids[act], mask[act], pos[act]
        stopped = False
        pruned = torch.zeros(b, dtype=torch.bool, device=dev)  # rows stopped by the decode hook
        new_ent = torch.zeros((b, steps), device=dev) if self.record_entropy else None
        for t in range(steps if len(act) else 0):
            want = hook is not None and bool(hook.wants(t))
            res = self._forward(inp, mask, pos, cache, hidden=want)
            cache = getattr(res, self._cache)
            logits = res.logits[:, -1, :].float()
            if want:
                hidden = res.hidden_states[-1][:, -1, :]
                full = hidden.new_zeros((b, hidden.shape[-1]))
                full[act] = hidden  # finished rows: zeros, flagged not alive
                cut = hook(t, torch.arange(offset, offset + b), full, ~done)
                if cut is not None:
                    cut = cut.to(dev) & ~done
                    pruned |= cut
                    done |= cut
                if bool(done.all()):
                    break
            logp = sampling_logprobs(logits, sampling)  # once per step: the draw and the entropy read it
            tok, lp = sample_rows(logits, sampling, logp, None if u is None else u[act.to(u.device), t])
            live = ~done[act]  # rows the hook just cut take no token
            tok = torch.where(live, tok, torch.full_like(tok, self.pad_id))
            new_ids[act, t] = tok
            new_lp[act, t] = torch.where(live, lp, torch.zeros_like(lp))
            if new_ent is not None:
                new_ent[act, t] = torch.where(live, entropy(logp), torch.zeros_like(lp))
            n_new[act] += live.long()
            if self.on_tokens is not None:
                self.on_tokens(int(live.sum()))
            done[act] |= torch.isin(tok, eos_ids)
            if limits is not None:
                done |= n_new >= lim
            if bool(done.all()):
                break
            if stop is not None and stop(done.tolist()):
                stopped = True
                break
            keep = ~done[act]
            inp = tok[:, None]
            pos = pos[:, -1:] + 1
            mask = torch.cat([mask, torch.ones((len(act), 1), dtype=mask.dtype, device=dev)], dim=1)
            if self.compact and not bool(keep.all()):  # finished rows leave the batch; their KV cache rows go too
                sel = keep.nonzero()[:, 0]
                act, inp, pos, mask = act[sel], inp[sel], pos[sel], mask[sel]
                cache.batch_select_indices(sel)
        return completions(new_ids, new_lp, new_ent, n_new, lim, pruned, stopped, self._eos_set)

    # ---------------------------------------------------------------- reusable pieces (tree samplers)
    def left_pad(self, seqs: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids, attention mask, position ids), each (B, W) on the model's device, left-padded
        exactly as ``generate`` pads a chunk (used by ``rollwise.generate.latr``)."""
        b, width = len(seqs), max(len(s) for s in seqs)
        ids = torch.full((b, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((b, width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, width - len(s) :] = torch.tensor(list(s), dtype=torch.long)
            mask[i, width - len(s) :] = 1
        dev = next(self.model.parameters()).device
        ids, mask = ids.to(dev), mask.to(dev)
        return ids, mask, (mask.cumsum(1) - 1).clamp(min=0)

    @torch.no_grad()
    def prompt_states(self, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
        """(N, H) float32 on the CPU: the last layer's hidden state at each sequence's last token, from
        the same left-padded prefill ``generate`` runs (no tokens sampled, no cache kept). The
        pass-rate predictor's features (``rollwise.value``): a prompt's state before any rollout."""
        out = []
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(sequences), self.max_batch):
                ids, mask, pos = self.left_pad(sequences[start : start + self.max_batch])
                res = self._forward(ids, mask, pos, None, hidden=True)
                out.append(res.hidden_states[-1][:, -1, :].float().cpu())
        finally:
            self.model.train(was_training)
        return torch.cat(out) if out else torch.zeros(0, 0)

    def forward_step(self, inp: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache):
        """One cached decoding forward: (last-position logits (B, V) float, new cache)."""
        res = self._forward(inp, mask, pos, cache)
        return res.logits[:, -1, :].float(), getattr(res, self._cache)


SAMPLERS = ("auto", "static", "eager")


def resolve_sampler(setting: str, device: torch.device, model=None) -> str:
    """``model.sampler``: "eager" (the per-token path above) or "static"
    (``rollwise.backends.static_decode``); "auto" is the static path on CUDA and on a CPU alike
    (measured faster on a CPU, ``benchmarks/results/static_decode_cpu.json``; on CUDA by design, one
    graph per bucket, not yet measured), under ``train.async`` too (the static path decodes on a
    generation copy whose attention is its own), unless ``model`` cannot take it
    (``static_decode.supports``): then "auto" is eager and "static" is refused."""
    from rollwise.registry import UserError

    if setting not in SAMPLERS:
        raise UserError(f"model.sampler = {setting!r}: expected one of {', '.join(SAMPLERS)}")
    if setting == "eager":
        return setting
    why = None if model is None else supports(model)
    if why is not None and setting == "static":
        raise UserError(f"model.sampler = 'static': {why}; use model.sampler = 'eager'")
    return "eager" if why is not None else "static"


def _cache_argument(model) -> str:
    """The name under which ``model.forward`` takes and returns its KV cache: ``cache`` from
    transformers 5.2x on (where ``past_key_values`` still works but prints a FutureWarning on every
    forward), else ``past_key_values``. A peft wrapper is looked through to its base model."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        params = inspect.signature(base.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def _accepts_logits_to_keep(model) -> bool:
    """Whether ``model.forward`` takes ``logits_to_keep`` (HF causal LMs do; wrappers that pass
    ``**kwargs`` through are trusted to reach one)."""
    import inspect

    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins
        return False
    return "logits_to_keep" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
