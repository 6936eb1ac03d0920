"""A deterministic fake backend for tests: a user function decides each completion.

``ScriptedBackend(respond, eos_id)``: ``respond(sequence_ids, call_index) -> list[int]`` gives
the new ids (without EOS) for one input; the backend appends EOS, truncates at
``max_new_tokens`` (finish "length") and reports log-prob ``logprob`` for every token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rollwise.registry import Compat
from rollwise.types import Completion, Sampling


class ScriptedBackend:
    compat = Compat(
        decode_hooks=False, sampler_entropy=False, engine="script"
    )  # tests only: no decode hooks, no entropies

    @classmethod
    def for_run(cls, cfg, codec, model=None, config=None, compute_dtype=None) -> ScriptedBackend:
        from rollwise.registry import UserError

        raise UserError(
            "the scripted backend answers from a script, not a model: hand it to the run (Run(cfg, backend=...))"
        )

    def __init__(self, respond: Callable[[list[int], int], list[int]], eos_id: int, logprob: float = -0.5):
        self.respond = respond
        self.eos_id = eos_id
        self.logprob = logprob
        self.calls = 0

    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = state["calls"]

    def generate(
        self,
        sequences: Sequence[Sequence[int]],
        sampling: Sampling,
        generator=None,
        max_new_tokens: Sequence[int] | None = None,
        stop_when=None,
    ) -> list[Completion]:
        """As ``HFBackend.generate``: optional per-sequence ``max_new_tokens``; ``stop_when(done)``
        is checked after each simulated decode step t = 1, 2, ... (a row is done at the step that
        emits its last id), and rows unfinished when it returns True are cut to t ids, "partial"."""
        out = []
        for i, seq in enumerate(sequences):
            limit = sampling.max_new_tokens if max_new_tokens is None else max_new_tokens[i]
            ids = list(self.respond(list(seq), self.calls)) + [self.eos_id]
            self.calls += 1
            finish = "stop"
            if len(ids) > limit:
                ids, finish = ids[:limit], "length"
            out.append(Completion(tuple(ids), (self.logprob,) * len(ids), finish))
        if stop_when is not None and out:
            for t in range(1, max(len(c.token_ids) for c in out)):
                if stop_when([len(c.token_ids) <= t for c in out]):
                    out = [
                        c if len(c.token_ids) <= t else Completion(c.token_ids[:t], c.logprobs[:t], "partial")
                        for c in out
                    ]
                    break
        return out

    def score(
        self, sequences: Sequence[Sequence[int]], starts: Sequence[int], sampling: Sampling, full: bool = False
    ) -> list:
        """Log-prob ``logprob`` for every id at positions ``starts[i]..`` (the scripted policy
        never changes, so a speculative draft is always accepted)."""
        if full:
            raise NotImplementedError("the scripted backend has no distribution to return")
        return [(self.logprob,) * (len(s) - st) for s, st in zip(sequences, starts)]
