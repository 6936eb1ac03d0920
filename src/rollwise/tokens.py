"""Turning prompts into token ids and completions back into text.

The one place that knows how a ``Prompt`` is shown to a model: plain text with a BOS for the
built-in character model, or the tokenizer's chat template when the prompt has ``messages`` and
the tokenizer has a template (a prompt's ``metadata["tools"]``, tool schemas, go to the template's
``tools=`` when it renders tools, else into a system message: ``tool_instructions``). Backends only
ever see token ids.

Episodes (docs/architecture.md §11) append observations after the policy's turns without ever
re-tokenising earlier text: ``encode_observation`` gives the ids of one observation (plain text
for a prompt shown without a template; else a ``user``/``tool`` message plus the generation
prompt), and ``episode_ids`` lays out a whole demonstration exactly as the episode pool does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollwise.types import Prompt


def tool_instructions(tools: Sequence[dict]) -> str:
    """A system message describing ``tools`` (``Tool.schema()`` dicts) and the JSON call format
    (``rollwise.envs.tools``), for chat templates that do not render tools themselves."""
    return (
        "You can call these tools:\n"
        + "\n".join(json.dumps(t.get("function", t)) for t in tools)
        + '\nTo call one, write <tool_call>{"name": "NAME", "arguments": {...}}</tool_call> and end your turn; '
        "its result comes back as <tool_response>...</tool_response>."
    )


@dataclass
class Codec:
    tokenizer: Any
    use_chat: bool = True  # apply the chat template when the prompt has messages

    def __post_init__(self) -> None:
        tok = self.tokenizer
        self.eos_ids = frozenset(i for i in [tok.eos_token_id] if i is not None)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self._cache: dict[str, tuple[int, ...]] = {}
        self._obs_cache: dict[tuple[str, str], tuple[int, ...]] = {}

    def chat(self, prompt: Prompt) -> bool:
        """Whether ``prompt`` is shown through the tokenizer's chat template."""
        return bool(self.use_chat and prompt.messages and getattr(self.tokenizer, "chat_template", None))

    def _template(self, messages, generation_prompt: bool, **extra) -> list[int]:
        out = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=True, **extra
        )
        return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)

    def encode_prompt(self, prompt: Prompt) -> tuple[int, ...]:
        ids = self._cache.get(prompt.id)
        if ids is None:
            tok = self.tokenizer
            if self.chat(prompt):
                messages, tools, extra = list(map(dict, prompt.messages)), prompt.metadata.get("tools"), {}
                if tools and "tools" in str(self.tokenizer.chat_template):  # the template renders tools itself
                    extra = {"tools": list(tools)}
                elif tools:  # a template without tools (SmolLM2's): the tools in a system message
                    messages = [{"role": "system", "content": tool_instructions(tools)}, *messages]
                ids = tuple(self._template(messages, True, **extra))
            else:
                bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
                ids = tuple(bos + tok.encode(prompt.text, add_special_tokens=False))
            self._cache[prompt.id] = ids
        return ids

    def decode(self, completion_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(completion_ids), skip_special_tokens=True)

    def encode_text(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_observation(self, text: str, prompt: Prompt, role: str = "user") -> list[int]:
        """The ids appended after a policy turn (which ended with EOS) to show ``text``: its plain
        encoding, or, for a chat prompt, the template's tokens of a ``role`` message and the
        generation prompt. Those are the tokens the template puts after the assistant's end token
        in ``[user, assistant]`` + ``[role: text]`` (a 3-message minus a 2-message conversation),
        so the turn before is never re-tokenised; a template that rejects ``role`` gets ``user``."""
        if not self.chat(prompt):
            return self.encode_text(text)
        key = (text, role)
        if key not in self._obs_cache:
            self._obs_cache[key] = self._chat_observation(text, role)
        return list(self._obs_cache[key])

    def _chat_observation(self, text: str, role: str) -> tuple[int, ...]:
        base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        before = self._template(base, False)
        try:
            after = self._template(base + [{"role": role, "content": text}], True)
        except Exception:  # a template without the role (e.g. no "tool" messages)
            after = self._template(base + [{"role": "user", "content": text}], True)
        eos = self.tokenizer.eos_token_id
        cut = max((i + 1 for i, t in enumerate(before) if t == eos), default=len(before))
        same = next((i for i, (a, b) in enumerate(zip(before[:cut], after)) if a != b), cut)
        return tuple(after[same:])


def cut_observation(ids: Sequence[int], limit: int | None) -> tuple[list[int], bool]:
    """An observation's ids cut to ``limit`` (``task.max_observation_tokens``; None = no cut), and
    whether they were cut."""
    ids = list(ids)
    if limit is None or len(ids) <= limit:
        return ids, False
    return ids[:limit], True


def episode_ids(
    codec: Codec, prompt: Prompt, steps: Sequence[tuple[str, str]], max_observation_tokens: int | None = None
) -> tuple[list[int], list[int]]:
    """(completion ids, loss mask) of a demonstrated episode ``((action, observation), ...)`` as
    the episode pool lays one out: each action's ids and EOS (mask 1), then its observation's ids
    cut to ``max_observation_tokens`` (mask 0; none after the last action)."""
    ids: list[int] = []
    mask: list[int] = []
    eos = codec.tokenizer.eos_token_id
    for k, (action, observation) in enumerate(steps):
        act = codec.encode_text(action) + [eos]
        last = k == len(steps) - 1
        obs = [] if last else cut_observation(codec.encode_observation(observation, prompt), max_observation_tokens)[0]
        ids += act + obs
        mask += [1] * len(act) + [0] * len(obs)
    return ids, mask
