"""The HTML report and plot from a hand-made compare.json dict (rollwise.bench.report)."""

import base64
import re

from rollwise.bench import analysis, report


def _compare():
    def ev(pts):
        return [
            {"step": i, "cost/generated_tokens": t, "wall_s": t / 100, "eval/pass@1": p, "eval/pass@4": p}  # noqa: E731
            for i, (t, p) in enumerate(pts)
        ]

    evals = {
        "grpo": {0: ev([(0, 0.1), (100, 0.3)]), 1: ev([(0, 0.1), (100, 0.5)])},
        "<odd & arm>": {0: ev([(0, 0.1), (100, 0.2)]), 1: ev([(0, 0.1), (100, 0.2)])},
    }
    r = analysis.analyse(evals, "grpo", 100.0, [4])
    run = {
        "dir": "runs/x",
        "steps": 3,
        "stopped_by": "budget",
        "generated_tokens": 101,
        "rollouts": 48,
        "wall_s": 1.5,
        "train_s": 1.0,
        "final_pass@1": 0.3,
    }
    arms = {
        name: {"description": "", "set": {}, "runs": {"0": run, "1": dict(run, stopped_by="steps")}, **a}
        for name, a in r["arms"].items()
    }
    return {
        "schema": 1,
        "sweep": {
            "name": "t",
            "file": "t.toml",
            "out_dir": "o",
            "arms": list(arms),
            "baseline": "grpo",
            "seeds": [0, 1],
            "budget": {"generated_tokens": 100},
            "jobs": 1,
        },
        "target": r["target"],
        "auc_tokens": 100.0,
        "ci": analysis.BOOTSTRAP,
        "created": "now",
        "machine": {"cpu": "cpu", "cores": 2, "torch": "2", "torch_threads": 2, "gpu": None, "platform": "linux"},
        "git": None,
        "arms": arms,
    }


def test_report_is_self_contained_and_names_every_arm(tmp_path):
    c = _compare()
    paths = report.write(tmp_path, c, {"grpo": '[run]\nname = "a<b>"\n', "<odd & arm>": "[x]\n"})
    png, page = paths
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = page.read_text()
    # the plot is embedded, byte for byte
    m = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert m and base64.b64decode(m.group(1)) == png.read_bytes()
    # nothing to fetch: no links, scripts, stylesheets or remote sources
    assert not re.search(r"(src|href)=\"(?!data:)", text) and "<script" not in text and "<link" not in text
    # every arm, escaped; configs in <pre>, escaped
    assert "grpo" in text and "&lt;odd &amp; arm&gt;" in text and "<odd & arm>" not in text
    assert '<pre>[run]\nname = "a&lt;b&gt;"\n</pre>' in text.replace("&quot;", '"')
    # a run that stopped at train.steps is flagged
    assert "did not get an equal budget" in text
    # the target (mean of the baseline finals 0.3 and 0.5 = 0.4) is stated; the odd arm never reaches it
    assert "0.4000" in text and "not reached" in text


def test_ratios_are_coloured_and_named_only_where_intervals_separate():
    def ev(pts):
        return [
            {"step": i, "cost/generated_tokens": t, "wall_s": t / 100, "eval/pass@1": p}  # noqa: E731
            for i, (t, p) in enumerate(pts)
        ]

    evals = {
        "base": {0: ev([(0, 0.1), (100, 0.3)]), 1: ev([(0, 0.1), (100, 0.5)])},
        "close": {0: ev([(0, 0.1), (100, 0.35)]), 1: ev([(0, 0.1), (100, 0.45)])},  # inside the baseline's interval
        "high": {0: ev([(0, 0.1), (100, 0.8)]), 1: ev([(0, 0.1), (100, 0.9)])},
    }  # wholly above it
    r = analysis.analyse(evals, "base", 100.0, [], target=0.2)
    assert (
        r["arms"]["close"]["separation"]["final_pass@1"] == 0 and r["arms"]["high"]["separation"]["final_pass@1"] == 1
    )
    assert r["arms"]["base"]["separation"] == {n: 0 for n in r["arms"]["base"]["metrics"]}
    cells = {
        arm: report._ratio("final_pass@1", a["ratios"]["final_pass@1"], a["separation"]["final_pass@1"])
        for arm, a in r["arms"].items()
    }
    assert "better" not in cells["close"] and "worse" not in cells["close"] and "intervals overlap" in cells["close"]
    assert "class=better" in cells["high"] and "better" in cells["high"].split(">", 1)[1]
    # lower is better for tokens to target: an arm wholly below the baseline is better, wholly above worse
    assert "class=better" in report._ratio("tokens_to_target", 0.5, -1) and "class=worse" in report._ratio(
        "tokens_to_target", 2.0, 1
    )
    # a compare.json written before separations existed is never coloured
    assert "class=same" in report._ratio("auc", 3.0, None)


def test_separation_treats_an_unreached_bound_as_infinite():
    reached = {"ci": [100.0, 200.0]}
    assert analysis.separation({"ci": [None, None]}, reached) == 1  # never reaches: wholly above (more tokens)
    assert analysis.separation({"ci": [150.0, None]}, reached) == 0  # overlaps
    assert analysis.separation({"ci": [10.0, 50.0]}, reached) == -1


def test_redraw_reads_compare_json_and_the_first_seeds_resolved_config(tmp_path):
    import json

    import pytest

    from rollwise.registry import UserError

    c = _compare()
    c["arms"]["grpo"]["runs"]["0"] = dict(c["arms"]["grpo"]["runs"]["0"], dir="elsewhere/grpo-s0")
    (tmp_path / "compare.json").write_text(json.dumps(c))
    (tmp_path / "grpo-s0").mkdir()  # found under the output directory by the run directory's name
    (tmp_path / "grpo-s0" / "config.resolved.toml").write_text('[run]\nname = "grpo-s0"\n')
    png, page = report.redraw(tmp_path)
    text = page.read_text().replace("&quot;", '"')
    assert png.name == report.PLOT and page.name == report.REPORT
    assert '<pre>[run]\nname = "grpo-s0"\n</pre>' in text
    assert "<pre>(not shown: runs/x/config.resolved.toml is not here)</pre>" in text  # the other arm's run is absent
    with pytest.raises(UserError, match="compare.json not found"):
        report.redraw(tmp_path / "none")


def test_a_compare_json_without_separation_shows_the_ratio_uncoloured():
    c = _compare()
    for a in c["arms"].values():
        del a["separation"]
    text = report.html(c, b"png", {})
    assert "intervals overlap" not in text and "class=better" not in text and "class=worse" not in text
    assert "<span class=same>×1.00</span>" in text  # the baseline against itself
