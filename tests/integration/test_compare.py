"""``rollwise compare`` on CPU: the budget stops the loop, the example sweep runs (2 arms x 2 seeds
of the tiny model), finished runs are skipped, an interrupted run is resumed, a bad sweep fails
before training, and the HTML report shows every arm in headless Chromium."""

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import tomli_w
import tomllib

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise import cli
from rollwise.bench import runner
from rollwise.config import load_config
from rollwise.ledger import read_jsonl

EXAMPLE = Path(__file__).resolve().parents[2] / "benchmarks" / "example_sweep.toml"
ARMS = ["grpo", "dapo-refill"]


# ---------------------------------------------------------------- the budget in the loop


def test_rollout_budget_stops_the_loop(tmp_path):
    # 4 prompts x 4 rollouts = 16 rollouts per step: a budget of 32 stops after 2 of 10 steps
    cfg = load_config(overrides=as_sets(tiny_overrides(tmp_path, steps=10, **{"train.budget_rollouts": 32})))
    result = rollwise.train(cfg, log=lambda m: None)
    metrics = read_jsonl(result.run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1] and metrics[-1]["cost/rollouts"] == 32
    assert [e["step"] for e in read_jsonl(result.run_dir / "eval.jsonl")] == [0, 2]  # final eval at the stop
    assert (result.run_dir / "checkpoints" / "step-2").is_dir()


def test_token_budget_stops_at_the_first_step_that_reaches_it(tmp_path):
    cfg = load_config(
        overrides=as_sets(
            tiny_overrides(tmp_path, steps=20, **{"train.budget_generated_tokens": 100, "eval.at_start": False})
        )
    )
    result = rollwise.train(cfg, log=lambda m: None)
    gen = [m["cost/generated_tokens"] for m in read_jsonl(result.run_dir / "metrics.jsonl")]
    assert gen[-1] >= 100 and all(g < 100 for g in gen[:-1]) and len(gen) < 20


# ---------------------------------------------------------------- the example sweep


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare") / "example"
    cli.main(["compare", "--config", str(EXAMPLE), "--out-dir", str(out)])
    return out


def test_compare_writes_compare_json(swept):
    c = json.loads((swept / "compare.json").read_text())
    assert c["sweep"]["arms"] == ARMS and c["sweep"]["baseline"] == "grpo" and c["sweep"]["seeds"] == [0, 1]
    assert c["sweep"]["budget"] == {"generated_tokens": 400}
    assert set(c["machine"]) >= {"platform", "cpu", "cores", "torch", "torch_threads"}
    assert "git" in c and c["ci"]["rng_seed"] == 0
    assert list(c["arms"]) == ARMS
    names = {"tokens_to_target", "seconds_to_target", "auc", "final_pass@1", "final_pass@2"}
    for arm, a in c["arms"].items():
        assert set(a["metrics"]) == names and set(a["ratios"]) == names
        for fig in a["metrics"].values():
            assert set(fig["per_seed"]) == {"0", "1"} and len(fig["ci"]) == 2
        assert 0.0 <= a["metrics"]["auc"]["value"] <= 1.0
        for seed, run in a["runs"].items():
            # every run spent the budget: its last step reached 400 tokens, the one before did not
            gen = [m["cost/generated_tokens"] for m in read_jsonl(Path(run["dir"]) / "metrics.jsonl")]
            assert run["stopped_by"] == "budget" and gen[-1] == run["generated_tokens"] >= 400 > gen[-2]
            assert Path(run["dir"]) == swept / f"{arm}-s{seed}"
            assert (
                run["reused_tokens"] == run["verify_tokens"] == 0
            )  # no SPEC-RL arm; present, budgeted beside generation
            assert run["final_pass@1"] == a["metrics"]["final_pass@1"]["per_seed"][seed]
    # the sweep file's target; runs one after another had the machine to themselves
    base = c["arms"]["grpo"]
    t = c["target"]
    assert (t["value"], t["rule"], t["source"], t["reached_at_start_by_every_arm"]) == (
        0.2,
        "absolute 0.2",
        "sweep file (absolute)",
        False,
    )
    assert c["wall_clock"] == {"confounded": False, "reason": None}
    assert base["ratios"]["auc"] == 1.0
    assert (swept / "pass_at_1_vs_tokens.png").stat().st_size > 1000


def test_rerun_skips_finished_runs(swept):
    calls = []
    c = runner.compare(EXAMPLE, out_dir=swept, log=lambda m: None, train_fn=lambda *a, **k: calls.append(a))
    assert calls == [] and list(c["arms"]) == ARMS


