"""A run on task ``hf:<csv>`` with the user's own column names trains and evaluates end to end."""

import pytest

pytest.importorskip("datasets")

import rollwise  # noqa: E402
from conftest import as_sets, tiny_overrides  # noqa: E402
from rollwise.config import load_config  # noqa: E402
from rollwise.ledger import read_jsonl  # noqa: E402


def test_train_on_a_csv_with_own_columns(tmp_path):
    rows = [(a, b) for a in range(10, 30) for b in range(1, 4)]
    (tmp_path / "sums.csv").write_text("problem,target\n" + "".join(f"{a}+{b}=,{a + b}\n" for a, b in rows))
    o = tiny_overrides(
        tmp_path,
        steps=2,
        **{
            "task.name": f"hf:{tmp_path / 'sums.csv'}",
            "task.options": {
                "question_column": "problem",
                "answer_column": "target",
                "chat": False,
                "verifier": "exact",
                "heldout_fraction": 0.2,
            },
            "model.warm_start.steps": 0,
        },
    )
    result = rollwise.train(load_config(overrides=as_sets(o)), log=lambda m: None)
    metrics = read_jsonl(result.run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]
    assert metrics[-1]["cost/rollouts"] == 2 * 4 * 4  # 2 steps x 4 prompts x 4 rollouts, all verified
    assert metrics[-1]["cost/verifier_calls"] == 32 and metrics[-1]["cost/unverified"] == 0
    evals = read_jsonl(result.run_dir / "eval.jsonl")
    assert evals[-1]["eval/n_prompts"] == 8  # 60 distinct questions, 12 held out, eval.n_prompts = 8
