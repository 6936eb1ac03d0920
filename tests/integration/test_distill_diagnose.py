"""``rollwise distill-diagnose`` on a real tiny run: it scores two teachers (a later checkpoint and the
student with the answer in its context), writes its JSON and plot, leaves the run directory exactly as
it was, reports a zero distillation gradient (not NaN) for a teacher identical to the student, and
refuses bad input naming the argument before any model loads."""

import hashlib
import json
import math

import pytest
import torch
from safetensors.torch import load_file

from conftest import tiny_overrides
from rollwise import cli, components


@pytest.fixture
def run_dir(trained, tmp_path):
    o = tiny_overrides(tmp_path, steps=2, **{"run.checkpoint_every": 1, "eval.at_start": False})
    return trained(o)


def _snapshot(root):
    return {
        str(p.relative_to(root)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(root.rglob("*"))
        if p.is_file()
    } | {str(p.relative_to(root)) + "/": None for p in root.rglob("*") if p.is_dir()}


def _diagnose(run_dir, out, *teachers, extra=()):
    argv = ["distill-diagnose", str(run_dir), "--out", str(out), "--prompts", "3", "--samples", "3", *extra]
    for t in teachers:
        argv += ["--teacher", t]
    cli.main(argv)
    return json.loads((out / "distill.json").read_text())


def test_scores_two_teachers_and_leaves_the_run_as_it_was(run_dir, tmp_path):
    before = _snapshot(run_dir)
    later = f"checkpoint:{run_dir / 'checkpoints' / 'step-2'}"
    res = _diagnose(run_dir, tmp_path / "out", "answer", later, extra=["--step", "1"])
    assert _snapshot(run_dir) == before  # read-only: no file written, moved or touched
    assert (tmp_path / "out" / "distill.png").stat().st_size > 0
    assert res["checkpoint"] == "step-1" and res["prompts"] == 3 and res["rollouts"] == 9
    assert set(res["teachers"]) == {"answer", "checkpoint run/step-2"}
    assert res["teachers"]["answer"]["summary"]["all"]["distill_norm_mean"] > 0  # the context moves the logits
    # the later checkpoint differs from the student exactly when training changed the weights
    w1, w2 = (load_file(run_dir / "checkpoints" / f"step-{k}" / "model.safetensors") for k in (1, 2))
    moved = any(not torch.equal(w1[k], w2[k]) for k in w1)
    assert (res["teachers"]["checkpoint run/step-2"]["summary"]["all"]["distill_norm_mean"] > 0) == moved
    for t in res["teachers"].values():
        s = t["summary"]
        assert s["correct"]["rollouts"] + s["incorrect"]["rollouts"] == 9 == len(t["per_rollout"])
        for cls in ("correct", "incorrect", "all"):
            a = s[cls]["alignment_mean"]
            assert a is None or -1.0 <= a <= 1.0


def test_a_teacher_identical_to_the_student_reports_a_zero_gradient(run_dir, tmp_path):
    same = f"checkpoint:{run_dir / 'checkpoints' / 'step-2'}"  # the student is the newest checkpoint, step 2
    res = _diagnose(run_dir, tmp_path / "out", same)
    (t,) = res["teachers"].values()
    assert res["checkpoint"] == "step-2"
    assert t["summary"]["all"]["distill_norm_mean"] == 0.0 and t["summary"]["all"]["kl_mean"] == 0.0
    assert all(r["alignment"] == 0.0 and not math.isnan(r["alignment"]) for r in t["per_rollout"])


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the input was validated")

    monkeypatch.setattr(components, "build_policy", refuse)


def _refused(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    out = capsys.readouterr()
    text = " ".join((out.out + out.err).split())
    assert exc.value.code == 2, text
    assert "Traceback" not in text
    return text


@pytest.mark.parametrize(
    "teacher, needle",
    [
        ("checkpoint:{tmp}/no/such/step-3", "--teacher checkpoint:{tmp}/no/such/step-3: checkpoint path not found"),
        ("checkpoint:{tmp}", "is neither a run directory nor a checkpoints/step-<N> directory"),
        ("bigger-model", "--teacher 'bigger-model': expected 'answer' or 'checkpoint:PATH'"),
    ],
)
def test_bad_teachers_are_refused_naming_the_argument(run_dir, tmp_path, capsys, no_model, teacher, needle):
    t = teacher.format(tmp=tmp_path)
    text = _refused(["distill-diagnose", str(run_dir), "--teacher", t, "--out", str(tmp_path / "o")], capsys)
    assert needle.format(tmp=tmp_path) in text


def test_bad_run_and_out_are_refused(run_dir, tmp_path, capsys, no_model):
    text = _refused(["distill-diagnose", str(tmp_path / "nope"), "--teacher", "answer"], capsys)
    assert "RUN_DIR: run directory not found" in text
    text = _refused(["distill-diagnose", str(run_dir), "--teacher", "answer", "--out", str(run_dir / "d")], capsys)
    assert "--out" in text and "inside the run directory" in text
    text = _refused(["distill-diagnose", str(run_dir), "--teacher", "answer", "--step", "7"], capsys)
    assert "no checkpoint step-7" in text
