"""Tools for environments (issue #30): typed Python functions, two call formats, a runner with
budgets, and ``ToolEnv``, the environment of a tool-using task.

**Tools.** ``Tool.from_function(fn)`` reads the name, the docstring (first paragraph = description;
``name: text`` lines under ``Args:`` = parameter descriptions) and the signature (annotations
``str``, ``int``, ``float``, ``bool``, ``list``, ``dict``) into a JSON-schema record;
``Tool.schema()`` is the ``{"type": "function", "function": {...}}`` form that
``tokenizer.apply_chat_template(tools=...)`` takes. A tool returns text.

**Call formats** (a task option ``format``):

- ``tag``, for the tiny character model: ``<NAME>TEXT</NAME>`` with ``NAME`` a tool's name, e.g.
  ``<calc>12345+67890</calc>``; ``TEXT`` is the tool's first parameter, so a tag-format tool takes
  one argument. Each output comes back as ``<out>OUTPUT</out>``. A tag whose name is no tool is
  plain text; an opened tool tag that is never closed is a parse error.
- ``json``, Qwen / SmolLM chat style (the Hermes template): ``<tool_call>{"name": ..., "arguments":
  {...}}</tool_call>``; outputs come back as ``<tool_response>OUTPUT</tool_response>``. Bad JSON,
  a missing name, non-object arguments or an unclosed ``<tool_call>`` is a parse error; an unknown
  name is ``unknown_tool``.

**Running a call** (``ToolRunner``): every call of a turn is recorded as a ``rollwise.types.ToolCall``
with an outcome: ``ok``; ``error`` (the tool raised: the message is the observation; wrong arguments
too); ``timeout`` (longer than ``tool_timeout_s``); ``truncated`` (the output was cut to
``max_output_chars``); ``unknown_tool``; ``parse_error`` (the observation says what was wrong, so the
policy can fix it); ``limit`` (the episode already made ``max_tool_calls`` calls: not run). Every
call counts against the budget, parse errors included.

Plain Python tools run in a daemon thread joined for ``tool_timeout_s``. A thread cannot be killed:
a hung pure-Python tool keeps its thread (and CPU) after the call times out. Use such tools only
for trusted, bounded code (``calc``); anything untrusted runs in a process. **Model-written code
always runs in the code verifier's sandbox** (``rollwise.verify.sandbox``, see
``rollwise.envs.python_math``); such a tool enforces the time limit itself (``Tool.set_timeout``) and
reports it by raising ``ToolFailure("timeout", ...)``.

**ToolEnv.** A turn with tool calls runs them and returns their outputs (reward 0, not done). A turn
without one is the final answer: the task's verifier judges it, the episode ends, the reward is the
verdict's score (None = could not verify, never 0). This is the tool-integrated rollout of ToRL
(arXiv 2503.23383), ReTool (arXiv 2504.11536) and rStar2-Agent (arXiv 2508.20722) cut into turns:
the interpreter output is an observation the pool appends and masks, as they mask it. Deviation:
they stop the decoder at the closing code tag inside one response; here a turn ends at the end of
the policy's turn (the pool's stop rule) and every call in it runs.

**Anchor** (GiGPO's step groups, ``objectives/gigpo.py``): the state a turn acts in is what the
environment has answered so far, the concatenated observations of the episode's earlier turns
(``""`` before the first turn, shared by every episode of the prompt). A tool whose output is a
function of its call (``calc``) holds no other state, so two episodes whose calls differ in form
but got the same outputs (``<calc>1+2</calc>`` and ``<calc>2+1</calc>``) share a step group, and
episodes told different things never do. A task whose tools keep state that the outputs do not
show sets ``STATE_ANCHORS = False``: its turns get no anchor, and ``rollwise.compat`` refuses
``advantage.name = "gigpo"`` for it (its factory's ``Compat(state_anchors=False)``; e.g. ``python_math``).
"""

