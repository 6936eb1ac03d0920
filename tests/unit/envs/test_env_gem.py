"""gem:<env_id> (rollwise.envs.gem_env): an episode of a GEM game in the episode pool with a scripted policy (masks,
rewards, verdicts, turn limits), splits and seeding. Skipped where gem-llm is not installed (it is not in the test
extra: it pins reasoning-gym and nltk); run with gem-llm installed apart and on PYTHONPATH."""

import random

import pytest

pytest.importorskip("gem")

from rollwise.backends.scripted import ScriptedBackend  # noqa: E402
from rollwise.envs.gem_env import make  # noqa: E402
from rollwise.generate.episodes import EpisodeLimits, EpisodePool  # noqa: E402
from rollwise.registry import UserError  # noqa: E402
from rollwise.tokens import Codec  # noqa: E402
from rollwise.trainer.tiny import char_tokenizer  # noqa: E402
from rollwise.types import Plan, Request, Sampling  # noqa: E402

TOK = char_tokenizer()
EOS = TOK.eos_token_id
GAME = "game:GuessTheNumber-v0-easy"  # 1..10, 4 turns


@pytest.fixture(scope="module")
def t():
    return make(GAME, {"n_train": 4, "n_heldout": 3, "instructions": "guess 1-10:"})


def secret(task, prompt) -> int:
    env = task.environment(prompt)
    env.reset(prompt.metadata["seed"])
    return env.env.game_number


def box(n) -> str:
    return "\\boxed{" + str(n) + "}"


def episode(task, prompt, actions, max_turns=8):
    backend = ScriptedBackend(lambda seq, i: TOK.encode(actions[list(seq).count(EOS)]), EOS)
    pool = EpisodePool(backend, Codec(TOK, use_chat=False), task, Sampling(max_new_tokens=12), EpisodeLimits(max_turns))
    try:
        [(_, r)] = pool.rollouts(Plan((Request(prompt, 1),)), version=0)
    finally:
        pool.close()
    return r


def test_an_episode_runs_to_the_games_end_with_masks_and_rewards(t):
    p = t.train_prompts()[0]
    s = secret(t, p)
    miss = 1 if s != 1 else 2
    r = episode(t, p, [box(miss), box(s)])
    ep = r.episode
    assert ep.end == "done" and r.finish == "stop" and len(ep.turns) == 2
    assert [turn.reward for turn in ep.turns] == [0.0, 1.0]
    assert r.verdict.score == 1.0 and r.verdict.reason == "success"
    for turn in ep.turns:
        assert set(r.loss_mask[turn.start : turn.end]) == {1} and set(r.loss_mask[turn.end : turn.obs_end]) <= {0}
    assert r.text.startswith(f"{box(miss)}At turn 1, you guessed {miss}")  # the character tokenizer has no newline
    assert ep.turns[-1].obs_end == ep.turns[-1].end
    assert ep.turns[0].anchor == "guess 1-10:" and ep.turns[1].anchor.startswith(f"guess 1-10:\n{box(miss)}\nAt turn 1")


def test_turn_limits_and_format_errors(t):
    p = t.train_prompts()[1]
    s = secret(t, p)
    misses = [box(g) for g in range(1, 11) if g != s]
    r = episode(t, p, misses, max_turns=2)  # cut by rollwise before the game decides
    assert r.episode.end == "max_turns" and len(r.episode.turns) == 2 and r.verdict.score == 0.0
    r = episode(t, p, misses)  # GEM's own limit (4 turns): its partial credit
    assert r.episode.end == "done" and len(r.episode.turns) == 4
    assert r.verdict.reason == "truncated" and 0.0 < r.verdict.score < 1.0
    r = episode(t, p, ["no guess"])  # GEM ends the game on a format error with its penalty
    assert len(r.episode.turns) == 1 and r.verdict.score == pytest.approx(-0.1) and r.verdict.reason == "failure"


def test_truncated_without_termination_could_not_be_verified():
    from rollwise.envs.gem_env import GemEnv

    class Stub:
        def reset(self, seed):
            return "start", {}

        def step(self, action):
            return "time is up", 0.0, False, True, {}

    env = GemEnv(Stub())
    env.reset(0)
    res = env.step("x")
    assert res.done and res.verdict.score is None and res.verdict.reason == "truncated"


def test_splits_seeds_and_the_global_random_state(t):
    train = {p.metadata["seed"] for p in t.train_prompts()}
    held = {p.metadata["seed"] for p in t.heldout_prompts()}
    assert len(train) == 4 and len(held) == 3 and not train & held
    random.seed(5)
    state = random.getstate()
    p = t.heldout_prompts()[0]
    assert len({secret(t, p) for _ in range(3)}) == 1
    assert random.getstate() == state  # GEM seeds the global random: each environment keeps its own
    assert t.verify(p, box(secret(t, p))).score == 1.0 and t.verify(p, "nothing").score is None


def test_unknown_ids_are_refused_at_load():
    with pytest.raises(UserError, match="gem:game:NoSuchGame-v0.*cannot make it"):
        make("game:NoSuchGame-v0")
    assert make(None, {"n_train": 1, "n_heldout": 1}).name == f"gem:{GAME}"
