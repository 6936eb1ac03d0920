"""Hugging Face backend: batched sampling with a KV cache that *continues* token sequences.

Contract: ``generate(sequences, sampling, generator=None) -> list[Completion]``. Each input is
prompt ids plus any already generated ids (a partial rollout to resume); each output holds only
the new ids, the sampler's log-prob of each (under the temperature-scaled, top-p renormalised
distribution that was actually sampled from; temperature 0 is greedy and reports the
temperature-1 log-prob), and a finish reason: "stop" (EOS emitted, included in the ids) or
"length" (``max_new_tokens`` reached).

Sequences are left-padded into chunks of at most ``max_batch`` rows; position ids skip the
padding, so a row's result does not depend on what it was batched with beyond float rounding.
"""

from __future__ import annotations

from typing import Sequence

import torch

from rollwise.types import Completion, Sampling


class HFBackend:
    def __init__(self, model, eos_ids: Sequence[int], pad_id: int, max_batch: int = 256, seed: int = 0):
        self.model = model
        self.eos_ids = torch.tensor(sorted(set(eos_ids)), dtype=torch.long)
        self._eos_set = frozenset(int(i) for i in eos_ids)
        self.pad_id = pad_id
        self.max_batch = max_batch
        self.generator = torch.Generator().manual_seed(seed)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])

    @torch.no_grad()
    def generate(self, sequences: Sequence[Sequence[int]], sampling: Sampling, generator: torch.Generator | None = None) -> list[Completion]:
        gen = generator or self.generator
        out: list[Completion] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(sequences), self.max_batch):
                out.extend(self._generate_chunk(sequences[start:start + self.max_batch], sampling, gen))
        finally:
            self.model.train(was_training)
        return out

    def _generate_chunk(self, seqs, sampling: Sampling, gen) -> list[Completion]:
        b = len(seqs)
        if b == 0:
            return []
        width = max(len(s) for s in seqs)
        ids = torch.full((b, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((b, width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, width - len(s):] = torch.tensor(list(s), dtype=torch.long)
            mask[i, width - len(s):] = 1
        dev = next(self.model.parameters()).device
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        new_ids = torch.full((b, sampling.max_new_tokens), self.pad_id, dtype=torch.long, device=dev)
        new_lp = torch.zeros((b, sampling.max_new_tokens), device=dev)
        done = torch.zeros(b, dtype=torch.bool, device=dev)
        n_new = torch.zeros(b, dtype=torch.long, device=dev)
        eos_ids = self.eos_ids.to(dev)
        cache = None
        inp = ids
        for t in range(sampling.max_new_tokens):
            res = self.model(input_ids=inp, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
            cache = res.past_key_values
            tok, lp = sample_next(res.logits[:, -1, :].float(), sampling, gen)
            tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
            new_ids[:, t] = tok
            new_lp[:, t] = torch.where(done, torch.zeros_like(lp), lp)
            n_new += (~done).long()
            done |= torch.isin(tok, eos_ids)
            if bool(done.all()):
                break
            inp = tok[:, None]
            pos = pos[:, -1:] + 1
            mask = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype, device=dev)], dim=1)
        result = []
        for i in range(b):
            n = int(n_new[i])
            toks = tuple(new_ids[i, :n].tolist())
            finish = "stop" if n and toks[-1] in self._eos_set else "length"
            result.append(Completion(toks, tuple(new_lp[i, :n].tolist()), finish))
        return result


def sample_next(logits: torch.Tensor, sampling: Sampling, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row; return (ids (B,), log-probs (B,)) under the sampled distribution."""
    if sampling.temperature <= 0:
        tok = logits.argmax(dim=-1)
        return tok, torch.log_softmax(logits, dim=-1).gather(1, tok[:, None])[:, 0]
    logp = torch.log_softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        logp = top_p_logprobs(logp, sampling.top_p)
    probs = logp.exp()
    if probs.device != gen.device:  # a CPU generator keeps sampling reproducible on any device
        probs = probs.float().cpu()
    tok = torch.multinomial(probs, 1, generator=gen)[:, 0].to(logp.device)
    return tok, logp.gather(1, tok[:, None])[:, 0]


def top_p_logprobs(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose mass reaches ``top_p``; renormalise."""
    sorted_lp, order = logp.sort(dim=-1, descending=True)
    cum = sorted_lp.exp().cumsum(dim=-1)
    drop_sorted = (cum - sorted_lp.exp()) >= top_p  # mass before this token already reaches top_p
    drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
    kept = logp.masked_fill(drop, float("-inf"))
    return kept - torch.logsumexp(kept, dim=-1, keepdim=True)