from __future__ import annotations

import copy
import inspect
import json
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollwise.config import TaskConfig
from rollwise.envs.base import StepResult
from rollwise.envs.semi_online import SemiOnlineEnv
from rollwise.tasks._common import sample_prompts
from rollwise.types import Prompt, ToolCall, Verdict

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


class ToolFailure(Exception):
    """Raised by a tool to end a call with ``outcome`` ("error", "timeout", "truncated") and ``message``."""

    def __init__(self, outcome: str, message: str):
        super().__init__(message)
        self.outcome, self.message = outcome, message


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: Mapping[str, Any]  # JSON schema of an object: {"type", "properties", "required"}
    fn: Callable[..., str]
    # A tool that enforces the time limit itself (a sandboxed tool) is told ``task.tool_timeout_s``
    # here before each call, and the runner waits for it; None: the runner joins its thread for that long.
    set_timeout: Callable[[float], None] | None = None

    @classmethod
    def from_function(
        cls, fn: Callable[..., str], name: str | None = None, set_timeout: Callable[[float], None] | None = None
    ) -> Tool:
        doc = inspect.getdoc(fn) or ""
        description = doc.split("\n\n")[0].replace("\n", " ").strip()
        arg_docs = dict(re.findall(r"^\s+(\w+)\s*(?:\([^)]*\))?:\s*(.+)$", doc.split("Args:", 1)[-1], re.M))
        hints = inspect.get_annotations(fn, eval_str=True)
        props, required = {}, []
        for p in inspect.signature(fn).parameters.values():
            prop = {"type": _JSON_TYPES.get(hints.get(p.name), "string")}
            if p.name in arg_docs and "Args:" in doc:
                prop["description"] = arg_docs[p.name].strip()
            props[p.name] = prop
            if p.default is inspect.Parameter.empty:
                required.append(p.name)
        params = {"type": "object", "properties": props, "required": required}
        return cls(name or fn.__name__, description, params, fn, set_timeout)

    def schema(self) -> dict:
        """The tool as ``apply_chat_template(tools=[...])`` takes it."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": dict(self.parameters)},
        }


# ---------------------------------------------------------------- formats


@dataclass(frozen=True)
class Call:
    """A call found in a turn: ``arguments`` is the tag's text or the JSON object; ``error`` a parse error."""

    name: str
    raw: str  # the arguments as the policy wrote them
    arguments: Any = None
    error: str | None = None


class TagFormat:
    name = "tag"

    def parse(self, text: str, tools: Mapping[str, Tool]) -> list[Call]:
        if not tools:
            return []
        names = "|".join(re.escape(n) for n in tools)
        calls = []
        for m in re.finditer(rf"<({names})>(?:(.*?)</\1>)?", text, re.S):
            if m.group(2) is None:
                calls.append(
                    Call(m.group(1), text[m.end() :], error=f"<{m.group(1)}> is not closed by </{m.group(1)}>")
                )
            else:
                calls.append(Call(m.group(1), m.group(2), m.group(2)))
        return calls

    def call(self, tool: Tool, text: str) -> str:
        """How the policy calls ``tool`` with ``text`` as its first argument (demonstrations)."""
        return f"<{tool.name}>{text}</{tool.name}>"

    def result(self, output: str) -> str:
        return f"<out>{output}</out>"


