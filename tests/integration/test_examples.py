"""Every script in examples/ runs (issue #46), each for a few steps at small sizes: its ``main(argv)`` takes
``section.key=value`` overrides after its own, as the command line does."""

import runpy
from pathlib import Path

from rollwise.ledger import read_jsonl

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
QUICK = ["run.progress=false", "run.checkpoint_every=0", "eval.every=0", "eval.samples=2", "eval.k=[2]"]


def main_of(name: str):
    return runpy.run_path(str(EXAMPLES / name))["main"]


def test_scripts_in_examples_are_the_ones_tested_here():
    tested = {"own_data_chat.py", "custom_reward.py", "compare_controllers.py", "agent_calculator.py"}
    assert {p.name for p in EXAMPLES.glob("*.py")} - {"make_arith_qa.py"} == tested


# The chat model (SmolLM2-135M) is swapped for the built-in tiny one here: the test checks the script (its
# data, its reward function over chat messages, its overrides), in seconds rather than minutes on a CPU.
def test_own_data_chat(tmp_path):
    small = ["train.steps=1", "control.prompts_per_step=2", "control.rollouts_per_prompt=2", "eval.n_prompts=2"]
    run = main_of("own_data_chat.py")
    result = run([f"run.dir={tmp_path}", *QUICK, *small, "sampling.max_new_tokens=6"], model="tiny-s")
    lines = read_jsonl(result.run_dir / "metrics.jsonl")
    assert len(lines) == 1 and lines[0]["cost/rollouts"] == 4 and lines[0]["cost/unverified"] == 0


def test_custom_reward(tmp_path):
    small = ["train.steps=2", "control.prompts_per_step=2", "control.rollouts_per_prompt=2", "eval.n_prompts=2"]
    result = main_of("custom_reward.py")([f"run.dir={tmp_path}", *QUICK, *small], model="tiny-s")
    assert [m["step"] for m in read_jsonl(result.run_dir / "metrics.jsonl")] == [0, 1]


def test_agent_calculator(tmp_path):
    small = [
        "model.name=tiny-s",  # the config's SmolLM2 with LoRA, swapped as above
        "model.lora.enabled=false",
        'task.options={format = "tag", digits = [5, 6], n_train = 50, n_heldout = 5}',
        "train.steps=1",
        "control.prompts_per_step=1",
        "control.rollouts_per_prompt=2",
        "eval.n_prompts=1",
        "model.warm_start.steps=2",
        "model.warm_start.batch_size=2",
        "sampling.max_new_tokens=16",
        "task.max_turns=2",
        "task.max_episode_tokens=64",
    ]
    result = main_of("agent_calculator.py")([f"run.dir={tmp_path}", *QUICK, *small])
    lines = read_jsonl(result.run_dir / "metrics.jsonl")
    assert len(lines) == 1 and lines[0]["episodes/count"] == 2


def test_compare_controllers(tmp_path):
    small = [
        "train.steps=2",
        "model.warm_start.steps=10",
        "eval.n_prompts=2",
        "eval.every=1",
        "run.checkpoint_every=0",
    ]
    result = main_of("compare_controllers.py")(small, out_dir=tmp_path / "out")
    assert sorted(result["arms"]) == ["dars", "uniform"]
    assert (tmp_path / "out" / "report.html").is_file() and (tmp_path / "out" / "compare.json").is_file()
