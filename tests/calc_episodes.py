"""Scripted calculator episodes for the episode-pool tests (tests/unit/generate/test_cleaner.py,
tests/unit/envs/test_env_semi_online.py): one prompt of the calculator task, whose expert trajectory
is ``<calc>12+3</calc>`` -> ``<out>15</out>``, then ``15``; a scripted policy that says ``turns[i]``
at its i-th turn (character tokens, so a test reads every position by hand); and one episode of it
through the episode pool with the limits a test chooses."""

from __future__ import annotations

from rollwise.backends.scripted import ScriptedBackend
from rollwise.envs import calculator
from rollwise.generate.episodes import EpisodeLimits, EpisodePool
from rollwise.tokens import Codec
from rollwise.trainer.tiny import char_tokenizer
from rollwise.types import Plan, Request, Sampling

TOK = char_tokenizer()
CODEC = Codec(TOK, use_chat=False)
TASK = calculator.make(None, {"n_train": 4, "n_heldout": 2})
PROMPT = TASK._prompt("12+3")  # expert: <calc>12+3</calc> -> <out>15</out>, then 15


def says(turns):
    """A ``ScriptedBackend`` policy: call i answers ``turns[i]`` (one call per turn; an episode that
    asks for more turns than the script has fails the test with an IndexError)."""
    return lambda seq, i: TOK.encode(turns[i])


def play(backend, charge: bool = True, **limits):
    """One episode of ``PROMPT`` by ``backend`` in the episode pool (at most 4 turns, 200 tokens, 40
    new tokens a turn; ``limits``: further ``EpisodeLimits`` fields). ``charge=False``: an evaluation
    rollout. Returns the rollout and the pool's cost of the call."""
    pool = EpisodePool(
        backend, CODEC, TASK, Sampling(max_new_tokens=40), EpisodeLimits(max_turns=4, max_episode_tokens=200, **limits)
    )
    try:
        ((_, r),) = pool.rollouts(Plan((Request(PROMPT, 1),)), 0, charge=charge)
    finally:
        pool.close()
    return r, pool.take_cost()


def turn_texts(r) -> list[tuple[str, str]]:
    """(action, observation) of each turn of an episode rollout, decoded."""
    ids = r.completion_ids
    return [(CODEC.decode(ids[t.start : t.end]), CODEC.decode(ids[t.end : t.obs_end])) for t in r.episode.turns]


def scripted(turns) -> ScriptedBackend:
    """The scripted policy of ``turns`` (``says``)."""
    return ScriptedBackend(says(turns), TOK.eos_token_id)
