"""Invariant: Ray rollout workers give the same run as the local pool (docs/architecture.md §8).

With per-request seeds (``distributed.request_seeds``; always on for the Ray pool) a run on 2 Ray
workers has the same groups, rewards, costs and final weights as the local pool in this process,
and so does a run whose worker is killed mid-run (it is restarted, its requests are generated
again, nothing is charged twice); a worker killed while generating also has the tokens it had
reported charged, once. Generation runs with 1 torch thread on both sides
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
    o = tiny_overrides(
        tmp_path,
        name=name,
        steps=3,
        **{"run.threads": 1, "distributed.cpus_per_worker": 1, "run.checkpoint_every": 3, "eval.every": 3, **extra},
    )
    res = train(load_config(overrides=as_sets(o)), log=lambda *a: None)
    gc.collect()  # the run's Ray actors go with its pool
    return res


EPISODE_SECONDS = ("episodes/tool_s", "episodes/env_s", "episodes/waiting_s")  # wall-clock, like time/*


def _lines(path):
    return [
        {k: v for k, v in json.loads(x).items() if k != "wall_s" and not k.startswith(("time/", *EPISODE_SECONDS))}
        for x in path.read_text().splitlines()
    ]


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
    import ray

    ray_run = _run(tmp_path, "ray", **{"distributed.workers": 2})
    assert not ray.is_initialized()  # the run stopped the Ray it started, its workers first (issue #47)
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


def test_a_worker_killed_while_generating_charges_its_tokens_once_and_trains_nothing_twice(tmp_path, monkeypatch):
    """Worker 0's process is SIGKILLed in the middle of generating step 1's share: after it has
    reported decoded tokens, before it returned its requests. It is restarted and its unreturned
    requests are generated again with their seeds, so the run trains what the local run trains
    (same rewards, rollouts, trained tokens and final weights: nothing lost, nothing twice), and
    the tokens it had reported are charged once on top (``ray/lost_tokens``)."""
    import os
    import signal
    import threading
    import time

    import ray

    from rollwise.distributed.ray_pool import RayPool

    long = {
        "model.warm_start.steps": 0,
        "sampling.max_new_tokens": 48,
    }  # an untrained model rarely stops: long generations
    local = _run(tmp_path, "local", **{"distributed.request_seeds": True, **long})
    seen = {"calls": 0, "restarts": None, "reported": None}
    real = RayPool.rollouts

    def rollouts(self, plan, version, sampling=None, generator=None, charge=True):
        if charge:
            seen["calls"] += 1
            if seen["calls"] == 2:
                pid = ray.get(self.actors[0].pid.remote())
                self.reported = {}

                def kill_while_generating():
                    deadline = time.time() + 120
                    while not self.reported.get(0) and time.time() < deadline:
                        time.sleep(0.0005)
                    seen["reported"] = self.reported.get(0)
                    os.kill(pid, signal.SIGKILL)

                threading.Thread(target=kill_while_generating, daemon=True).start()
        out = real(self, plan, version, sampling, generator, charge)
        seen["restarts"] = self.restarts
        return out

    monkeypatch.setattr(RayPool, "rollouts", rollouts)
    killed = _run(tmp_path, "killed", **{"distributed.workers": 2, **long})
    assert seen["reported"] and seen["restarts"] == 1  # killed mid-generation, restarted once
    a = [json.loads(x) for x in (local.run_dir / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (killed.run_dir / "metrics.jsonl").read_text().splitlines()]
    lost = [ln.get("ray/lost_tokens", 0) for ln in b]
    assert lost[0] == lost[2] == 0 and lost[1] >= seen["reported"]  # charged in the step it happened, once
    assert [x["cost/generated_tokens"] + sum(lost[: i + 1]) for i, x in enumerate(a)] == [
        x["cost/generated_tokens"] for x in b
    ]

    def trained(lines):
        return [
            {
                k: v
                for k, v in ln.items()
                if k != "wall_s" and not k.startswith(("time/", "ray/", "cost/generated_tokens"))
            }
            for ln in lines
        ]

    assert trained(a) == trained(b)  # same rewards, rollouts, verifier calls, trained tokens
    ea, eb = _lines(local.run_dir / "eval.jsonl"), _lines(killed.run_dir / "eval.jsonl")
    assert [e.pop("cost/generated_tokens") + sum(lost[: e["step"]]) for e in ea] == [
        e.pop("cost/generated_tokens") for e in eb
    ]
    assert ea == eb  # evaluation is never charged, and sees the same weights
    wa, wb = _weights(local.run_dir), _weights(killed.run_dir)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_request_split_balances_rollouts():
    from rollwise.distributed.ray_pool import split

    # sizes 4, 4, 1, 1 on 2 workers: 4 -> w0, 4 -> w1 (w0 has 4), 1 -> w0 (tie, lowest), 1 -> w1
    assert split("abcd", [4, 4, 1, 1], 2) == [[0, 2], [1, 3]]
    # 3 workers, sizes 5, 1, 1, 1: w0=5, w1=1, w2=1, then w1 (1 <= 1, lowest) -> loads 5, 2, 1
    assert split("abcd", [5, 1, 1, 1], 3) == [[0], [1, 3], [2]]


def test_ray_workers_run_episodes_like_the_local_pool(tmp_path):
    """guess_number (multi-turn, rollwise.envs.guess): each Ray worker runs an episode pool and the
    environments in its own process; with request seeds the run equals the local episode pool's."""
    episodes = {
        "task.name": "guess_number",
        "task.options": {"n_train": 32, "n_heldout": 8},
        "task.max_turns": 4,
        "sampling.max_new_tokens": 4,
        "model.warm_start.steps": 20,
        "eval.n_prompts": 4,
    }
    here = _run(tmp_path, "local", **{**episodes, "distributed.request_seeds": True})
    there = _run(tmp_path, "ray", **{**episodes, "distributed.workers": 2})
    _same(here, there)
    lines = [json.loads(x) for x in (there.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(line["episodes/count"] == 4 * 4 and line["episodes/turns"] >= 16 for line in lines)


def test_without_an_address_a_run_starts_its_own_ray_beside_a_running_cluster(tmp_path):
    """`ray start --head` left running (the README's Ray line) and then a run without distributed.address
    (the README's async line): the run starts a Ray of its own instead of failing to join that cluster
    ("num_cpus and num_gpus must not be provided")."""
    import os
    import shutil
    import signal
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    import ray

    from rollwise.config import DistributedConfig
    from rollwise.distributed.ray_pool import connect

    ray_cli = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    # a cluster in the foreground (--block), in its own process group: stopped below without `ray stop`,
    # which would stop every Ray on the machine
    head = subprocess.Popen(
        [ray_cli, "start", "--head", "--block", "--num-cpus", "1", "--port", "6391"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        for _ in range(120):  # up to 60 s for the head to listen
            try:
                socket.create_connection(("127.0.0.1", 6391), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        if ray.is_initialized():
            ray.shutdown()
        r = connect(DistributedConfig(workers=1), log=lambda *a: None)
        assert r.is_initialized() and not r.get_runtime_context().gcs_address.endswith(":6391")
    finally:
        from rollwise.distributed import ray_pool

        ray_pool.shutdown()
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        # what `ray stop` would remove: the head's address, else a later ray.init() would wait for it (issue #47)
        from ray._common.utils import reset_ray_address

        reset_ray_address()
