"""What every sandbox-verified code task shares (``pyfunc``, ``humaneval``): the sandbox, the verdict
cache, the verifier worker count, the two splits, verification and the warm-start targets.

A subclass sets ``self._train`` / ``self._heldout`` (tuples of ``Prompt`` whose ``answer`` is the
reference solution as a continuation of the prompt) after calling ``CodeTask.__init__``.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollwise.tasks._common import sample_prompts
from rollwise.types import Prompt, Verdict
from rollwise.verify import code
from rollwise.verify.sandbox import Sandbox


class CodeTask:
    """Base of the code tasks; ``options`` has ``sandbox``, ``cache`` and ``workers``."""

    _train: tuple[Prompt, ...] = ()
    _heldout: tuple[Prompt, ...] = ()

    def __init__(self, options):
        self.options = options
        self.sandbox = Sandbox(options.sandbox)
        self.cache = code.VerdictCache() if options.cache else None
        self.verify_workers = options.workers

    def train_prompts(self) -> Sequence[Prompt]:
        return self._train

    def heldout_prompts(self) -> Sequence[Prompt]:
        return self._heldout

    def verify(self, prompt: Prompt, completion: str) -> Verdict:
        return code.verify(prompt, completion, self.sandbox, self.cache)

    def describe_verifier(self) -> str:
        return self.sandbox.describe() + f"; {self.verify_workers} worker(s)"

    def verifier_facts(self) -> dict:
        return self.sandbox.ledger_facts()

    def target(self, prompt: Prompt) -> str:
        """The reference solution as a continuation of the prompt."""
        return str(prompt.answer)

    def sft_examples(self, n: int, seed: int) -> list[tuple[Prompt, str]]:
        return [(p, self.target(p)) for p in sample_prompts(self._train, n, seed)]
