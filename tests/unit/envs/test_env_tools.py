"""rollwise.envs.tools: schemas, both call formats, the runner's outcomes and budget, ToolEnv."""

import json
import time

import pytest

from rollwise.envs.tools import Tool, ToolEnv, ToolFailure, ToolRunner
from rollwise.types import Prompt, Verdict


def add(a: int, b: int = 0) -> str:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return str(a + b)


def echo(text: str) -> str:
    """Say it back."""
    return text


def boom(text: str) -> str:
    raise ValueError("no way")


def slow(text: str) -> str:
    time.sleep(5)
    return "late"


def fail(text: str) -> str:
    raise ToolFailure("timeout", "gave up")


TOOLS = [Tool.from_function(f) for f in (add, echo, boom, slow, fail)]


def runner(fmt="tag", **kw):
    return ToolRunner(TOOLS, fmt, **{"max_tool_calls": 10, "tool_timeout_s": 0.2, "max_output_chars": 8, **kw})


def test_schema_from_signature_and_docstring():
    s = Tool.from_function(add).schema()
    assert s == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "description": "the first"},
                    "b": {"type": "integer", "description": "the second"},
                },
                "required": ["a"],
            },
        },
    }
    assert Tool.from_function(echo).parameters["properties"] == {"text": {"type": "string"}}


def test_tag_format_runs_calls_in_order():
    obs, calls = runner().run("first <echo>hi</echo> then <echo>there</echo>")
    assert obs == "<out>hi</out><out>there</out>"
    assert [(c.name, c.arguments, c.outcome) for c in calls] == [("echo", "hi", "ok"), ("echo", "there", "ok")]


def test_tag_format_unknown_tag_is_text_and_unclosed_tag_is_a_parse_error():
    assert runner().run("<b>42</b>") is None  # no tool call: the turn is the answer
    obs, calls = runner().run("<echo>hi")
    assert calls[0].outcome == "parse_error" and "not closed" in obs


def test_json_format():
    r = runner("json")
    obs, calls = r.run('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>')
    assert obs == "<tool_response>5</tool_response>" and calls[0].outcome == "ok"
    assert json.loads(calls[0].arguments) == {"name": "add", "arguments": {"a": 2, "b": 3}}
    cases = {
        "<tool_call>{not json}</tool_call>": "parse_error",
        '<tool_call>{"arguments": {}}</tool_call>': "parse_error",
        '<tool_call>{"name": "add", "arguments": [1]}</tool_call>': "parse_error",
        '<tool_call>{"name": "add"': "parse_error",
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>': "unknown_tool",
        '<tool_call>{"name": "add", "arguments": {"c": 1}}</tool_call>': "error",  # bad arguments
    }
    for text, outcome in cases.items():
        obs, calls = r.run(text)
        assert calls[0].outcome == outcome, (text, obs)
    assert r.run("the answer is 5") is None


def test_errors_timeouts_truncation():
    obs, calls = runner().run("<boom>x</boom><slow>x</slow><echo>0123456789</echo><fail>x</fail>")
    assert [c.outcome for c in calls] == ["error", "timeout", "truncated", "timeout"]
    assert "<out>ValueError: no way</out>" in obs
    assert "<out>01234567...[cut 2 chars]</out>" in obs
    assert "<out>gave up</out>" in obs
    assert calls[1].seconds < 1.0  # the runner did not wait for the hung thread


def test_limit_counts_every_call_of_the_episode():
    r = runner(max_tool_calls=2)
    _, calls = r.run("<echo>a</echo><echo>b")  # the parse error counts too
    assert [c.outcome for c in calls] == ["ok", "parse_error"]
    obs, calls = r.run("<echo>c</echo>")
    assert calls[0].outcome == "limit" and "limit reached (2)" in obs


def test_tool_env_answer_turn_is_verified():
    prompt = Prompt("p", "t", "q", "5")
    verdicts = {"5": Verdict(1.0, "correct"), "?": Verdict(None, "could_not_verify"), "4": Verdict(0.0, "wrong")}
    env = ToolEnv(prompt, lambda p, text: verdicts[text], lambda: runner())
    env.reset(0)
    res = env.step("<echo>5</echo>")
    assert not res.done and res.reward == 0.0 and res.tool_calls[0].outcome == "ok"
    for text, score in (("5", 1.0), ("4", 0.0), ("?", None)):
        res = env.step(text)
        assert res.done and res.reward == score and res.verdict is verdicts[text]


def test_reset_gives_a_fresh_budget():
    env = ToolEnv(Prompt("p", "t", "q", "5"), lambda p, t: Verdict(1.0), lambda: runner(max_tool_calls=1))
    env.reset(0)
    assert env.step("<echo>a</echo>").tool_calls[0].outcome == "ok"
    assert env.step("<echo>a</echo>").tool_calls[0].outcome == "limit"
    env.reset(0)
    assert env.step("<echo>a</echo>").tool_calls[0].outcome == "ok"


@pytest.mark.parametrize("bad", ["<add>x</add>"])
def test_tag_text_to_an_int_tool_is_an_error(bad):
    _, calls = runner().run(bad)
    assert calls[0].outcome == "error"  # str + int


def test_the_pools_limits_reach_the_tool_env():
    """``task.max_tool_calls`` / ``task.tool_timeout_s`` arrive through ``set_tool_limits`` before each step:
    one call left, then the next call is not run; a 0.05 s limit times out the slow tool."""
    env = ToolEnv(Prompt("p", "t", "q", "5"), lambda p, t: Verdict(1.0), lambda: runner(max_tool_calls=10))
    env.reset(0)
    env.set_tool_limits(1, 0.05)
    assert [c.outcome for c in env.step("<slow>x</slow>").tool_calls] == ["timeout"]
    env.set_tool_limits(0, 0.05)  # the pool counted the call above
    assert [c.outcome for c in env.step("<echo>hi</echo>").tool_calls] == ["limit"]
