"""``rollwise runs`` lists runs from their files; shell completion comes from typer."""

import json
import os
import subprocess
import sys

from rollwise.cli import main
from rollwise.runs import list_runs
from rollwise.trainer import checkpoint


def _fake_run(root, name, steps, evals, ckpt=None, final=False):
    d = root / name
    d.mkdir(parents=True)
    (d / "config.resolved.toml").write_text("[train]\nsteps = 10\n")
    (d / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "cost/generated_tokens": 100 * (s + 1)}) + "\n" for s in range(steps))
        + '{"step": 99, "cost/gen'
    )  # a line cut short by a kill is ignored
    (d / "eval.jsonl").write_text("".join(json.dumps({"step": s, "eval/pass@1": p}) + "\n" for s, p in evals))
    if ckpt is not None:
        (d / "checkpoints" / f"step-{ckpt}").mkdir(parents=True)
        (d / "checkpoints" / f"step-{ckpt}" / "state.pt").write_bytes(b"x")
    if final:
        (d / "final").mkdir()
    return d


def test_runs_lists_steps_tokens_last_pass_at_1_and_state(tmp_path, capsys):
    _fake_run(tmp_path, "a", steps=10, evals=[(0, 0.25), (10, 0.625)], ckpt=10, final=True)
    b = _fake_run(tmp_path, "sweep/b-s0", steps=4, evals=[(0, 0.5)], ckpt=2)
    _fake_run(tmp_path, "c", steps=0, evals=[])
    checkpoint.lock_run_dir(b)  # as a live run holds it
    try:
        rows = {r["name"]: r for r in list_runs(tmp_path)}
    finally:
        checkpoint.unlock_run_dir(b)
    # a: 10 lines (steps 0..9) -> 10 steps, tokens 100 * 10, last eval 0.625 at step 10
    assert rows["a"] == {
        "name": "a",
        "steps": 10,
        "max_steps": 10,
        "tokens": 1000,
        "pass@1": 0.625,
        "eval_step": 10,
        "checkpoint": 10,
        "state": "done",
    }
    assert (rows["sweep/b-s0"]["steps"], rows["sweep/b-s0"]["tokens"], rows["sweep/b-s0"]["state"]) == (
        4,
        400,
        "running",
    )
    assert rows["c"]["pass@1"] is None and rows["c"]["checkpoint"] is None and rows["c"]["state"] == "stopped"
    main(["runs", str(tmp_path)])
    out = capsys.readouterr().out
    assert "0.625 (10)" in out and "step-10" in out and "1,000" in out and "sweep/b-s0" in out


def test_shell_completion_completes_commands():
    env = dict(os.environ, _ROLLWISE_COMPLETE="complete_bash", COMP_WORDS="rollwise ex", COMP_CWORD="1")
    out = subprocess.run(
        [sys.executable, "-c", "from rollwise.cli import main; main()"], env=env, capture_output=True, text=True
    )
    assert out.stdout.split() == ["export"]
    env.update(COMP_WORDS="rollwise ru", COMP_CWORD="1")
    out = subprocess.run(
        [sys.executable, "-c", "from rollwise.cli import main; main()"], env=env, capture_output=True, text=True
    )
    assert out.stdout.split() == ["runs"]


def test_runs_piped_prints_full_names_one_line_each(tmp_path, capsys):
    """`rollwise runs | cat`: not a terminal, so tab-separated lines and whole names (a table would cut them)."""
    name = "sweeps/controllers-on-arithmetic/dars-with-a-long-arm-name-s0"
    _fake_run(tmp_path, name, steps=3, evals=[(0, 0.25)], ckpt=2)
    _fake_run(tmp_path, "b", steps=0, evals=[])
    main(["runs", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split("\t") == ["run", "steps", "tokens", "pass@1 (at step)", "checkpoint", "state"]
    rows = {ln.split("\t")[0]: ln.split("\t") for ln in lines[1:]}
    assert rows[name] == [name, "3/10", "300", "0.250 (0)", "step-2", "stopped"] and set(rows) == {name, "b"}
