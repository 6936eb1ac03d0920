"""guess_number (rollwise.envs.guess): splits, the environment's answers, transcript verification,
demonstrations and the warm start on them (observations out of the loss)."""

import pytest

from rollwise.envs.base import is_env_task
from rollwise.envs.guess import make
from rollwise.registry import UserError
from rollwise.tasks import REGISTRY


def test_registered_splits_disjoint_and_fixed_by_seed():
    task = REGISTRY.get("guess_number")(None, {"n_train": 50, "n_heldout": 10})
    assert is_env_task(task)
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
    [(p, ids, mask)] = warm_start._examples(codec, task, 1, 0, 4)
    _, t, m = warm_start._row(codec, (p, ids, mask), tok.eos_token_id)
    assert t == ids and m == mask and 0 in mask and mask[-1] == 1
    seen = []
    real = model.forward

    def spy(*a, labels=None, **k):
        seen.append(labels)
        return real(*a, labels=labels, **k)

    monkeypatch.setattr(model, "forward", spy)
    ws = SimpleNamespace(steps=1, batch_size=2, lr=1e-3, cache=False, objective="sft", model_dump=lambda exclude: {})
    assert warm_start.warm_start(model, codec, task, ws, 0, {"t": 1}, log=lambda m: None, max_observation_tokens=4)
    labels = seen[0]
    obs_ids = set(codec.encode_text(" higher:lower:"))
    kept = labels[labels != -100].tolist()
    assert (
        kept and not (set(kept) & (obs_ids - set(codec.encode_text("0123456789")))) and isinstance(labels, torch.Tensor)
    )
