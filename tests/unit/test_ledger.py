import json

from rollwise.generate.common import StepCost
from rollwise.ledger import Ledger, read_jsonl


def test_costs_are_cumulative_and_eval_is_not_charged(tmp_path):
    led = Ledger(tmp_path)
    led.record(
        0, 1, StepCost(generated_tokens=10, rollouts=4, verifier_calls=4), trained_tokens=8, extra={"reward/mean": 0.5}
    )
    led.record_eval(1, {"eval/pass@1": 0.25})
    led.record(
        1, 2, StepCost(generated_tokens=5, rollouts=4, verifier_calls=4, unverified=1), trained_tokens=3, extra={}
    )
    m = read_jsonl(tmp_path / "metrics.jsonl")
    assert [x["cost/generated_tokens"] for x in m] == [10, 15]
    assert [x["cost/trained_tokens"] for x in m] == [8, 11]
    assert m[1]["cost/unverified"] == 1 and m[1]["cost/rollouts"] == 8
    e = read_jsonl(tmp_path / "eval.jsonl")
    assert e == [dict(e[0], step=1, **{"cost/generated_tokens": 10, "eval/pass@1": 0.25})]


def test_truncate_drops_lines_after_checkpoint(tmp_path):
    led = Ledger(tmp_path)
    for s in range(5):
        led.record(s, s + 1, StepCost(), 0, {})
        led.record_eval(s + 1, {})
    led.truncate(3)
    assert [x["step"] for x in read_jsonl(tmp_path / "metrics.jsonl")] == [0, 1, 2]
    assert [x["step"] for x in read_jsonl(tmp_path / "eval.jsonl")] == [1, 2, 3]


def test_state_roundtrip_keeps_totals_and_wall_time(tmp_path):
    led = Ledger(tmp_path)
    led.record(0, 1, StepCost(generated_tokens=7), 2, {})
    s = json.loads(json.dumps(led.state_dict()))
    other = Ledger(tmp_path)
    other.load_state_dict(s)
    assert other.totals == led.totals and other.wall_s() >= s["wall_s"]
