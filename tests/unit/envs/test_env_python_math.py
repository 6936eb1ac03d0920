"""python_math: cells in the code sandbox, state between cells, hostile cells contained."""

import pytest

from rollwise.envs.python_math import _P, KINDS, make
from rollwise.registry import UserError


@pytest.fixture(scope="module")
def t():
    return make(None, {"n_train": 30, "n_heldout": 6, "max_output_chars": 50})


def episode(t, i=0):
    env = t.environment(t.train_prompts()[i])
    env.reset(0)
    env.set_tool_limits(20, 3.0)  # what the episode pool hands over: task.max_tool_calls, task.tool_timeout_s
    return env


def test_state_is_kept_between_cells_and_only_the_new_output_shown(t):
    env = episode(t)
    assert env.step("<python>print('first')\nx = 20</python>").observation == "<out>first\n</out>"
    res = env.step("<python>def f(y):\n    return x + y\nf(22)</python>")
    assert res.observation == "<out>42\n</out>"  # a last bare expression shows its value
    res = env.step("<python>1/0</python>")  # fails: not kept
    assert res.tool_calls[0].outcome == "error" and "ZeroDivisionError" in res.observation
    res = env.step("<python>print(f(x))</python>")
    assert res.observation == "<out>40\n</out>" and res.tool_calls[0].outcome == "ok"


def test_answer_turn_reads_the_last_integer(t):
    p = t.train_prompts()[0]
    env = episode(t)
    assert env.step(f"The answer is {p.answer}").reward == 1.0
    env = episode(t)
    res = env.step(f"The answer is {int(p.answer) + 1}")
    assert (res.reward, res.done) == (0.0, True)


def test_demonstrations_replay_to_reward_1(t):
    seen = set()
    for p, pairs in t.episode_examples(24, seed=0):  # written without the sandbox: every observation checked here
        env = t.environment(p)
        env.reset(0)
        for action, observation, *_ in pairs:
            res = env.step(action)
            assert res.observation == observation
        assert res.done and res.reward == 1.0
        seen.add(len(pairs))
    assert 3 in seen  # some demonstrations use two cells (state carried over)


def test_reference_answers_match_the_demonstration_code():
    for kind, (draw, _, answer, cells) in _P.items():
        import random

        params = draw(random.Random(1))
        ns = {}
        import contextlib
        import io

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            for c in cells:
                exec(c.format(**params), ns)
        assert buf.getvalue().strip() == str(answer(**params)), kind


def test_hostile_cells_are_contained(t, tmp_path):
    secret = tmp_path / "answer.txt"
    p = t.train_prompts()[0]
    secret.write_text(p.answer)
    env = episode(t)
    res = env.step("<python>while True:\n    pass</python>")
    assert res.tool_calls[0].outcome == "timeout" and res.tool_calls[0].seconds < 10
    res = env.step("<python>print('x' * 10_000_000)</python>")
    assert res.tool_calls[0].outcome == "truncated" and len(res.observation) < 200
    res = env.step("<python>import os, sys\nos.write(1, b'y' * 10_000_000)</python>")  # past the captured stdout
    assert res.tool_calls[0].outcome in ("truncated", "error") and len(res.observation) < 600
    for code in (f"print(open({str(secret)!r}).read())", "print(open('/etc/passwd').read())"):
        res = env.step(f"<python>{code}</python>")
        assert res.tool_calls[0].outcome == "error", res.observation
        assert "Error" in res.observation
    res = env.step("<python>import os\nprint(os.listdir('.'), [k for k in os.environ if 'ANSWER' in k])</python>")
    assert res.observation == "<out>[] []\n</out>"  # an empty working directory, nothing of the task


def test_splits_disjoint(t):
    train, held = {p.id for p in t.train_prompts()}, {p.id for p in t.heldout_prompts()}
    assert len(train) == 30 and len(held) == 6 and not train & held
    assert {p.metadata["kind"] for p in t.train_prompts()} <= set(KINDS)


@pytest.mark.parametrize(
    "opts,key",
    [
        ({"kinds": ["calculus"]}, "kinds"),
        ({"sandbox": {"wall_s": 9}}, "tool_timeout_s"),
        ({"tool_timeout_s": 3}, "tool_timeout_s"),  # the run's task.tool_timeout_s, not a task option
    ],
)
def test_bad_options_name_the_key(opts, key):
    with pytest.raises(UserError, match=key):
        make(None, opts)


def test_rlimit_isolation_contains_a_read_outside(tmp_path):
    secret = tmp_path / "answer.txt"
    secret.write_text("12345")
    t = make(None, {"n_train": 2, "n_heldout": 1, "sandbox": {"isolation": "rlimit"}})
    env = episode(t)
    res = env.step(f"<python>print(open({str(secret)!r}).read())</python>")
    assert res.tool_calls[0].outcome == "error" and "12345" not in res.observation
    assert (
        env.step("<python>x = 2\n</python><python>print(x * 21)</python>").observation == "<out></out><out>42\n</out>"
    )


def test_gigpo_is_refused_at_load_and_turns_carry_no_anchor(t):
    """The interpreter's namespace is the state and no key shows it (``x = 5`` and ``y = 3`` both print
    nothing): no anchor, and gigpo, which would silently be episode-level GRPO, is refused naming both
    keys; the calculator, whose outputs are its state, loads with gigpo."""
    from rollwise.config import load_config

    with pytest.raises(UserError, match=r"advantage\.name = 'gigpo'.*task\.name = 'python_math'"):
        load_config(None, ["task.name=python_math", "advantage.name=gigpo"])
    assert load_config(None, ["task.name=calculator", "advantage.name=gigpo"]).advantage.name == "gigpo"
    env = t.environment(t.train_prompts()[0])
    env.reset(0)
    assert env.step("the answer is 3").anchor is None
