"""frozenlake and gym:<env_id>: step logic, rewards, demonstrations, splits, the missing-gymnasium error."""

import sys

import pytest

pytest.importorskip("gymnasium")

from rollwise.envs.text_gym import make_frozenlake, make_gym, shortest_path  # noqa: E402
from rollwise.registry import UserError  # noqa: E402
from rollwise.types import Prompt  # noqa: E402

MAP = ("SFFF", "FHFH", "FFFH", "HFFG")  # gymnasium's classic 4x4


@pytest.fixture(scope="module")
def t():
    return make_frozenlake(None, {"n_train": 30, "n_heldout": 10})


def classic(t):
    p = Prompt("frozenlake/classic", "frozenlake", "", None, metadata={"map": MAP, "seed": 0})
    env = t.environment(p)
    env.reset(0)
    return p, env


def test_steps_rewards_and_boards(t):
    _, env = classic(t)
    assert env.board == "PFFF\nFHFH\nFFFH\nHFFG"
    res = env.step("R")
    assert (res.observation, res.reward, res.done, res.anchor) == (
        "SPFF\nFHFH\nFFFH\nHFFG\n",
        0.0,
        False,
        env.board.replace("SPFF", "PFFF"),
    )
    res = env.step("down")  # into the hole at (1, 1): reward 0, done
    assert (res.reward, res.done, res.verdict.score, res.verdict.reason) == (0.0, True, 0.0, "failure")


def test_invalid_action_keeps_the_state(t):
    _, env = classic(t)
    res = env.step("jump")
    assert not res.done and res.reward == 0.0 and "choose one of" in res.observation
    assert env.board == "PFFF\nFHFH\nFFFH\nHFFG"


def test_goal_gives_1_and_verify_replays(t):
    p, env = classic(t)
    path = shortest_path(MAP)
    assert len(path) == 6
    rewards = [env.step(a).reward for a in path]
    assert rewards == [0.0] * 5 + [1.0]  # the sum is the episode's reward: 1
    assert t.verify(p, " ".join(path)).score == 1.0
    assert t.verify(p, "R D").score == 0.0  # the hole
    assert t.verify(p, "L").reason == "not_done"


def test_demonstrations_replay_to_reward_1(t):
    for p, pairs in t.episode_examples(6, seed=0):
        env = t.environment(p)
        env.reset(p.metadata.get("seed", 0))
        for action, observation in pairs:
            res = env.step(action)
            assert res.observation == observation
        assert res.done and res.reward == 1.0 and pairs[-1][1] == ""


def test_splits_disjoint_by_map(t):
    train = {p.metadata["map"] for p in t.train_prompts()}
    held = {p.metadata["map"] for p in t.heldout_prompts()}
    assert len(train) == 30 and len(held) == 10 and not train & held
    assert all(p.text.startswith("FrozenLake") and "P" in p.text for p in t.train_prompts())


def test_slippery_is_an_option(t):
    s = make_frozenlake(None, {"n_train": 5, "n_heldout": 2, "is_slippery": True})
    p = s.train_prompts()[0]
    results = set()
    for _ in range(2):  # the same seed, the same slips
        env = s.environment(p)
        env.reset(7)
        results.add(tuple(env.step(a).observation for a in "RRRR"))
    assert len(results) == 1


def test_generic_gym_adapter():
    g = make_gym(
        "FrozenLake-v1",
        {
            "n_train": 3,
            "n_heldout": 2,
            "actions": ["left", "down", "right", "up"],
            "env_kwargs": {"is_slippery": False},
            "highlight": "P",
        },
    )
    assert g.name == "gym:FrozenLake-v1" and g.episode_examples(2, 0) == []
    assert not {p.id for p in g.train_prompts()} & {p.id for p in g.heldout_prompts()}
    env = g.environment(g.train_prompts()[0])
    env.reset(0)
    assert env.step("2").observation == env.board + "\n" and env.board.startswith("SP")  # 2 = right
    assert env.step("Down").anchor.startswith("SP")


@pytest.mark.parametrize("opts,key", [({"size": 2}, "size"), ({"bogus": 1}, "bogus"), ({"p_frozen": 0}, "p_frozen")])
def test_bad_options_name_the_key(opts, key):
    with pytest.raises(UserError, match=key):
        make_frozenlake(None, opts)


def test_gym_errors_are_clear(monkeypatch):
    with pytest.raises(UserError, match="gym:<env_id>"):
        make_gym(None)
    with pytest.raises(UserError, match="Discrete"):
        make_gym("MountainCarContinuous-v0")
    monkeypatch.setitem(sys.modules, "gymnasium", None)
    for build in (lambda: make_gym("FrozenLake-v1"), lambda: make_frozenlake(None)):
        with pytest.raises(UserError, match="pip install gymnasium"):
            build()