class JsonFormat:
    name = "json"

    def parse(self, text: str, tools: Mapping[str, Tool]) -> list[Call]:
        calls = []
        for m in re.finditer(r"<tool_call>(?:(.*?)</tool_call>)?", text, re.S):
            raw = m.group(1)
            if raw is None:
                calls.append(Call("", text[m.end() :], error="<tool_call> is not closed by </tool_call>"))
                continue
            try:
                obj = json.loads(raw)
            except ValueError as e:
                calls.append(Call("", raw, error=f"the call is not JSON ({e})"))
                continue
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                calls.append(Call("", raw, error='the call needs {"name": ..., "arguments": {...}}'))
            elif not isinstance(obj.get("arguments", {}), dict):
                calls.append(Call(obj["name"], raw, error="arguments must be a JSON object"))
            else:
                calls.append(Call(obj["name"], raw, obj.get("arguments", {})))
        return calls

    def call(self, tool: Tool, text: str) -> str:
        first = next(iter(tool.parameters["properties"]))
        return "<tool_call>" + json.dumps({"name": tool.name, "arguments": {first: text}}) + "</tool_call>"

    def result(self, output: str) -> str:
        return f"<tool_response>{output}</tool_response>"


FORMATS = {"tag": TagFormat(), "json": JsonFormat()}


