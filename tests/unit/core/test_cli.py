from rollwise import cli


def test_config_show_prints_resolved_toml(capsys):
    cli.main(["config", "show", "--set", "train.steps=3"])
    out = capsys.readouterr().out
    assert "[train]" in out and "steps = 3" in out


def test_eval_command_on_a_finished_run(tmp_path, capsys):
    import rollwise
    from rollwise.config import load_config
    from conftest import as_sets, tiny_overrides

    cfg = load_config(overrides=as_sets(tiny_overrides(tmp_path, steps=1)))
    res = rollwise.train(cfg, log=lambda m: None)
    n_evals = len((res.run_dir / "eval.jsonl").read_text().splitlines())
    cli.main(["eval", str(res.run_dir)])
    out = capsys.readouterr().out
    assert "eval/pass@1" in out
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
