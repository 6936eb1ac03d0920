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
``task.max_observation_tokens`` cuts the observation's own tokens and keeps the template's tokens
around them (issue #40): cutting the wrapped ids would drop the message's end token and the next
``assistant`` header, and the policy's next turn would be generated inside the tool's message.
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
        self._obs_cache: dict[tuple[str, str], tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {}
        self._wrap_cache: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}

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

    def encode_observation(
        self, text: str, prompt: Prompt, role: str = "user", limit: int | None = None
    ) -> tuple[list[int], bool]:
        """The ids appended after a policy turn (which ended with EOS) to show ``text``, and whether
        they were cut. Plain prompts: ``text``'s encoding. Chat prompts: the template's tokens of a
        ``role`` message and the generation prompt, those it puts after the assistant's end token in
        ``[user, assistant]`` + ``[role: text]`` (a 3-message minus a 2-message conversation), so the
        turn before is never re-tokenised; a template that rejects ``role`` gets ``user``.
        ``limit`` (``task.max_observation_tokens``; None = no cut) cuts ``text``'s own tokens; the
        message header before them and its end token and the next turn's header after them stay."""
        if not self.chat(prompt):
            head, body, tail = (), tuple(self.encode_text(text)), ()
        else:
            key = (text, role)
            if key not in self._obs_cache:
                self._obs_cache[key] = self._chat_observation(text, role)
            head, body, tail = self._obs_cache[key]
        cut = limit is not None and len(body) > limit
        return [*head, *(body[:limit] if cut else body), *tail], cut

    def _chat_difference(self, text: str, role: str) -> list[int]:
        base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        before = self._template(base, False)
        try:
            after = self._template(base + [{"role": role, "content": text}], True)
        except Exception:  # a template without the role (e.g. no "tool" messages)
            after = self._template(base + [{"role": "user", "content": text}], True)
        eos = self.tokenizer.eos_token_id
        cut = max((i + 1 for i, t in enumerate(before) if t == eos), default=len(before))
        same = next((i for i, (a, b) in enumerate(zip(before[:cut], after)) if a != b), cut)
        return after[same:]

    def _wrapper(self, role: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(head, tail): the tokens the template puts before and after a ``role`` message's content,
        the common prefix and suffix of two one-letter messages."""
        if role not in self._wrap_cache:
            a, b = self._chat_difference("a", role), self._chat_difference("b", role)
            n = min(len(a), len(b)) - 1  # at least one token of content between them
            pre = next((i for i, (x, y) in enumerate(zip(a[:n], b[:n])) if x != y), n)
            suf = next((i for i in range(n - pre) if a[-1 - i] != b[-1 - i]), n - pre)
            self._wrap_cache[role] = tuple(a[:pre]), tuple(a[len(a) - suf :])
        return self._wrap_cache[role]

    def _chat_observation(self, text: str, role: str) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(head, content, tail) of ``text`` as a ``role`` message. The content is the template's own
        tokens of ``text`` when the whole is head + content + tail (the ids the template gives are
        kept); where the template's tokens merge across the border, ``text`` encoded alone."""
        ids = self._chat_difference(text, role)
        head, tail = self._wrapper(role)
        h, t = len(head), len(tail)
        if len(ids) >= h + t and tuple(ids[:h]) == head and tuple(ids[len(ids) - t :]) == tail:
            return head, tuple(ids[h : len(ids) - t]), tail
        return head, tuple(self.encode_text(text)), tail


def episode_ids(
    codec: Codec, prompt: Prompt, steps: Sequence[tuple[str, ...]], max_observation_tokens: int | None = None
) -> tuple[list[int], list[int]]:
    """(completion ids, loss mask) of a demonstrated episode ``((action, observation[, role]), ...)``
    as the episode pool lays one out: each action's ids and EOS (mask 1), then its observation's ids
    cut to ``max_observation_tokens`` (mask 0; none after the last action), in a message of ``role``
    on chat prompts: ``"tool"`` after an action that called a tool, as the pool does, else ``"user"``
    (the default)."""
    ids: list[int] = []
    mask: list[int] = []
    eos = codec.tokenizer.eos_token_id
    for k, (action, observation, *role) in enumerate(steps):
        act = codec.encode_text(action) + [eos]
        last = k == len(steps) - 1
        who = role[0] if role else "user"
        obs = [] if last else codec.encode_observation(observation, prompt, who, max_observation_tokens)[0]
        ids += act + obs
        mask += [1] * len(act) + [0] * len(obs)
    return ids, mask
