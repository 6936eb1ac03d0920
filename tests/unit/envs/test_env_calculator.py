"""calculator: the safe calc tool, rewards, demonstrations, splits, options."""

import json

import pytest

from rollwise.envs.calculator import calc, make
from rollwise.registry import UserError


def task(**kw):
    return make(None, {"n_train": 40, "n_heldout": 10, **kw})


def test_calc_parses_and_never_evals():
    assert calc("1234567+890123") == "2124690"
    assert calc(" (12-20)*3 ") == "-24"
    for bad in ("__import__('os')", "2**10", "1/2", "1.5+1", "True+1", "x+1", "9" * 300):
        with pytest.raises(ValueError):
            calc(bad)


def test_episode_by_hand():
    t = task()
    p = t.train_prompts()[0]
    a, op, b = p.metadata["expr"].partition("+") if "+" in p.metadata["expr"] else p.metadata["expr"].partition("-")
    want = int(a) + int(b) if op == "+" else int(a) - int(b)
    env = t.environment(p)
    env.reset(0)
    r1 = env.step(f"<calc>{p.metadata['expr']}</calc>")
    assert (r1.observation, r1.reward, r1.done) == (f"<out>{want}</out>", 0.0, False)
    r2 = env.step(str(want + 1))  # wrong answer: reward 0, done
    assert (r2.reward, r2.done, r2.verdict.reason) == (0.0, True, "wrong")
    env.reset(0)
    assert env.step(str(want)).reward == 1.0  # answering without the tool is allowed


@pytest.mark.parametrize("fmt", ["tag", "json"])
def test_demonstrations_replay_to_reward_1(fmt):
    t = task(format=fmt)
    for p, pairs in t.episode_examples(5, seed=1):
        env = t.environment(p)
        env.reset(p.metadata.get("seed", 0))
        for action, observation, *_ in pairs:
            res = env.step(action)
            assert res.observation == observation
        assert res.done and res.reward == 1.0
        assert len(pairs) == 2 and pairs[-1][1] == ""
    if fmt == "json":
        call = json.loads(pairs[0][0].removeprefix("<tool_call>").removesuffix("</tool_call>"))
        assert call == {"name": "calc", "arguments": {"expression": p.metadata["expr"]}}
        assert p.messages and "calc" in p.messages[-1]["content"]


def test_splits_disjoint_and_sized():
    t = task(digits=[5], ops=["-"])
    train, held = {p.id for p in t.train_prompts()}, {p.id for p in t.heldout_prompts()}
    assert len(train) == 40 and len(held) == 10 and not train & held
    for p in t.train_prompts():
        a, b = p.metadata["expr"].split("-")
        assert len(a) == len(b) == 5 and int(a) >= int(b)
    assert [p.id for p in task().heldout_prompts()] == [p.id for p in task(n_train=7).heldout_prompts()]


@pytest.mark.parametrize(
    "opts,key",
    [
        ({"digits": [30]}, "digits"),
        ({"ops": ["/"]}, "ops"),
        ({"max_tool_calls": -1}, "max_tool_calls"),
        ({"bogus": 1}, "bogus"),
        ({"format": "xml"}, "format"),
    ],
)
def test_bad_options_name_the_key(opts, key):
    with pytest.raises(UserError, match=key):
        make(None, opts)


def test_anchor_is_what_the_tool_answered_so_far():
    """GiGPO's state of a calculator episode: the outputs so far. 1234+5678 and 5678+1234 are two
    calls but one answer, so the turns after them act in one state; a call answered differently
    (1234-5678) leads elsewhere. Every episode's first turn acts in the same (empty) state."""
    t = task()
    p = t.train_prompts()[0]

    def anchors(actions):
        env = t.environment(p)
        env.reset(0)
        return [env.step(a).anchor for a in actions]

    a = anchors(["<calc>1234+5678</calc>", "6912"])
    b = anchors(["<calc>5678+1234</calc>", "6913"])
    c = anchors(["<calc>1234-5678</calc>", "6912"])
    assert a[0] == b[0] == c[0] == ""
    assert a[1] == b[1] == "<out>6912</out>" and c[1] == "<out>-4444</out>"
    assert anchors(["<calc>1+1</calc>", "<calc>2*1</calc>", "2"])[2] == "<out>2</out><out>2</out>"


def test_latency_option_delays_each_tool_call_and_leaves_the_demonstration_alone():
    """options.latency_s (a slow environment, for the episode schedules, rollwise.generate.rollout_wise): a
    tool call waits at least that long and counts it in its seconds; the demonstration (warm start, UI-S1's
    replay) is the same as without it."""
    slow, fast = task(latency_s=0.05), task()
    p = slow.train_prompts()[0]
    env = slow.environment(p)
    env.reset(0)
    r = env.step(f"<calc>{p.metadata['expr']}</calc>")
    assert r.tool_calls[0].outcome == "ok" and r.tool_calls[0].seconds >= 0.05
    assert slow.demonstration(p) == fast.demonstration(p)


def test_exponential_latency_spreads_the_waits_around_their_mean():
    """options.latency_spread = 'exponential': each call waits an exponential draw of mean latency_s, capped at
    10 x latency_s (drawn here without sleeping: the runner's latency() is what a call sleeps)."""
    runner = task(latency_s=0.2, latency_spread="exponential").environment(task().train_prompts()[0])
    runner.reset(0)
    waits = [runner.runner.latency() for _ in range(4000)]
    assert 0.18 < sum(waits) / len(waits) < 0.22 and max(waits) <= 2.0 and min(waits) < 0.02
    assert len(set(waits)) == len(waits)  # spread, not one value
    fixed = task(latency_s=0.2).environment(task().train_prompts()[0])
    fixed.reset(0)
    assert {fixed.runner.latency() for _ in range(10)} == {0.2}
