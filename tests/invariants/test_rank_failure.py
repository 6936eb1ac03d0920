"""Invariant (issue #40 item 7): a training step that fails on one data-parallel rank ends every
rank with that rank's message, instead of leaving the others waiting in a collective.

Two processes (gloo, CPU, started as in tests/invariants/test_data_parallel.py) train the tiny
Llama of tests/invariants/test_fsdp.py on its fixed 6-row batch (rank 0: rows 0-2, rank 1: rows
3-5), three cases in turn, each with a real fault on one rank:

- FSDP, the memory check on rank 0: its trainer saw 1 byte available when training began, so
  ``device.check_activations`` refuses its first pass (a ``UserError``);
- FSDP, a bad batch: row 0 (rank 0's) holds a token id beyond the model's embedding;
- plain data parallel, the memory check on rank 1.

The failing rank stays alive after its error (a caller that handles it) until every rank has
written its outcome: before the fix, the other rank waited in the pass's collectives for as long as
the failing process lived, so the spawn's ``TIMEOUT`` fails the test instead of hanging the suite.
"""

import dataclasses
import json
import time
from pathlib import Path

import pytest
from test_data_parallel import _dp, _spawn
from test_fsdp import _batch, _trainer

TIMEOUT = 150  # seconds for both ranks, torch's start included; a rank left waiting meets the 120 s gloo timeout
CASES = (("memory", True, 0), ("bad_batch", True, 0), ("memory_dp", False, 1))  # (case, FSDP, failing rank)


def _rank(rank, out_dir):
    out = Path(out_dir)
    dp = _dp()
    for case, fsdp, failing in CASES:
        model, batch = _batch(6)
        trainer = _trainer(model, dp, 3, fsdp)
        if case.startswith("memory") and rank == failing:
            trainer._host_available = 1  # memory available at the first pass: 1 byte (device.check_activations)
        if case == "bad_batch":
            ids = batch.input_ids.clone()
            ids[0, 1] = 10**6
            batch = dataclasses.replace(batch, input_ids=ids)
        try:
            trainer.optimize(batch)
            outcome = {"error": None}
        except Exception as e:
            outcome = {"error": type(e).__name__, "message": str(e)}
        (out / f"{case}.{rank}.json").write_text(json.dumps(outcome))
        while not all((out / f"{case}.{r}.json").exists() for r in range(2)):  # alive until both have ended
            time.sleep(0.05)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    d = tmp_path_factory.mktemp("rank_failure")
    _spawn(_rank, str(d), timeout=TIMEOUT)
    return {case: [json.loads((d / f"{case}.{r}.json").read_text()) for r in range(2)] for case, _, _ in CASES}


@pytest.mark.parametrize("case", ["memory", "memory_dp"])
def test_the_memory_check_on_one_rank_stops_every_rank_with_its_message(outcomes, case):
    failing = dict((c, f) for c, _, f in CASES)[case]
    for o in outcomes[case]:
        assert o["error"] == "UserError"
        assert o["message"].startswith(
            f"stopped on all 2 data-parallel ranks: rank {failing}: a training pass of 3 rows"
        )
        assert "lower train.micro_batch" in o["message"] and "rank " + str(1 - failing) + ":" not in o["message"]


def test_a_bad_batch_on_one_rank_stops_every_rank_with_its_message(outcomes):
    for o in outcomes["bad_batch"]:
        assert o["error"] == "RuntimeError"
        assert "rank 0: ValueError: batch rows 0-2 hold token id 1000000, outside the model's" in o["message"]
