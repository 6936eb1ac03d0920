"""guess_number (rollwise.envs.guess): splits, the environment's answers, transcript verification,
demonstrations and the warm start on them (observations out of the loss)."""

import pytest
import torch

from rollwise.envs.base import makes_environments
from rollwise.envs.guess import make
from rollwise.registry import UserError, record
from rollwise.tasks import REGISTRY


def test_registered_splits_disjoint_and_fixed_by_seed():
    task = REGISTRY.get("guess_number")(None, {"n_train": 50, "n_heldout": 10})
    assert makes_environments(task) and record(REGISTRY.get("guess_number")).episodes
    train, held = task.train_prompts(), task.heldout_prompts()
    assert len(train) == 50 and len(held) == 10
    assert not {p.id for p in train} & {p.id for p in held}
    assert {(p.metadata["secret"], p.metadata["seed"]) for p in held}.isdisjoint(
        (p.metadata["secret"], p.metadata["seed"]) for p in train
    )
    assert all(1 <= p.metadata["secret"] <= 16 for p in train)
    assert [p.id for p in make(None, {"n_train": 50, "n_heldout": 10}).train_prompts()] == [p.id for p in train]
    with pytest.raises(UserError):
        make("x")


def test_environment_answers_and_ends_on_the_secret():
    task = make(None, {"high": 16})
    p = next(p for p in task.train_prompts() if p.metadata["secret"] == 5)
    env = task.environment(p)
    env.reset(0)
    assert env.step("8").observation == " lower:" and env.step(" 3 ").observation == " higher:"
    bad = env.step("abc")
    assert bad.observation == " 1-16?:" and bad.reward == 0.0 and not bad.done
    assert env.step("17").observation == " 1-16?:"
    win = env.step("5")
    assert win.done and win.reward == 1.0 and win.verdict.score == 1.0


def test_verify_reads_the_last_guess_of_a_transcript():
    task = make(None, {})
    p = task.train_prompts()[0]
    s = p.metadata["secret"]
    assert task.verify(p, f"8 lower:{s}").score == 1.0
    assert task.verify(p, f"{s} x:{s % 16 + 1}").score == 0.0
    assert task.verify(p, "no number").reason == "no_answer"


def test_demonstrations_are_binary_searches_that_win():
    task = make(None, {"demo_noise": 0.0})
    for p, steps in task.episode_examples(20, 1):
        assert steps[-1] == (str(p.metadata["secret"]), "") and len(steps) <= 5
        assert steps[0][0] == "8"


