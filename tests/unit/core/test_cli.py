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
