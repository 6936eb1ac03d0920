"""Bring your own data: a missing field's error names the option that sets it, a numeric answer
can be the solution (warm-start target), and evaluation on fewer held-out prompts than
eval.n_prompts is warned about at start."""

from __future__ import annotations

import json

import pytest

from rollwise.config import load_config
from rollwise.registry import UserError
from rollwise.tasks.jsonl import make


def _file(tmp_path, rows, name="d.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_missing_field_names_the_option_to_set(tmp_path):
    p = _file(tmp_path, [{"problem": "1+1", "answer": "2"}])
    with pytest.raises(UserError, match=r"missing field 'question'.*set task\.options\.question_field"):
        make(str(p), {})


def test_bad_solution_names_its_option(tmp_path):
    p = _file(tmp_path, [{"question": "1+1", "answer": "2", "sol": None}])
    with pytest.raises(UserError, match=r"task\.options\.solution_field"):
        make(str(p), {"solution_field": "sol"})


def test_numeric_answer_can_be_the_solution_field(tmp_path):
    p = _file(tmp_path, [{"question": f"{i}+{i}", "answer": 2 * i} for i in range(10)])
    task = make(str(p), {"solution_field": "answer", "heldout_fraction": 0.2})
    targets = [t for _, t in task.sft_examples(4, 0)]
    assert targets and all(isinstance(t, str) and t == str(int(t)) for t in targets)


def test_fewer_held_out_prompts_than_configured_is_warned(tmp_path, monkeypatch):
    import rollwise
    from rollwise import components

    class Stop(Exception):
        pass

    def stop(*a, **k):
        raise Stop

    monkeypatch.setattr(components, "build_policy", stop)
    # 50 distinct questions, heldout_fraction 0.1 -> round(5.0) = 5 held out, eval.n_prompts 200
    p = _file(tmp_path, [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(50)])
    cfg = load_config(overrides=[f'task.name="jsonl:{p}"', f'run.dir="{tmp_path / "runs"}"', "run.progress=false"])
    logs = []
    with pytest.raises(Stop):
        rollwise.train(cfg, log=logs.append)
    # left unset, eval.n_prompts follows the split: said once among the derived defaults, no warning
    [d] = [m for m in logs if m.startswith("defaults for")]
    assert "eval.n_prompts = 5 (the task's held-out split, which has 5 prompts)" in d
    assert not [m for m in logs if m.startswith("warning") and "held-out prompts" in m]
    # set explicitly, it wins, and the shortfall is warned
    logs = []
    with pytest.raises(Stop):
        rollwise.train(cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"n_prompts": 200})}), log=logs.append)
    [w] = [m for m in logs if "held-out prompts" in m]
    assert "uses 5 held-out prompts, not eval.n_prompts = 200" in w


def test_an_edited_data_file_trains_a_new_warm_start(tmp_path):
    """The warm start's cache is keyed by the file's rows, not only its name: the same path with one answer
    changed (as many rows) trains anew; the unchanged file loads the cached one."""
    import rollwise
    from conftest import as_sets, tiny_overrides

    rows = [{"question": f"{i}+1", "answer": str(i + 1)} for i in range(40)]
    p = _file(tmp_path, rows)

    def warm(name):
        o = tiny_overrides(
            tmp_path / "runs",
            name=name,
            steps=1,
            **{"task.name": f"jsonl:{p}", "task.options": {"solution_field": "answer"}},
        )
        logs = []
        rollwise.train(load_config(overrides=as_sets({**o, "model.warm_start.steps": 2})), log=logs.append)
        return [m for m in logs if m.startswith("warm start: ") and m.split(": ")[1] in ("trained", "cached")]

    assert warm("a") == ["warm start: trained"]
    assert warm("b") == ["warm start: cached"]
    rows[7]["answer"] = "9"  # one answer changed, as many rows
    _file(tmp_path, rows)
    assert warm("c") == ["warm start: trained"]
