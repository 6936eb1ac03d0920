"""The HTML report and plot from a hand-made compare.json dict (rollwise.bench.report)."""

import base64
import re

from rollwise.bench import analysis, report


def _compare():
    ev = lambda pts: [{"step": i, "cost/generated_tokens": t, "wall_s": t / 100, "eval/pass@1": p, "eval/pass@4": p}  # noqa: E731
                      for i, (t, p) in enumerate(pts)]
    evals = {"grpo": {0: ev([(0, 0.1), (100, 0.3)]), 1: ev([(0, 0.1), (100, 0.5)])},
             "<odd & arm>": {0: ev([(0, 0.1), (100, 0.2)]), 1: ev([(0, 0.1), (100, 0.2)])}}
    r = analysis.analyse(evals, "grpo", 100.0, [4])
    run = {"dir": "runs/x", "steps": 3, "stopped_by": "budget", "generated_tokens": 101, "rollouts": 48, "wall_s": 1.5,
           "train_s": 1.0, "final_pass@1": 0.3}
    arms = {name: {"description": "", "set": {}, "runs": {"0": run, "1": dict(run, stopped_by="steps")}, **a}
            for name, a in r["arms"].items()}
    return {"schema": 1, "sweep": {"name": "t", "file": "t.toml", "out_dir": "o", "arms": list(arms), "baseline": "grpo",
                                   "seeds": [0, 1], "budget": {"generated_tokens": 100}, "jobs": 1},
            "target": r["target"], "auc_tokens": 100.0, "ci": analysis.BOOTSTRAP, "created": "now",
            "machine": {"cpu": "cpu", "cores": 2, "torch": "2", "torch_threads": 2, "gpu": None, "platform": "linux"},
            "git": None, "arms": arms}


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
