"""Verifier calls in the local pool: run in parallel with ``verify_workers``, per-outcome counts in
the ledger, and a code task end to end in the training loop."""

import json
import threading

from rollwise.backends.scripted import ScriptedBackend
from rollwise.distributed.local import LocalPool
from rollwise.generate.common import StepCost, outcome_counts
from rollwise.tokens import Codec
from rollwise.trainer.tiny import char_tokenizer
from rollwise.types import Plan, Prompt, Request, Sampling, Verdict


def _pool(verify, workers):
    tok = char_tokenizer()
    backend = ScriptedBackend(lambda seq, i: tok.encode("x + 7"), tok.eos_token_id)
    return LocalPool(backend, Codec(tok, use_chat=False), verify, Sampling(max_new_tokens=8), verify_workers=workers)


def test_two_workers_verify_concurrently():
    # each call waits until a second call is inside the verifier too: with one thread at a
    # time the barrier would time out (BrokenBarrierError); with two workers all four pass
    barrier = threading.Barrier(2, timeout=30)
    names = set()

    def verify(prompt, text):
        barrier.wait()
        names.add(threading.current_thread().name)
        return Verdict(1.0 if text == "x + 7" else 0.0, "correct")

    pool = _pool(verify, workers=2)
    out = pool.rollouts(Plan((Request(Prompt("a", "t", "def add_7(x): return ", None), 4),)), version=0)
    assert [r.verdict.reason for _, r in out] == ["correct"] * 4
    assert len(names) == 2 and all(n.startswith("rollwise-verify") for n in names)
    cost = pool.take_cost()
    assert cost.verifier_calls == 4 and cost.metrics["verify/correct"] == 4


def test_outcome_counts_by_hand():
    vs = [
        Verdict(1.0, "correct", {"isolation": "bwrap"}),
        Verdict(0.0, "timeout", {"isolation": "bwrap"}),
        Verdict(1.0, "correct", {"isolation": "bwrap", "cached": True}),
        Verdict(None, "sandbox_error", {"isolation": "rlimit"}),
        Verdict(0.0, "wrong"),
        None,
    ]
    # correct 2, timeout 1, sandbox_error 1, wrong 1, none 1; bwrap 3, rlimit 1; cached 1
    assert outcome_counts(vs) == {
        "verify/correct": 2,
        "verify/timeout": 1,
        "verify/sandbox_error": 1,
        "verify/wrong": 1,
        "verify/none": 1,
        "verify/isolation_bwrap": 3,
        "verify/isolation_rlimit": 1,
        "verify/cached": 1,
    }
    cost = StepCost()
    cost.charge(10, 6, vs, 0.0, 0.0)
    cost.charge(2, 1, [Verdict(0.0, "timeout")], 0.0, 0.0)
    assert cost.metrics["verify/timeout"] == 2 and cost.unverified == 2  # the sandbox error and the missing verdict


def test_pyfunc_training_run_records_sandbox_and_outcomes(tmp_path):
    from conftest import as_sets, tiny_overrides
    from rollwise.config import load_config
    from rollwise.loop import train

    o = tiny_overrides(tmp_path, name="pf", steps=2)
    o["task.name"] = "pyfunc"
    o["task.options"] = {"levels": [1], "n_heldout": 4, "workers": 2}
    o["sampling.max_new_tokens"] = 12
    logs = []
    res = train(load_config(overrides=as_sets(o)), log=logs.append)
    assert any(line.startswith("code sandbox: ") for line in logs)  # the run's log says which isolation
    lines = [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    calls = [lines[0]["cost/verifier_calls"], lines[1]["cost/verifier_calls"] - lines[0]["cost/verifier_calls"]]
    for line, n in zip(lines, calls):
        iso = {k: v for k, v in line.items() if k.startswith("verify/isolation_")}
        assert sum(iso.values()) == n == 16  # every verdict of the step (4 prompts x 4 rollouts) says where it ran
        outcomes = {
            k: v
            for k, v in line.items()
            if k.startswith("verify/") and not k.startswith("verify/isolation_") and k != "verify/cached"
        }
        assert sum(outcomes.values()) == n
        assert line["time/verify_s"] >= 0.0
        # the ledger says where the code ran and whether the kernel confined it (issue #40)
        assert line["sandbox/isolation"] in ("bwrap", "rlimit") and line["sandbox/unsafe"] is False
        assert isinstance(line["sandbox/confined"], bool)