def test_a_sweep_sharing_runs_dir_reuses_runs_and_old_configs_gain_new_defaults(swept, tmp_path):
    # a run saved before an option existed (train.epochs dropped from its saved config) still matches
    saved = swept / f"{ARMS[0]}-s0" / "config.resolved.toml"
    data = tomllib.loads(saved.read_text())
    del data["train"]["epochs"]
    saved.write_text(tomli_w.dumps(data))
    other = tomllib.loads(EXAMPLE.read_text())
    other.update(
        name="other",
        runs_dir=str(swept),
        base=str(EXAMPLE.parent / other["base"]) if isinstance(other.get("base"), str) else other.get("base", {}),
    )
    other_path = tmp_path / "other.toml"
    other_path.write_text(tomli_w.dumps(other))
    calls = []
    c = runner.compare(
        other_path, out_dir=tmp_path / "report", log=lambda m: None, train_fn=lambda *a, **k: calls.append(a)
    )
    assert calls == [] and list(c["arms"]) == ARMS  # every run reused from the shared directory
    assert (tmp_path / "report" / "compare.json").is_file() and not (swept / "other").exists()
    assert c["arms"][ARMS[0]]["runs"]["0"]["dir"].startswith(swept.as_posix())


def test_changed_sweep_is_refused_before_training(swept, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["compare", "--config", str(EXAMPLE), "--out-dir", str(swept), "--set", "train.lr=0.001"])
    assert e.value.code == 2
    assert "differs in train.lr" in " ".join(capsys.readouterr().out.split())


def test_interrupted_run_is_resumed(swept):
    """Simulate a kill after step N-1 of grpo-s1: no done marker, its final checkpoint lost."""
    run = swept / "grpo-s1"
    before = read_jsonl(run / "metrics.jsonl")
    last = before[-1]["step"] + 1
    (run / runner.DONE).unlink()
    shutil.rmtree(run / "checkpoints" / f"step-{last}")
    calls = []

    def spy(cfg, **kw):
        calls.append((cfg.run_name(), kw["resume"]))
        return rollwise.train(cfg, **kw)

    runner.compare(EXAMPLE, out_dir=swept, log=lambda m: None, train_fn=spy)
    assert calls == [("grpo-s1", True)]  # only the interrupted run, resumed
    after = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in after] == list(range(last))
    # resumed from step N-1's checkpoint, the last step is redone exactly
    assert [m["cost/generated_tokens"] for m in after] == [m["cost/generated_tokens"] for m in before]
    assert runner.read_done(run)["stopped_by"] == "budget"


def test_bad_sweep_fails_before_training(tmp_path, capsys, monkeypatch):
    from rollwise import components

    monkeypatch.setattr(components, "build_policy", lambda *a, **k: pytest.fail("a model was loaded"))
    sweep = tomllib.loads(EXAMPLE.read_text())
    sweep["arms"][1]["set"]["control.nope"] = 1
    bad = tmp_path / "bad.toml"
    bad.write_text(tomli_w.dumps(sweep))
    with pytest.raises(SystemExit) as e:
        cli.main(["compare", "--config", str(bad), "--out-dir", str(tmp_path / "out")])
    text = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 2 and "dapo-refill" in text and "control.nope" in text and "Traceback" not in text
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_parallel_jobs(tmp_path):
    """Two seeds trained at once in spawned processes (sequential on a one-core machine)."""
    sweep = tomllib.loads(EXAMPLE.read_text())
    sweep.update(arms=[{"name": "grpo"}], budget={"rollouts": 16}, jobs=2)  # one step per run
    path = tmp_path / "par.toml"
    path.write_text(tomli_w.dumps(sweep))
    c = runner.compare(path, out_dir=tmp_path / "out", log=lambda m: None)
    runs = c["arms"]["grpo"]["runs"]
    assert set(runs) == {"0", "1"} and all(r["rollouts"] == 16 and r["stopped_by"] == "budget" for r in runs.values())
    assert c["sweep"]["jobs"] == 2


# ---------------------------------------------------------------- the report in a browser


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


def test_report_renders_every_arm_in_headless_chromium(swept, tmp_path):
    exe = _chromium()
    if exe is None:
        pytest.skip("no chromium binary (Debian: apt-get install -y chromium)")
    page = swept / "report.html"
    proc = subprocess.run(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    assert "<h1>rollwise compare: example</h1>" in dom
    for arm in ARMS:
        assert f'<th class="arm">{arm}' in dom  # the arm's row in the per-arm table
    assert 'src="data:image/png;base64,' in dom


def test_a_target_reached_at_step_0_is_warned_once_everywhere(swept, tmp_path, capsys):
    # target 0.0: every curve starts at pass@1 >= 0, so every arm "reaches" it at its first
    # evaluation, before training (0 tokens); the finished runs are reused, nothing trains
    sweep = tmp_path / "example.toml"
    sweep.write_text(re.sub(r"^target = .*$", "target = 0.0", EXAMPLE.read_text(), count=1, flags=re.M))
    cli.main(["compare", "--config", str(sweep), "--out-dir", str(swept)])
    out = " ".join(capsys.readouterr().out.split())
    c = json.loads((swept / "compare.json").read_text())
    assert len(c["warnings"]) == 1 and c["warnings"][0].startswith(
        "target reached at step 0 by every arm: choose a higher target"
    )
    assert out.count("warning: target reached at step 0 by every arm") == 1
    assert (swept / "report.html").read_text().count(html.escape(c["warnings"][0])) == 1
