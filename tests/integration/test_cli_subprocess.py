"""The installed ``rollwise`` command, run as a user runs it (a subprocess): usage errors are one
line with exit status 2, ``--version`` works, and Ctrl-C (SIGINT) prints "aborted" and exits 130
so that ``rollwise compare ... && publish`` stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXE = Path(sys.executable).parent / "rollwise"
pytestmark = pytest.mark.skipif(
    not EXE.is_file(), reason="the rollwise console script is not installed in this environment"
)


def _env(tmp_path):
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "ROLLWISE_CACHE": str(tmp_path / "cache"),
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "200",
    }


def _cli(tmp_path, *args):
    p = subprocess.run([str(EXE), *args], capture_output=True, text=True, env=_env(tmp_path), cwd=tmp_path, timeout=120)
    return p.returncode, p.stdout + p.stderr


def test_version(tmp_path):
    import rollwise

    rc, out = _cli(tmp_path, "--version")
    assert rc == 0 and f"rollwise {rollwise.__version__}" in out


@pytest.mark.parametrize(
    "args, says",
    [
        (["trian"], "No such command 'trian'"),
        (["train", "--bogus"], "No such option: --bogus"),
        (["eval"], "Missing argument"),
        (["config", "show", "--bogus"], "No such option: --bogus"),
    ],
)
def test_usage_errors_are_one_line_with_status_2(tmp_path, args, says):
    rc, out = _cli(tmp_path, *args)
    assert rc == 2, out
    assert "Traceback" not in out and says in out
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), out


def test_bare_rollwise_prints_help_not_a_traceback(tmp_path):
    rc, out = _cli(tmp_path)
    assert rc == 2 and "Traceback" not in out
    assert "train" in out and "compare" in out and "Usage" in out


def test_user_error_is_one_line_with_status_2(tmp_path):
    rc, out = _cli(tmp_path, "config", "show", "--set", "train.stpes=3")
    assert rc == 2 and "Traceback" not in out and "train.stpes" in out


def _interrupt(tmp_path, args, ready: str, timeout=120.0, sig=signal.SIGINT):
    """Start the CLI, wait until a line containing ``ready`` appears, send ``sig``; (rc, output)."""
    # SIGINT back to its default in the child: a shell without job control starts background jobs
    # (and so pytest and its children) with SIGINT ignored, and Python then installs no handler
    p = subprocess.Popen(
        [str(EXE), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(tmp_path),
        cwd=tmp_path,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines, t0 = [], time.time()
    try:
        for line in p.stdout:
            lines.append(line)
            if ready in line:
                break
            assert time.time() - t0 < timeout, "".join(lines)
        else:
            pytest.fail("the command ended before it was interrupted:\n" + "".join(lines))
        p.send_signal(sig)
        rest, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    return p.returncode, "".join(lines) + rest


TRAIN = [
    "--set",
    "run.progress=false",
    "--set",
    "model.name=tiny-s",
    "--set",
    "model.warm_start.steps=100000",
    "--set",
    "model.warm_start.batch_size=4",
    "--set",
    "task.options={n_train = 50, n_heldout = 10}",
]


@pytest.mark.slow
def test_ctrl_c_on_train_exits_130_with_aborted(tmp_path):
    rc, out = _interrupt(tmp_path, ["train", "--set", f"run.dir={tmp_path / 'runs'}", *TRAIN], "warm start: step")
    assert rc == 130, out
    assert "aborted" in out and "Traceback" not in out
    # no checkpoint exists during the warm start: the message says what a resume does, and promises none
    flat = " ".join(out.split())
    assert (
        "warm start interrupted" in flat and "before the first checkpoint" in flat and "latest checkpoint" not in flat
    )


@pytest.mark.slow
def test_sigterm_on_train_is_handled_like_ctrl_c(tmp_path):
    """kill / a scheduler's SIGTERM: the same clean-up and message as Ctrl-C, exit status 143."""
    rc, out = _interrupt(
        tmp_path, ["train", "--set", f"run.dir={tmp_path / 'runs'}", *TRAIN], "warm start: step", sig=signal.SIGTERM
    )
    flat = " ".join(out.split())
    assert rc == 143, out
    assert "aborted (terminated: SIGTERM)" in flat and "Traceback" not in out
    assert "warm start interrupted" in flat and "rollwise train --resume" in flat


@pytest.mark.slow
def test_ctrl_c_on_compare_exits_130_with_aborted(tmp_path):
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(
        'seeds = [0]\nbudget = { generated_tokens = 100000 }\n[base]\n"model.name" = "tiny-s"\n'
        '"model.warm_start.steps" = 100000\n"model.warm_start.batch_size" = 4\n"run.progress" = false\n'
        '"task.options" = { n_train = 50, n_heldout = 10 }\n'
        '[[arms]]\nname = "a"\n[[arms]]\nname = "b"\nset = { "control.name" = "dars" }\n'
    )
    rc, out = _interrupt(
        tmp_path, ["compare", "--config", str(sweep), "--out-dir", str(tmp_path / "cmp")], "warm start: step"
    )
    assert rc == 130, out
    assert "aborted" in out and "Traceback" not in out
    assert not (tmp_path / "cmp" / "compare.json").exists()


@pytest.mark.slow
def test_sigterm_on_compare_with_parallel_jobs_stops_the_child_runs(tmp_path):
    """compare -j 2 trains in child processes, which a SIGTERM to rollwise alone would not reach:
    they are interrupted too, and rollwise exits 143 at once (not when the runs would have ended)."""
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(
        'seeds = [0]\njobs = 2\nbudget = { generated_tokens = 100000 }\n[base]\n"model.name" = "tiny-s"\n'
        '"model.warm_start.steps" = 100000\n"model.warm_start.batch_size" = 4\n"run.progress" = false\n'
        '"task.options" = { n_train = 50, n_heldout = 10 }\n'
        '[[arms]]\nname = "a"\n[[arms]]\nname = "b"\nset = { "control.name" = "dars" }\n'
    )
    rc, out = _interrupt(
        tmp_path,
        ["compare", "--config", str(sweep), "--out-dir", str(tmp_path / "cmp")],
        "warm start: step",
        sig=signal.SIGTERM,
    )
    assert rc == 143, out
    assert "aborted (terminated: SIGTERM)" in out
    assert not (tmp_path / "cmp" / "compare.json").exists()


def test_messages_with_brackets_are_printed_whole(tmp_path):
    # rich markup would swallow "[task.options]"-like text in an error message
    bad = tmp_path / "d.jsonl"
    bad.write_text('{"q": "1+1", "answer": "2"}\n')
    rc, out = _cli(tmp_path, "config", "show", "--set", f"task.name=jsonl:{bad}")
    assert rc == 2 and "the line has ['answer', 'q']" in out and "task.options.question_field" in out


def test_a_piped_run_prints_no_progress_bars(tmp_path):
    # in a pipe or a log, rollwise's bar gives way to plain lines, and transformers' bars ("Writing model
    # shards" when final/ is written) are off too: no carriage-return lines
    rc, out = _cli(
        tmp_path,
        "train",
        *("--set", "model.warm_start.steps=0", "--set", "train.steps=1", "--set", "eval.n_prompts=4"),
        *("--set", "control.prompts_per_step=2", "--set", f"run.dir={tmp_path / 'runs'}"),
    )
    assert rc == 0 and "files:" in out and (tmp_path / "runs").is_dir()
    assert "Writing model shards" not in out and "\r" not in out
