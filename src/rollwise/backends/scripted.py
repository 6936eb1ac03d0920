"""A deterministic fake backend for tests: a user function decides each completion.

``ScriptedBackend(respond, eos_id)``: ``respond(sequence_ids, call_index) -> list[int]`` gives
the new ids (without EOS) for one input; the backend appends EOS, truncates at
``max_new_tokens`` (finish "length") and reports log-prob ``logprob`` for every token.
"""

from __future__ import annotations

from typing import Callable, Sequence

from rollwise.types import Completion, Sampling


class ScriptedBackend:
    def __init__(self, respond: Callable[[list[int], int], list[int]], eos_id: int, logprob: float = -0.5):
        self.respond = respond
        self.eos_id = eos_id
        self.logprob = logprob
        self.calls = 0

    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = state["calls"]

    def generate(self, sequences: Sequence[Sequence[int]], sampling: Sampling, generator=None) -> list[Completion]:
        out = []
        for seq in sequences:
            ids = list(self.respond(list(seq), self.calls)) + [self.eos_id]
            self.calls += 1
            finish = "stop"
            if len(ids) > sampling.max_new_tokens:
                ids, finish = ids[: sampling.max_new_tokens], "length"
            out.append(Completion(tuple(ids), (self.logprob,) * len(ids), finish))
        return out