def test_warm_start_trains_on_actions_only(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import torch

    from rollwise.tokens import Codec
    from rollwise.trainer import tiny, warm_start

    model, tok = tiny.build_tiny("tiny-s")
    codec = Codec(tok, use_chat=False)
    task = make(None, {})
    [(p, ids, mask)] = warm_start._examples(codec, task, 1, 0, 4, episodes=True)
    _, t, m = warm_start._row(codec, (p, ids, mask), tok.eos_token_id)
    assert t == ids and m == mask and 0 in mask and mask[-1] == 1
    seen = []
    real = model.forward

    def spy(*a, labels=None, **k):
        seen.append(labels)
        return real(*a, labels=labels, **k)

    monkeypatch.setattr(model, "forward", spy)
    ws = SimpleNamespace(steps=1, batch_size=2, lr=1e-3, cache=False, objective="sft", model_dump=lambda exclude: {})
    assert warm_start.warm_start(
        model, codec, task, ws, 0, {"t": 1}, log=lambda m: None, max_observation_tokens=4, episodes=True
    )
    labels = seen[0]
    obs_ids = set(codec.encode_text(" higher:lower:"))
    kept = labels[labels != -100].tolist()
    assert (
        kept and not (set(kept) & (obs_ids - set(codec.encode_text("0123456789")))) and isinstance(labels, torch.Tensor)
    )


def _anchors(env, guesses):
    env.reset(0)
    return [env.step(g).anchor for g in guesses]


def test_anchor_is_the_state_the_guess_is_made_in_not_the_guess():
    """Secret 5: the anchor is the interval the feedback so far leaves. "8 lower" and "10 lower, 8 lower"
    both leave 1-7, so the next guesses (3 and 2) act in one state; the same guess 3 made before any
    feedback (1-16) and after "8 lower" (1-7) acts in two. Invalid and outside guesses change nothing."""
    task = make(None, {"high": 16})
    p = next(p for p in task.train_prompts() if p.metadata["secret"] == 5)
    env = task.environment(p)
    assert _anchors(env, ["8", "3", "5"]) == ["1-16", "1-7", "4-7"]
    assert _anchors(env, ["10", "8", "2", "4", "5"]) == ["1-16", "1-9", "1-7", "3-7", "5-7"]
    assert _anchors(env, ["3", "abc", "1", "12", "9", "5"]) == ["1-16", "4-16", "4-16", "4-16", "4-11", "4-8"]


def test_gigpo_step_groups_are_shared_states_in_the_episode_pool():
    """Two episodes of secret 5 played through the episode pool, gigpo with gamma 0.5, eps 0:
    a guesses 8, 3, 5 (states 1-16, 1-7, 4-7; r = [0, 0, 1], G = [1/4, 1/2, 1]);
    b guesses 10, 8, 2, 4, 5 (states 1-16, 1-9, 1-7, 3-7, 5-7; G = [1/16, 1/8, 1/4, 1/2, 1]).
    Both win: episode level 0. Step groups: 1-16 {a0, b0} and 1-7 {a1, b2}, each two different
    returns -> +-1/sqrt(2); every other state has one member -> 0. (Keyed on the guess, a's 8 and b's
    8, made in 1-16 and 1-9, would form the step group instead.)"""
    from rollwise.backends.scripted import ScriptedBackend
    from rollwise.generate.episodes import EpisodeLimits, EpisodePool
    from rollwise.objectives.gigpo import GigpoOptions, gigpo
    from rollwise.tokens import Codec
    from rollwise.trainer.tiny import char_tokenizer
    from rollwise.types import Plan, Request, Sampling

    tok = char_tokenizer()
    task = make(None, {"high": 16})
    p = next(p for p in task.train_prompts() if p.metadata["secret"] == 5)
    first = {0: "8", 1: "10"}  # the first turn's call index: which episode is which
    then = {  # the transcript so far -> the next guess
        "8 lower:": "3",
        "8 lower:3 higher:": "5",
        "10 lower:": "8",
        "10 lower:8 lower:": "2",
        "10 lower:8 lower:2 higher:": "4",
        "10 lower:8 lower:2 higher:4 higher:": "5",
    }

    def respond(seq, call):
        text = tok.decode(seq, skip_special_tokens=True)[len(p.text) :]
        return tok.encode(then[text] if text else first[call], add_special_tokens=False)

    pool = EpisodePool(
        ScriptedBackend(respond, tok.eos_token_id),
        Codec(tok, use_chat=False),
        task,
        Sampling(max_new_tokens=4),
        EpisodeLimits(max_turns=8),
    )
    try:
        rows = [r for _, r in pool.rollouts(Plan((Request(p, 2),)), version=0)]
    finally:
        pool.close()
    assert [r.text for r in rows] == ["8 lower:3 higher:5", "10 lower:8 lower:2 higher:4 higher:5"]
    eps = [r.episode for r in rows]
    advs = gigpo(
        torch.tensor([r.verdict.score for r in rows]),
        torch.zeros(2, dtype=torch.long),
        GigpoOptions(gamma=0.5, eps=0.0),
        episodes=eps,
        completion_lengths=torch.tensor([len(r.completion_ids) for r in rows]),
    )
    per_turn = [[float(advs.token_values[i, t.start]) for t in e.turns] for i, e in enumerate(eps)]
    s2 = 2**-0.5
    assert per_turn[0] == pytest.approx([s2, s2, 0.0], abs=1e-6)
    assert per_turn[1] == pytest.approx([-s2, 0.0, -s2, 0.0, 0.0], abs=1e-6)
