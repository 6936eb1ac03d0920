"""Invariant: Ray rollout workers give the same run as the local pool (DESIGN.md §8).

With per-request seeds (``distributed.request_seeds``; always on for the Ray pool) a run on 2 Ray
workers has the same groups, rewards, costs and final weights as the local pool in this process,
and so does a run whose worker is killed mid-run (it is restarted, its requests are generated
again, nothing is charged twice). Generation runs with 1 torch thread on both sides
(``run.threads = 1`` = ``distributed.cpus_per_worker``), so the float results agree bit for bit.
"""

import gc
import importlib.util
import json

import pytest
import torch

from conftest import as_sets, tiny_overrides
from rollwise.config import load_config
from rollwise.loop import train

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray not installed (rollwise[ray])")


def _run(tmp_path, name, **extra):
    o = tiny_overrides(tmp_path, name=name, steps=3, **{"run.threads": 1, "distributed.cpus_per_worker": 1,
                                                         "run.checkpoint_every": 3, "eval.every": 3, **extra})
    res = train(load_config(overrides=as_sets(o)), log=lambda *a: None)
    gc.collect()  # the run's Ray actors go with its pool
    return res


def _lines(path):
    return [{k: v for k, v in json.loads(x).items() if k != "wall_s" and not k.startswith("time/")}
            for x in path.read_text().splitlines()]


def _weights(run_dir):
    from safetensors.torch import load_file

    (ckpt,) = sorted((run_dir / "checkpoints").glob("step-*"))
    return load_file(ckpt / "model.safetensors")


def _same(a, b):
    assert _lines(a.run_dir / "metrics.jsonl") == _lines(b.run_dir / "metrics.jsonl")
    assert _lines(a.run_dir / "eval.jsonl") == _lines(b.run_dir / "eval.jsonl")
    wa, wb = _weights(a.run_dir), _weights(b.run_dir)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("local"), "local", **{"distributed.request_seeds": True})


def test_two_ray_workers_equal_the_local_pool(local, tmp_path):
    ray_run = _run(tmp_path, "ray", **{"distributed.workers": 2})
    _same(local, ray_run)
    lines = [json.loads(x) for x in (ray_run.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(line["time/weight_sync_s"] > 0 for line in lines)  # weights were pushed after every step
    assert lines[-1]["cost/rollouts"] == 3 * 4 * 4  # 3 steps x 4 prompts x 4 rollouts, each charged once


def test_a_killed_worker_is_restarted_and_nothing_is_lost_or_charged_twice(local, tmp_path, monkeypatch):
    """Worker 0 is killed before the second step's generation: the call fails on it, it is
    restarted with the current weights and its share is generated again; the run equals the
    local one (same rewards, same cost/* counters, same weights)."""
    import ray

    from rollwise.distributed.ray_pool import RayPool

    seen = {"calls": 0, "restarts": None}
    real = RayPool.rollouts

    def rollouts(self, plan, version, sampling=None, generator=None, charge=True):
        if charge:
            seen["calls"] += 1
            if seen["calls"] == 2:
                ray.kill(self.actors[0])
        out = real(self, plan, version, sampling, generator, charge)
        seen["restarts"] = self.restarts
        return out

    monkeypatch.setattr(RayPool, "rollouts", rollouts)
    killed = _run(tmp_path, "killed", **{"distributed.workers": 2})
    assert seen["restarts"] == 1
    _same(local, killed)


def test_request_split_balances_rollouts():
    from rollwise.distributed.ray_pool import split

    # sizes 4, 4, 1, 1 on 2 workers: 4 -> w0, 4 -> w1 (w0 has 4), 1 -> w0 (tie, lowest), 1 -> w1
    assert split("abcd", [4, 4, 1, 1], 2) == [[0, 2], [1, 3]]
    # 3 workers, sizes 5, 1, 1, 1: w0=5, w1=1, w2=1, then w1 (1 <= 1, lowest) -> loads 5, 2, 1
    assert split("abcd", [5, 1, 1, 1], 3) == [[0], [1, 3], [2]]
