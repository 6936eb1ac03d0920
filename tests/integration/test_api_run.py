"""The Python API trains end to end (issue #46): rows and TRL-signature reward functions through the loop,
with asynchrony (the functions run in the generator's thread), with a loaded transformers model, and a
reward function that fails mid-run stops the run with its name and the row."""

import threading

import pytest

import rollwise
from rollwise.ledger import read_jsonl
from rollwise.registry import UserError

ROWS = [{"prompt": f"{a}+{b}=", "answer": a + b, "half": 0.5} for a in range(10, 20) for b in range(1, 3)]


def small(tmp_path, name, steps=2, **extra):
    o = {
        "run.dir": str(tmp_path),
        "run.name": name,
        "run.progress": "false",
        "run.checkpoint_every": 0,
        "train.steps": steps,
        "control.prompts_per_step": 2,
        "control.rollouts_per_prompt": 2,
        "sampling.max_new_tokens": 4,
        "eval.n_prompts": 2,
        "eval.samples": 2,
        "eval.k": "[2]",
        "eval.every": 0,
        "model.compute_dtype": "float32",
    }
    o.update(extra)
    return [f"{k}={v}" for k, v in o.items()]


class Recorder:
    """A reward function (a callable object, as TRL allows) that returns each row's ``half`` column and
    records the threads it ran in."""

    def __init__(self):
        self.threads, self.calls = set(), 0

    def __call__(self, prompts, completions, half, **kwargs):
        self.threads.add(threading.current_thread().name)
        self.calls += 1
        return list(half)


def unsure(prompts, completions, **kwargs):
    return [None for _ in completions]


def test_rows_and_weighted_reward_functions_train(tmp_path):
    rec = Recorder()
    result = rollwise.train(
        model="tiny-s",
        dataset=ROWS,
        reward_funcs=[rec, unsure],
        reward_weights=[3.0, 1.0],
        overrides=small(tmp_path, "sync"),
        log=lambda m: None,
    )
    metrics = read_jsonl(result.run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]
    # every completion: 3 * 0.5 + (unsure's None adds nothing) = 1.5, verified
    assert [m["reward/mean"] for m in metrics] == [1.5, 1.5]
    assert metrics[-1]["cost/rollouts"] == 2 * 2 * 2 and metrics[-1]["cost/unverified"] == 0
    evals = read_jsonl(result.run_dir / "eval.jsonl")
    assert evals[0]["eval/pass@1"] == 1.0  # 1.5 counts as correct (>= rollwise.types.CORRECT)
    assert rec.calls == 2 * 2 * 2 + 2 * 2 * 2  # training rollouts + 2 evaluations of 2 prompts x 2 samples
    assert rec.threads == {threading.main_thread().name}
    assert (result.run_dir / "final" / "config.json").is_file()


def test_with_asynchrony_the_functions_run_in_the_generator_thread(tmp_path):
    rec = Recorder()
    o = small(tmp_path, "async", steps=3, **{"train.async.max_staleness": 1, "train.async.allow_uncorrected": "true"})
    result = rollwise.train(model="tiny-s", dataset=ROWS, reward_funcs=[rec], overrides=o, log=lambda m: None)
    metrics = read_jsonl(result.run_dir / "metrics.jsonl")
    assert [m["reward/mean"] for m in metrics] == [0.5, 0.5, 0.5]
    assert rec.threads - {threading.main_thread().name}  # training rollouts were scored off the main thread


@pytest.mark.parametrize("staleness", [0, 1])
def test_a_reward_function_failing_mid_run_names_itself_and_the_row(tmp_path, staleness):
    def picky(prompts, completions, **kwargs):
        if prompts[0].startswith("1"):  # every prompt: fails on the first rollout it scores
            raise KeyError("gold")
        return [0.0]

    o = small(
        tmp_path,
        f"fail{staleness}",
        **{"train.async.max_staleness": staleness, "train.async.allow_uncorrected": "true", "eval.at_start": "false"},
    )
    with pytest.raises(UserError, match=r"reward function 'picky' raised KeyError: 'gold' \(dataset row \d+\)"):
        rollwise.train(model="tiny-s", dataset=ROWS, reward_funcs=[picky], overrides=o, log=lambda m: None)


def test_a_loaded_transformers_model_with_its_tokenizer_trains(tmp_path):
    from rollwise.trainer import tiny

    model, tok = tiny.build_tiny("tiny-s", seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = rollwise.Trainer(
        model=model,
        tokenizer=tok,
        dataset=ROWS,
        reward_funcs=[Recorder()],
        overrides=small(tmp_path, "loaded", 1, **{"run.force": "true"}),
    )
    assert trainer.config.model.name.endswith(tuple("0123456789abcdef"))  # a directory under the cache
    result = trainer.train()
    assert [m["step"] for m in read_jsonl(result.run_dir / "metrics.jsonl")] == [0]
    assert all((model.state_dict()[k] == v).all() for k, v in before.items())  # the object passed in is left as is
