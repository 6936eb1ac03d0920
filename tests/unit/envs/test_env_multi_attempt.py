"""multi_attempt: reward 1 if any of max_attempts answers is correct (R3L's math episode)."""

import pytest

from rollwise.envs.multi_attempt import make
from rollwise.registry import UserError
from rollwise.types import Prompt, Verdict


def task(**kw):
    return make(None, {"inner": "arithmetic", "inner_options": {"n_train": 50, "n_heldout": 10}, **kw})


def run(t, p, answers):
    env = t.environment(p)
    env.reset(0)
    return [env.step(a) for a in answers]


def test_rewards_by_hand():
    t = task(max_attempts=3)
    p = t.train_prompts()[0]
    right, wrong = p.answer, str(int(p.answer) + 1)
    # wrong, wrong, right: turn rewards 0, 0, 1 -> episode reward 1
    res = run(t, p, [wrong, wrong, right])
    assert [r.reward for r in res] == [0.0, 0.0, 1.0] and [r.done for r in res] == [False, False, True]
    assert res[0].observation == f"wrong, try again\n{p.text}"
    assert res[-1].verdict.score == 1.0 and res[-1].verdict.details["attempts"] == 3
    # right first: one turn, reward 1
    assert [(r.reward, r.done) for r in run(t, p, [right])] == [(1.0, True)]
    # three wrong: 0 + 0 + 0, ended by the budget
    res = run(t, p, [wrong, "x", wrong])
    assert [r.reward for r in res] == [0.0, 0.0, 0.0] and res[-1].done and res[-1].verdict.score == 0.0


def test_could_not_verify_ends_with_none():
    t = task()
    p = Prompt("q", "multi_attempt", "1+1=", "not a number")  # a bad reference: the inner verifier cannot judge
    (res,) = run(t, p, ["2"])
    assert res.done and res.reward is None and res.verdict.score is None


def test_options_feedback_and_splits():
    t = task(feedback="no", repeat_prompt=False, max_attempts=2)
    p = t.heldout_prompts()[0]
    assert run(t, p, ["-1"])[0].observation == "no"
    assert p.task == "multi_attempt"
    assert not {x.id for x in t.train_prompts()} & {x.id for x in t.heldout_prompts()}
    assert t.verify(p, p.answer) == Verdict(1.0, "correct", {"answer": p.answer})


def test_demonstrations_replay_to_reward_1():
    t = task()
    for p, pairs in t.episode_examples(5, seed=0):
        (res,) = run(t, p, [a for a, _ in pairs])
        assert res.done and res.reward == 1.0 and pairs[-1][1] == ""


@pytest.mark.parametrize(
    "opts,key",
    [
        ({"inner": "nope"}, "nope"),
        ({"inner": "multi_attempt"}, "inner"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"inner_options": {"bogus": 1}}, "bogus"),
        ({"inner": "calculator"}, "environment task"),
    ],
)
def test_bad_options_name_the_key(opts, key):
    with pytest.raises(UserError, match=key):
        make(None, opts)


def test_anchor_is_the_number_of_wrong_answers():
    """Every wrong answer gets the same feedback: the state is how many there were, whatever they said."""
    t = task(max_attempts=3)
    p = t.train_prompts()[0]
    right, wrong = p.answer, str(int(p.answer) + 1)
    assert [r.anchor for r in run(t, p, [wrong, "x", right])] == ["0 wrong", "1 wrong", "2 wrong"]
    assert [r.anchor for r in run(t, p, ["y", right])] == ["0 wrong", "1 wrong"]
