"""``rollwise compare`` from finished runs written by hand (nothing trains): wall-clock figures of
runs that shared the machine are marked confounded, every warning reaches the terminal once and
compare.json and report.html, and a target every arm reaches at step 0 is said to be one."""

import html
import json
import re
from pathlib import Path

import pytest

from rollwise import cli
from rollwise.bench import analysis, runner
from rollwise.bench.sweep import load_sweep, plan
from rollwise.config import to_toml

EXAMPLE = Path(__file__).resolve().parents[2] / "benchmarks" / "example_sweep.toml"


def _finished_sweep(tmp_path, pass1, sessions, target=None, jobs=1):
    """The example sweep's runs as if they had run: ``pass1[arm]`` = (start, end) pass@1 of every
    seed, ``sessions(i)`` = (start, end) unix seconds of the i-th run."""
    # the sweep's own target, replaced (None: the default, gain:0.75 of the baseline's mean curve)
    text = re.sub(
        r"^target = .*$", "" if target is None else f"target = {target}", EXAMPLE.read_text(), count=1, flags=re.M
    )
    sweep_path = tmp_path / "example.toml"
    sweep_path.write_text(text)
    out = tmp_path / "out"
    for i, s in enumerate(plan(load_sweep(sweep_path), out)):
        s.dir.mkdir(parents=True)
        (s.dir / "config.resolved.toml").write_text(to_toml(s.cfg))
        p0, p1 = pass1[s.arm] if isinstance(pass1[s.arm], tuple) else pass1[s.arm][s.seed]  # or one pair per seed
        evals = [
            {
                "step": st,
                "cost/generated_tokens": tok,
                "wall_s": w,
                "time/eval_s": 0.0,
                "eval/pass@1": p,
                "eval/pass@2": p,
            }
            for st, tok, w, p in ((0, 0, 0.0, p0), (5, 420 + 10 * s.seed, 10.0 + s.seed, p1))
        ]
        (s.dir / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
        start, end = sessions(i)
        (s.dir / runner.DONE).write_text(
            json.dumps(
                {
                    "steps": 5,
                    "totals": {"generated_tokens": evals[-1]["cost/generated_tokens"], "rollouts": 80},
                    "stopped_by": "budget",
                    "final_eval": evals[-1],
                    "session_s": end - start,
                    "started_unix": start,
                    "finished_unix": end,
                    "jobs": jobs,
                    "finished_at": "2026-01-01T00:00:00+0000",
                }
            )
        )
    return sweep_path, out


ONE_AFTER_ANOTHER = staticmethod(lambda i: (1000.0 + 20 * i, 1015.0 + 20 * i))
AT_ONCE = staticmethod(lambda i: (1000.0 + i, 1015.0 + i))  # every run overlaps the next


def _run_cli(sweep_path, out, capsys):
    cli.main(["compare", "--config", str(sweep_path), "--out-dir", str(out)])
    terminal = " ".join(capsys.readouterr().out.split())
    return terminal, json.loads((out / "compare.json").read_text()), (out / "report.html").read_text()


def test_wall_clock_of_runs_that_shared_the_machine_is_confounded(tmp_path, capsys):
    # dapo-refill learns much more: with its runs overlapping the baseline's, seconds say nothing
    sweep_path, out = _finished_sweep(tmp_path, {"grpo": (0.1, 0.3), "dapo-refill": (0.1, 0.9)}, AT_ONCE, target=0.25)
    terminal, c, page = _run_cli(sweep_path, out, capsys)
    arm = c["arms"]["dapo-refill"]
    assert c["wall_clock"]["confounded"] is True and "at the same time" in c["wall_clock"]["reason"]
    assert arm["confounded"] == {"seconds_to_target": analysis.CONFOUNDED}
    assert arm["ratios"]["seconds_to_target"] is None and arm["separation"]["seconds_to_target"] is None
    assert arm["ratios"]["tokens_to_target"] is not None  # tokens are not confounded
    # the report's seconds cells: marked, uncoloured, neither better nor worse (faster nor slower)
    rows = re.findall(
        r"<tr><th class=arm>.*?</tr>", page.split("<h2>Per arm</h2>")[1].split("<tbody>")[1].split("</tbody>")[0], re.S
    )
    sec_cells = [re.findall(r"<td.*?</td>", r, re.S)[1] for r in rows]
    for cell in sec_cells:
        assert "confounded (runs shared the machine)" in cell
        assert not re.search(r"better|worse|faster|slower|class=(better|worse)", cell)
    assert "seconds to target" in terminal and terminal.count("confounded (runs shared the machine)") >= 2
    assert [w for w in c["warnings"] if "confounded" in w] == c["warnings"][-1:]  # warned, once
    assert page.count("warning:</strong> wall-clock figures are confounded") == 1


def test_runs_one_after_another_are_compared_in_seconds(tmp_path, capsys):
    sweep_path, out = _finished_sweep(
        tmp_path, {"grpo": (0.1, 0.3), "dapo-refill": (0.1, 0.9)}, ONE_AFTER_ANOTHER, target=0.25
    )
    _, c, page = _run_cli(sweep_path, out, capsys)
    assert c["wall_clock"] == {"confounded": False, "reason": None} and c["warnings"] == []
    assert (
        c["arms"]["dapo-refill"]["ratios"]["seconds_to_target"] is not None
        and "confounded (runs" not in page.split("<h2>Runs")[0].split("<tbody>")[1]
    )


def test_jobs_above_one_is_shared_even_without_overlap():
    sessions = {"a-s0": {"start": 0.0, "end": 1.0, "jobs": 2}, "a-s1": {"start": 5.0, "end": 6.0, "jobs": 2}}
    assert "jobs > 1" in analysis.shared_machine(sessions)
    assert (
        analysis.shared_machine(
            {"a": {"start": 0.0, "end": 10.0}, "b": {"start": 1.0, "end": 2.0}, "c": {"start": 20.0, "end": 30.0}}
        )
        == "runs a and b ran at the same time"
    )
    assert analysis.shared_machine({"a": {"start": 0.0, "end": 1.0}, "b": {"start": 1.0, "end": 2.0}}) is None
    # an older done.json: the interval from finished_at and session_s
    s = runner.session({"finished_at": "2026-01-01T00:01:40+0000", "session_s": 40.0})
    assert s["end"] - s["start"] == 40.0 and s["jobs"] == 1


def test_every_warning_is_printed_once_and_written_to_compare_json_and_the_report(tmp_path, capsys):
    # the baseline learns nothing (its final pass@1 equals its first), dapo-refill learns: the
    # default target is reached by the baseline at 0 tokens
    sweep_path, out = _finished_sweep(tmp_path, {"grpo": (0.3, 0.3), "dapo-refill": (0.1, 0.9)}, ONE_AFTER_ANOTHER)
    terminal, c, page = _run_cli(sweep_path, out, capsys)
    assert len(c["warnings"]) == 1 and "at 0 generated tokens" in c["warnings"][0]
    body = page.split("</dl>")[0]  # the warnings stand at the top, before the sweep's description ends
    for w in c["warnings"]:
        assert terminal.count(" ".join(w.split())) == 1  # once on the terminal
        assert page.count(html.escape(w)) == 1 and html.escape(w) in body


def test_a_target_every_arm_reaches_at_step_0_is_said_to_be_one(tmp_path, capsys):
    sweep_path, out = _finished_sweep(
        tmp_path, {"grpo": (0.2, 0.3), "dapo-refill": (0.2, 0.9)}, ONE_AFTER_ANOTHER, target=0.1
    )
    terminal, c, page = _run_cli(sweep_path, out, capsys)
    msg = "target reached at step 0 by every arm: choose a higher target"
    assert c["target"]["reached_at_start_by_every_arm"] is True
    assert len(c["warnings"]) == 1 and c["warnings"][0].startswith(msg)
    assert msg in terminal and "tokens to target 0" not in terminal
    rows = page.split("<h2>Per arm</h2>")[1].split("<h2>Runs</h2>")[0]
    assert rows.count(msg) == 2 * 2  # tokens and seconds, each arm
    assert not re.search(r"<td>0 <span class=ci>", rows)  # no "0 tokens to target"


def test_rollwise_report_redraws_the_same_files_from_compare_json(tmp_path, capsys):
    sweep_path, out = _finished_sweep(
        tmp_path, {"grpo": (0.1, 0.3), "dapo-refill": (0.1, 0.9)}, ONE_AFTER_ANOTHER, target=0.25
    )
    _run_cli(sweep_path, out, capsys)
    page, png = (out / "report.html").read_bytes(), (out / "pass_at_1_vs_tokens.png").read_bytes()
    (out / "report.html").unlink()
    (out / "pass_at_1_vs_tokens.png").unlink()
    cli.main(["report", str(out)])
    assert "report.html" in capsys.readouterr().out
    assert (out / "report.html").read_bytes() == page and (out / "pass_at_1_vs_tokens.png").read_bytes() == png


def test_a_target_the_baseline_misses_in_some_seeds_is_warned_and_savings_are_paired_by_seed(tmp_path, capsys):
    # grpo: seed 0 0.1 -> 0.5 at 420 tokens, seed 1 0.1 -> 0.3 at 430; mean curve 0.1 -> 0.4 (both flat after
    # their last point), so the default gain:0.75 target is 0.1 + 0.75 * 0.3 = 0.325: seed 0 reaches it at
    # 0.225 / 0.4 * 420 = 236.25 tokens, seed 1 never (0.3 at most)
    # dapo-refill: 0.1 -> 0.9 in both seeds: 0.225 / 0.8 * 420 = 118.125 and 0.225 / 0.8 * 430 = 120.9375
    pass1 = {"grpo": {0: (0.1, 0.5), 1: (0.1, 0.3)}, "dapo-refill": (0.1, 0.9)}
    sweep_path, out = _finished_sweep(tmp_path, pass1, ONE_AFTER_ANOTHER)
    terminal, c, page = _run_cli(sweep_path, out, capsys)
    t = c["target"]
    assert t["rule"] == "gain:0.75" and t["value"] == pytest.approx(0.325) and t["baseline_seeds_reached"] == "1/2"
    (w,) = c["warnings"]
    assert w.startswith("the baseline 'grpo' reaches the target 0.325 in 1 of 2 seeds")
    assert terminal.count(" ".join(w.split())) == 1 and page.count(html.escape(w)) == 1
    assert "target pass@1 0.325 (rule gain:0.75" in terminal and "rule gain:0.75" in page
    fig = c["arms"]["dapo-refill"]["paired"]["tokens_to_target"]
    # seed 0: 236.25 / 118.125 = 2 exactly; seed 1: grpo never reached it after 430 tokens: >= 430 / 120.9375
    assert [(p["bound"], p["saving"]) for p in fig["per_seed"].values()] == [
        ("exact", pytest.approx(2.0)),
        ("at least", pytest.approx(430 / 120.9375)),
    ]
    assert fig["value"] == pytest.approx((2 * 430 / 120.9375) ** 0.5)
    # lower end at the worst (seed 1 at its bound): resampled means 2 (1/4 of draws), ... -> 2; upper end open
    assert fig["ci"] == [pytest.approx(2.0), None] and fig["separation"] == 1
    assert c["arms"]["grpo"]["paired"] == {} and c["paired"] == analysis.PAIRED
    assert "paired saving x2.67 [2.00, open] separated" in terminal
    table = page.split("<h2>Paired by seed: tokens to target</h2>")[1].split("<h2>Runs</h2>")[0]
    assert "×2.67 <span class=ci>[2.00, open]</span>" in table and "s0 ×2.00, s1 ≥×3.56" in table
    assert "separated: fewer tokens" in table
