"""Ledger.truncate after a kill: a last line cut short is dropped, the rest kept by step, and the
file is replaced atomically (never left half-written)."""

import json

from rollwise.ledger import Ledger


def test_truncate_drops_a_cut_last_line_and_later_steps(tmp_path, monkeypatch):
    led = Ledger(tmp_path)
    led.metrics_path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(5)) + '{"step": 5, "rew')
    led.eval_path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (0, 3, 5)))
    led.truncate(3)  # resumed from checkpoint step-3: metrics steps 0..2 stay, evals at steps <= 3
    assert [json.loads(ln)["step"] for ln in led.metrics_path.read_text().splitlines()] == [0, 1, 2]
    assert [json.loads(ln)["step"] for ln in led.eval_path.read_text().splitlines()] == [0, 3]
    assert not list(tmp_path.glob("*.tmp"))


def test_truncate_is_atomic(tmp_path, monkeypatch):
    import os

    led = Ledger(tmp_path)
    original = "".join(json.dumps({"step": s}) + "\n" for s in range(4))
    led.metrics_path.write_text(original)

    def killed(src, dst):  # the process dies between writing the new file and the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    try:
        led.truncate(2)
    except KeyboardInterrupt:
        pass
    assert led.metrics_path.read_text() == original  # the old file is whole
