from rollwise import cli


def test_config_show_prints_resolved_toml(capsys):
    cli.main(["config", "show", "--set", "train.steps=3"])
    out = capsys.readouterr().out
    assert "[train]" in out and "steps = 3" in out


def test_eval_command_on_a_finished_run(tmp_path, capsys):
    import rollwise
    from conftest import as_sets, tiny_overrides
    from rollwise.config import load_config

    cfg = load_config(overrides=as_sets(tiny_overrides(tmp_path, steps=1)))
    res = rollwise.train(cfg, log=lambda m: None)
    n_evals = len((res.run_dir / "eval.jsonl").read_text().splitlines())
    cli.main(["eval", str(res.run_dir)])
    out = capsys.readouterr().out
    assert "eval/pass@1" in out and "step-1" in out
    assert "resum" not in out  # an evaluation reads a checkpoint; it resumes nothing
    # evaluating a finished run does not rewrite its ledger
    assert len((res.run_dir / "eval.jsonl").read_text().splitlines()) == n_evals


def test_eval_refuses_a_run_without_checkpoint_and_keeps_its_ledger(tmp_path, capsys):
    import pytest

    run = tmp_path / "r"
    run.mkdir()
    (run / "config.resolved.toml").write_text("[train]\nsteps = 1\n")
    (run / "eval.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(SystemExit) as exc:
        cli.main(["eval", str(run)])
    assert exc.value.code == 2 and "no checkpoint" in capsys.readouterr().out
    assert (run / "eval.jsonl").read_text() == '{"step": 0}\n'


def test_eval_at_a_step_with_its_own_temperature_and_samples(tmp_path, capsys):
    import json

    import pytest

    import rollwise
    from conftest import as_sets, tiny_overrides
    from rollwise.config import load_config

    cfg = load_config(
        overrides=as_sets(tiny_overrides(tmp_path, steps=2, **{"run.checkpoint_every": 1, "run.keep_checkpoints": 3}))
    )
    run = rollwise.train(cfg, log=lambda m: None).run_dir
    ledger = {f: (run / f).read_bytes() for f in ("metrics.jsonl", "eval.jsonl")}
    m = rollwise.evaluate(run, step=1, temperature=0.0, samples=1, log=lambda s: None)
    assert (m["step"], m["checkpoint"]) == (1, "step-1")
    # samples=1: the run's k = 2 no longer fits, so pass@1/maj@1 only; greedy: the same numbers twice
    assert "eval/pass@2" not in m and "eval/maj@1" in m
    again = rollwise.evaluate(run, step=1, temperature=0.0, samples=1, log=lambda s: None)
    assert {k: v for k, v in again.items() if k != "time/eval_s"} == {k: v for k, v in m.items() if k != "time/eval_s"}
    cli.main(["eval", str(run), "--step", "2", "--temperature", "0", "--samples", "2"])
    out = capsys.readouterr().out
    assert "step-2" in out and "eval/pass@2" in out
    # with the run's own settings, the newest checkpoint scores what the run's last evaluation recorded
    last = json.loads((run / "eval.jsonl").read_text().splitlines()[-1])
    mine = rollwise.evaluate(run, log=lambda s: None)
    assert mine["step"] == last["step"] == 2
    assert {k: v for k, v in mine.items() if k.startswith("eval/")} == {
        k: v for k, v in last.items() if k.startswith("eval/")
    }
    # read-only: the run's ledger is untouched; a step that is not there names the ones that are
    assert {f: (run / f).read_bytes() for f in ledger} == ledger
    with pytest.raises(SystemExit) as exc:
        cli.main(["eval", str(run), "--step", "7"])
    assert exc.value.code == 2 and "step-7" in capsys.readouterr().out
    assert json.loads((run / "eval.jsonl").read_text().splitlines()[-1])["step"] == 2


def test_ctrl_c_in_the_warm_start_is_said_as_it_is_and_resume_continues_it(tmp_path, capsys, monkeypatch):
    """No checkpoint exists yet: the message promises none ("from its latest checkpoint"); the
    warm start's own state is saved, and --resume continues it."""
    import pytest

    from conftest import as_sets, tiny_overrides
    from rollwise.trainer import warm_start

    sets = [
        x
        for o in as_sets(
            tiny_overrides(
                tmp_path, name="ws", steps=1, **{"model.warm_start.steps": 40, "model.warm_start.batch_size": 2}
            )
        )
        for x in ("--set", o)
    ]
    real = warm_start.Progress.__call__

    def interrupt_at_5(self, step, loss):
        real(self, step, loss)
        if step == 5:
            raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(warm_start.Progress, "__call__", interrupt_at_5)
        with pytest.raises(SystemExit) as exc:
            cli.main(["train", *sets])
    out = " ".join(capsys.readouterr().out.split())
    assert exc.value.code == 130 and "aborted" in out
    assert "warm start interrupted after 5 of 40 steps; saved" in out and "continues it from step 5" in out
    assert "before the first checkpoint" in out and f"rollwise train --resume {tmp_path / 'ws'}" in out
    assert "latest checkpoint" not in out and "from step 0" in out
    cli.main(["train", "--resume", str(tmp_path / "ws")])
    out = " ".join(capsys.readouterr().out.split())
    assert "warm start: continuing from step 5 of 40" in out and "done" in out


def test_hint_after_an_interrupt_names_the_checkpoint_it_continues_from(tmp_path):
    d = tmp_path / "r"
    (d / "checkpoints" / "step-4").mkdir(parents=True)
    (d / "checkpoints" / "step-4" / "state.pt").write_bytes(b"x")
    (d / "config.resolved.toml").write_text("")
    assert "from its checkpoint at step 4" in cli._resume_hint(d)
    assert "nothing to resume" in cli._resume_hint(tmp_path / "never-written")


def test_rank_other_than_0_prints_no_header_or_closing_lines(tmp_path, capsys, monkeypatch):
    """torchrun starts one rollwise per rank; only rank 0 speaks for the run (RANK set, one process)."""
    from conftest import as_sets, tiny_overrides

    sets = [x for o in as_sets(tiny_overrides(tmp_path, name="r1", steps=1)) for x in ("--set", o)]
    monkeypatch.setenv("RANK", "1")
    cli.main(["train", *sets])
    out = capsys.readouterr().out
    assert "rollwise run" not in out and "done" not in out and "files:" not in out
    monkeypatch.setenv("RANK", "0")
    cli.main(["train", *[s.replace('run.name="r1"', 'run.name="r0"') for s in sets]])
    out = capsys.readouterr().out
    assert "rollwise run" in out and "done" in out
    # the closing path line is one line however long the run directory (the console wraps at 80 columns)
    [files] = [line for line in out.splitlines() if line.startswith("files:")]
    assert len(files) > 80 and files.endswith("(metrics.jsonl, eval.jsonl, plots/, checkpoints/)")
