"""Turning prompts into token ids and completions back into text.

The one place that knows how a ``Prompt`` is shown to a model: plain text with a BOS for the
built-in character model, or the tokenizer's chat template when the prompt has ``messages`` and
the tokenizer has a template. Backends only ever see token ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollwise.types import Prompt


@dataclass
class Codec:
    tokenizer: Any
    use_chat: bool = True  # apply the chat template when the prompt has messages

    def __post_init__(self) -> None:
        tok = self.tokenizer
        self.eos_ids = frozenset(i for i in [tok.eos_token_id] if i is not None)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self._cache: dict[str, tuple[int, ...]] = {}

    def encode_prompt(self, prompt: Prompt) -> tuple[int, ...]:
        ids = self._cache.get(prompt.id)
        if ids is None:
            tok = self.tokenizer
            if self.use_chat and prompt.messages and getattr(tok, "chat_template", None):
                out = tok.apply_chat_template(
                    list(map(dict, prompt.messages)), add_generation_prompt=True, tokenize=True
                )
                ids = tuple(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)
            else:
                bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
                ids = tuple(bos + tok.encode(prompt.text, add_special_tokens=False))
            self._cache[prompt.id] = ids
        return ids

    def decode(self, completion_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(completion_ids), skip_special_tokens=True)

    def encode_text(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)