class ToolOptions(BaseModel):
    """The options every tool task takes (its ``Options`` extend this). The per-episode call budget
    and the per-call time limit are the run's ``task.max_tool_calls`` / ``task.tool_timeout_s``, handed
    to each episode's environment by the episode pool (``ToolEnv.set_tool_limits``)."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["tag", "json"] = Field(
        "tag", description="call format: 'tag' (<calc>1+2</calc>, for the tiny model) or 'json' (<tool_call>{...})"
    )
    max_output_chars: int = Field(
        400, ge=1, le=1_000_000, description="characters of a tool's output shown; the rest is cut"
    )
    latency_s: float = Field(
        0.0,
        ge=0.0,
        le=60.0,
        description="seconds each tool call waits before it runs: a slow tool or environment, to measure the "
        "episode schedules against (task.env_slots; 0 = none). Counted in the call's seconds.",
    )
    latency_spread: Literal["fixed", "exponential"] = Field(
        "fixed",
        description="how latency_s is spent: 'fixed' (every call waits latency_s) or 'exponential' (each call "
        "waits an independent exponential draw of mean latency_s, capped at 10 x latency_s, not seeded: "
        "environments whose steps take unequal times, where a wave of episodes waits for its slowest).",
    )


# ---------------------------------------------------------------- running calls


_TASK_DEFAULTS = TaskConfig.model_fields  # the run's task.max_tool_calls / task.tool_timeout_s defaults


class ToolRunner:
    """Finds and runs the calls of one episode's turns, within the episode's budget."""

    def __init__(
        self,
        tools: Sequence[Tool],
        fmt: str = "tag",
        max_tool_calls: int = _TASK_DEFAULTS["max_tool_calls"].default,
        tool_timeout_s: float = _TASK_DEFAULTS["tool_timeout_s"].default,
        max_output_chars: int = 400,
        latency_s: float = 0.0,
        latency_spread: str = "fixed",
    ):
        self.tools = {t.name: t for t in tools}
        self.latency_s, self.latency_spread = latency_s, latency_spread
        self.rng = random.Random()  # the exponential latencies' draws: a simulated wait, not reproduced by a seed
        self.format = FORMATS[fmt]
        self.max_tool_calls, self.timeout, self.max_chars = max_tool_calls, tool_timeout_s, max_output_chars
        self.used = 0

    @classmethod
    def from_options(cls, tools: Sequence[Tool], options: ToolOptions) -> ToolRunner:
        o = options
        return cls(
            tools, o.format, max_output_chars=o.max_output_chars, latency_s=o.latency_s, latency_spread=o.latency_spread
        )

    def latency(self) -> float:
        """Seconds the next call waits (``ToolOptions.latency_s`` / ``latency_spread``)."""
        if self.latency_spread == "exponential" and self.latency_s:
            return min(self.rng.expovariate(1.0 / self.latency_s), 10 * self.latency_s)
        return self.latency_s

    def run(self, text: str) -> tuple[str, tuple[ToolCall, ...]] | None:
        """(observation, calls) for a turn with calls; None for a turn without one (the answer)."""
        calls = self.format.parse(text, self.tools)
        if not calls:
            return None
        done = [self._one(c) for c in calls]
        return "".join(self.format.result(out) for _, out in done), tuple(rec for rec, _ in done)

    def _one(self, call: Call) -> tuple[ToolCall, str]:
        t0 = time.perf_counter()
        if self.used >= self.max_tool_calls:
            outcome, out = "limit", f"tool call limit reached ({self.max_tool_calls}); give the answer"
        else:
            self.used += 1
            if call.error is not None:
                outcome, out = "parse_error", f"parse error: {call.error}"
            elif call.name not in self.tools:
                outcome, out = "unknown_tool", f"unknown tool {call.name!r}; tools: {', '.join(self.tools)}"
            else:
                if self.latency_s:  # ToolOptions.latency_s: a slow environment, simulated
                    time.sleep(self.latency())
                outcome, out = self._execute(self.tools[call.name], call.arguments)
        return ToolCall(call.name, call.raw, time.perf_counter() - t0, outcome), out

    def _execute(self, tool: Tool, arguments: Any) -> tuple[str, str]:
        box: dict[str, Any] = {}

        def target():
            try:
                box["out"] = tool.fn(**arguments) if isinstance(arguments, dict) else tool.fn(arguments)
            except BaseException as e:  # noqa: BLE001 - a tool's failure is the policy's observation
                box["err"] = e

        th = threading.Thread(target=target, daemon=True, name=f"rollwise-tool-{tool.name}")
        th.start()
        if tool.set_timeout is not None:
            tool.set_timeout(self.timeout)
        th.join(None if tool.set_timeout is not None else self.timeout)
        if th.is_alive():  # the thread cannot be killed; it runs on (see the module docstring)
            return "timeout", f"timeout: no result after {self.timeout:g}s"
        err = box.get("err")
        if isinstance(err, ToolFailure):
            return err.outcome, err.message
        if err is not None:
            return "error", f"{type(err).__name__}: {err}"[:500]
        out = str(box.get("out"))
        if len(out) > self.max_chars:
            return "truncated", out[: self.max_chars] + f"...[cut {len(out) - self.max_chars} chars]"
        return "ok", out


# ---------------------------------------------------------------- the environment


@dataclass
class ToolEnv:
    """One episode of a tool task: turns with calls get their outputs; the first turn without a call
    is the answer, judged by ``verify`` (see the module docstring)."""

    prompt: Prompt
    verify: Callable[[Prompt, str], Verdict]
    make_runner: Callable[[], ToolRunner]
    anchored: bool = True  # key each turn by the observations so far (module docstring, "Anchor")
    forkable: bool = False  # the task's FORKABLE: its tools keep no state of their own (envs/base.py, "Forking")
    runner: ToolRunner | None = field(default=None, init=False)
    told: str = field(default="", init=False)  # the observations of the episode so far

    def reset(self, seed: int) -> None:
        self.runner = self.make_runner()  # a fresh budget (and tool state) per episode
        self.told = ""

    def set_tool_limits(self, calls_left: int, timeout_s: float) -> None:
        """The episode pool's ``task.max_tool_calls`` (as the calls this episode has left) and
        ``task.tool_timeout_s``, before each step."""
        if self.runner is None:
            self.reset(0)
        self.runner.max_tool_calls, self.runner.timeout = self.runner.used + calls_left, timeout_s

    def fork(self) -> ToolEnv:
        """The same episode, stepped independently from here (``envs/base.py``, "Forking"): the calls
        used and the limits are copied; the tools are shared, which is right only for tools that keep no
        state (a task says so with ``FORKABLE = True``)."""
        if not self.forkable:
            raise TypeError(f"the environment of {self.prompt.id!r} is not forkable (its task's FORKABLE is False)")
        twin = ToolEnv(self.prompt, self.verify, self.make_runner, self.anchored, self.forkable)
        twin.runner, twin.told = copy.copy(self.runner), self.told
        return twin

    def step(self, action: str) -> StepResult:
        if self.runner is None:
            self.reset(0)
        anchor = self.told if self.anchored else None
        ran = self.runner.run(action)
        if ran is None:
            v = self.verify(self.prompt, action)
            return StepResult("", v.score, True, verdict=v, anchor=anchor)
        observation, calls = ran
        self.told += observation
        return StepResult(observation, 0.0, False, calls, anchor=anchor)


class ToolTask:
    """What the tool tasks share: the splits (``_train`` / ``_heldout``, set by the subclass), one
    ``ToolEnv`` per episode with fresh tools (``tools()``) and budget, and demonstrations built from
    ``demo(prompt)``: the (tool input, final answer) texts of a solution, or (tool inputs..., answer)."""

    name: str
    options: ToolOptions
    STATE_ANCHORS = True  # the tools' outputs are the environment's state (module docstring, "Anchor")
    FORKABLE = False  # True: the tools keep no state, so an episode forks by copying its ToolEnv (envs/base.py)
    _train: tuple[Prompt, ...] = ()
    _heldout: tuple[Prompt, ...] = ()

    def tools(self) -> list[Tool]:
        raise NotImplementedError

    def demo(self, prompt: Prompt) -> tuple[list[str], str]:
        """(the first argument of each tool call, the final answer) of a solution of ``prompt``."""
        raise NotImplementedError

    def train_prompts(self) -> Sequence[Prompt]:
        return self._train

    def heldout_prompts(self) -> Sequence[Prompt]:
        return self._heldout

    def tool_schemas(self) -> list[dict]:
        """The tools as ``apply_chat_template(tools=...)`` takes them (chat models, format 'json')."""
        return [t.schema() for t in self.tools()]

    def chat_tools(self) -> dict:
        """A prompt's metadata entry ``tools`` in format 'json' (``Codec.encode_prompt`` hands it to the
        chat template, or describes the tools in a system message when the template renders none); ``{}``
        in format 'tag'."""
        return {"tools": tuple(self.tool_schemas())} if self.options.format == "json" else {}

    def environment(self, prompt: Prompt) -> ToolEnv:
        return ToolEnv(
            prompt,
            self.verify,
            lambda: ToolRunner.from_options(self.tools(), self.options),
            self.STATE_ANCHORS,
            self.FORKABLE,
        )

    def demonstration(self, prompt: Prompt) -> tuple[tuple[str, str, str], ...]:
        """The expert trajectory of ``prompt``: ``(action, observation, role)`` for each tool call in the
        task's format with its true output (run here, so the observation is the one the environment
        gives), then ``(answer, "", "user")``. The warm start's demonstrations and UI-S1's replayed
        expert (``rollwise.envs.semi_online``) are both these."""
        env = self.environment(prompt)
        env.reset(0)
        env.runner.latency_s = 0.0  # the expert's outputs are computed here, not waited for (options.latency_s)
        inputs, answer = self.demo(prompt)
        tool, fmt = self.tools()[0], FORMATS[self.options.format]
        steps = []
        for a in (fmt.call(tool, x) for x in inputs):
            res = env.step(a)  # the pool's rule: a turn that called a tool is answered in a tool message
            steps.append((a, res.observation, "tool" if res.tool_calls else "user"))
        return (*steps, (answer, "", "user"))

    def replay_environment(self, prompt: Prompt, patch_budget: int) -> SemiOnlineEnv:
        """UI-S1's semi-online replay of :meth:`demonstration` (``task.semi_online``), for training episodes."""
        return SemiOnlineEnv(prompt, self.demonstration(prompt), self.verify, patch_budget)

    def episode_examples(self, n: int, seed: int) -> list[tuple[Prompt, tuple[tuple[str, str], ...]]]:
        """Demonstrations: :meth:`demonstration` of ``n`` train prompts drawn by ``seed``."""
        return [(p, self.demonstration(p)) for p in sample_prompts(self._train, n, seed)]
