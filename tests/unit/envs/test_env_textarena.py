"""textarena:<env_id> (rollwise.envs.textarena_env): an episode of a single-player game in the episode pool with a
scripted policy (masks, rewards, verdicts, turn limits), splits, seeding, and the refusal of multi-player games."""

import random

import pytest

pytest.importorskip("textarena")

from rollwise.backends.scripted import ScriptedBackend  # noqa: E402
from rollwise.envs.textarena_env import make  # noqa: E402
from rollwise.generate.episodes import EpisodeLimits, EpisodePool  # noqa: E402
from rollwise.registry import UserError  # noqa: E402
from rollwise.tokens import Codec  # noqa: E402
from rollwise.trainer.tiny import char_tokenizer  # noqa: E402
from rollwise.types import Plan, Request, Sampling  # noqa: E402

TOK = char_tokenizer()
EOS = TOK.eos_token_id
GAME = "GuessTheNumber-v0"


@pytest.fixture(scope="module")
def t():
    return make(GAME, {"n_train": 4, "n_heldout": 3, "instructions": "guess 1-20:"})


def secret(task, prompt) -> int:
    env = task.environment(prompt)
    env.reset(prompt.metadata["seed"])
    return env.env.game_number


def episode(task, prompt, actions, max_turns=8):
    """One episode of ``prompt`` whose policy writes ``actions[k]`` on turn k (then EOS)."""
    backend = ScriptedBackend(lambda seq, i: TOK.encode(actions[list(seq).count(EOS)]), EOS)
    pool = EpisodePool(backend, Codec(TOK, use_chat=False), task, Sampling(max_new_tokens=8), EpisodeLimits(max_turns))
    try:
        [(_, r)] = pool.rollouts(Plan((Request(prompt, 1),)), version=0)
    finally:
        pool.close()
    return r


def wrong(s: int) -> str:
    return str(1 if s != 1 else 2)


def test_an_episode_runs_to_the_games_end_with_masks_and_rewards(t):
    p = t.train_prompts()[0]
    s = secret(t, p)
    r = episode(t, p, [wrong(s), "x", str(s)])  # a miss, an invalid move (TextArena lets one pass), the secret
    ep = r.episode
    assert ep.end == "done" and r.finish == "stop" and len(ep.turns) == 3
    assert [turn.reward for turn in ep.turns] == [0.0, 0.0, 1.0]
    assert r.verdict.score == 1.0 and r.verdict.reason == "success" and "Congratulations" in r.verdict.details["reason"]
    for turn in ep.turns:  # policy ids learn (mask 1), observation ids do not (mask 0)
        assert set(r.loss_mask[turn.start : turn.end]) == {1} and set(r.loss_mask[turn.end : turn.obs_end]) <= {0}
    hint = "lower" if int(wrong(s)) > s else "higher"
    # the character tokenizer has no newline: the observations' line breaks do not reach the text
    assert r.text.startswith(f"{wrong(s)}The target number is {hint}.xYou attempted an invalid move.")
    assert ep.turns[-1].obs_end == ep.turns[-1].end  # the last turn has no observation
    # anchors: the text each action was taken on (the first observation, then the history since)
    assert ep.turns[0].anchor == "guess 1-20:" and ep.turns[1].anchor.startswith(f"guess 1-20:\n{wrong(s)}\nThe target")


def test_task_max_turns_ends_the_episode_and_the_games_own_limit_gives_its_verdict(t):
    p = t.train_prompts()[1]
    s = secret(t, p)
    misses = [str(g) for g in range(1, 21) if g != s][:5]
    r = episode(t, p, misses, max_turns=2)  # cut by rollwise before the game decides
    assert r.episode.end == "max_turns" and len(r.episode.turns) == 2 and r.verdict.score == 0.0
    short = make(GAME, {"n_train": 2, "n_heldout": 1, "instructions": "guess:", "env_kwargs": {"max_turns": 2}})
    p = short.train_prompts()[0]
    s = secret(short, p)
    misses = [str(g) for g in range(1, 21) if g != s][:5]
    r = episode(short, p, misses)  # the game's own turn limit: TextArena's partial credit, not a success
    assert r.episode.end == "done" and len(r.episode.turns) == 3  # TextArena ends it after max_turns + 1 guesses
    assert r.verdict.reason == "failure" and 0.0 < r.verdict.score < 1.0
    assert r.episode.turns[-1].reward == r.verdict.score


def test_a_game_that_ends_without_a_reward_is_not_scored_zero(t):
    p = t.train_prompts()[0]
    env = t.environment(p)
    env.reset(p.metadata["seed"])
    env.env.state.set_outcome = lambda reward, reason=None: setattr(env.env.state, "done", True)  # no reward
    res = env.step(str(secret(t, p)))
    assert res.done and res.reward is None and res.verdict.score is None and res.verdict.reason == "no_outcome"


def test_splits_are_disjoint_seeds_and_an_episode_is_a_function_of_its_seed(t):
    train = {p.metadata["seed"] for p in t.train_prompts()}
    held = {p.metadata["seed"] for p in t.heldout_prompts()}
    assert len(train) == 4 and len(held) == 3 and not train & held
    assert all(
        p.id == f"textarena:{GAME}/{p.metadata['seed']}" and p.text == "guess 1-20:\n" for p in t.train_prompts()
    )
    random.seed(123)
    state = random.getstate()
    p = t.heldout_prompts()[0]
    a, b = t.environment(p), t.environment(p)
    a.reset(p.metadata["seed"])
    b.reset(p.metadata["seed"] + 1)
    a.step("7")
    assert random.getstate() == state  # TextArena seeds the global random: each environment keeps its own
    assert len({secret(t, p) for _ in range(3)}) == 1


def test_verify_replays_bracketed_actions(t):
    p = t.heldout_prompts()[1]
    s = secret(t, p)
    assert t.verify(p, f"first [{wrong(s)}] then [{s}]").score == 1.0
    assert t.verify(p, f"[{wrong(s)}]").score is None  # not decided: could not verify, never 0


def test_multi_player_and_unknown_games_are_refused_at_load():
    for game in ("TicTacToe-v0", "PublicGoodsGame-v0"):  # one asserts 2 players, one accepts 1 but is free-for-all
        with pytest.raises(UserError, match=f"textarena:{game}'.*multi-player.*single-player"):
            make(game, {"n_train": 1, "n_heldout": 1})
    with pytest.raises(UserError, match="textarena:NoSuchGame-v0.*cannot make it"):
        make("NoSuchGame-v0")
    with pytest.raises(UserError, match="n_train"):
        make(GAME, {"n_train": 0})
    assert make(None, {"n_train": 1, "n_heldout": 1}).name == f"textarena:{GAME}"
