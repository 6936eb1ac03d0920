"""A TRL script ported to rollwise by changing the import and the constructor (issue #46,
docs/migrating-from-trl.md): its ``datasets.Dataset`` in TRL's conversational format, and reward functions
as written for ``GRPOTrainer`` (TRL's own ``trl.rewards`` when TRL is installed), run unchanged for a few
steps on the built-in tiny model."""

import pytest

import rollwise
from rollwise.ledger import read_jsonl

datasets = pytest.importorskip("datasets")

QUICK = [
    "run.progress=false",
    "run.checkpoint_every=0",
    "train.steps=2",  # GRPOConfig(max_steps=2)
    "control.rollouts_per_prompt=2",  # GRPOConfig(num_generations=2)
    "control.prompts_per_step=2",
    "sampling.max_new_tokens=6",  # GRPOConfig(max_completion_length=6)
    "eval.n_prompts=2",
    "eval.samples=2",
    "eval.k=[2]",
    "eval.every=0",
    "model.compute_dtype=float32",
]


def trl_dataset():
    """What a TRL script builds: a "prompt" of chat messages and a "solution" column."""
    rows = [
        {"prompt": [{"role": "user", "content": f"{a}+{b}="}], "solution": str(a + b)}
        for a in range(10, 20)
        for b in range(1, 3)
    ]
    return datasets.Dataset.from_list(rows)


def close_to_solution(completions, solution, **kwargs):
    """A reward function in the style of TRL's documentation: conversational completions are lists of one
    message; the dataset's columns arrive as keyword lists."""
    scores = []
    for completion, sol in zip(completions, solution):
        text = completion[0]["content"].strip()
        scores.append(1.0 if text == sol else -0.1 * min(10, abs(len(text) - len(sol))))
    return scores


def test_a_trl_style_reward_function_and_dataset(tmp_path):
    # TRL: GRPOTrainer(model=..., reward_funcs=[close_to_solution], train_dataset=dataset, args=GRPOConfig(...))
    trainer = rollwise.Trainer(
        model="tiny-s",
        reward_funcs=[close_to_solution],
        dataset=trl_dataset(),
        overrides=[f"run.dir={tmp_path}", "run.name=trl", *QUICK],
        log=lambda m: None,
    )
    result = trainer.train()
    lines = read_jsonl(result.run_dir / "metrics.jsonl")
    assert [m["step"] for m in lines] == [0, 1] and all(m["cost/unverified"] == 0 for m in lines)
    assert all(-1.0 <= m["reward/mean"] <= 1.0 for m in lines)


def test_trl_shipped_reward_functions_run_unchanged(tmp_path):
    rewards = pytest.importorskip("trl.rewards")
    pytest.importorskip("math_verify")
    result = rollwise.train(
        model="tiny-s",
        dataset=trl_dataset(),
        reward_funcs=[rewards.accuracy_reward, rewards.think_format_reward],
        reward_weights=[1.0, 0.5],  # GRPOConfig(reward_weights=[1.0, 0.5])
        overrides=[f"run.dir={tmp_path}", "run.name=trl-rewards", *QUICK],
        log=lambda m: None,
    )
    lines = read_jsonl(result.run_dir / "metrics.jsonl")
    # accuracy_reward parses every solution here (None only for an unparseable gold answer): all verified
    assert [m["step"] for m in lines] == [0, 1] and all(m["cost/unverified"] == 0 for m in lines)
    assert all(0.0 <= m["reward/mean"] <= 1.5 for m in lines)
