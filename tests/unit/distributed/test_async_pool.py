"""The async pool's defining properties with a fake engine (AReaL, docs/specs/systems.md §2):
the submission gate, admission by staleness, plans drawn in the controller's order, state for
resume, and interruptible generation (per-token versions, greedy pause/continue = uninterrupted)."""

import re
import threading
import time
from types import SimpleNamespace

import pytest

from rollwise.distributed.async_pool import AsyncPool
from rollwise.generate.common import StepCost
from rollwise.types import Plan, Prompt, Request, Rollout, Sampling, Verdict


def _plan(i):
    return Plan((Request(Prompt(f"p{i}", "t", f"q{i}", "a"), 2),))


class FakeEngine:
    """Generates a plan instantly; records the version it held when each plan started."""

    def __init__(self):
        self.started = []  # (prompt id, version held)
        self.cost = StepCost()
        self.gate = threading.Event()
        self.gate.set()

    def rollouts(self, plan, version, sampling=None, generator=None, charge=True):
        self.gate.wait(5)
        out = []
        for req in plan.requests:
            self.started.append((req.prompt.id, version))
            for _ in range(req.n):
                out.append(
                    (req.prompt, Rollout(req.prompt.id, (1,), (2, 3), (-0.1, -0.1), "stop", version, "x", Verdict(1.0)))
                )
        if charge:
            self.cost.charge(2 * len(out), len(out), [r.verdict for _, r in out], 0.0, 0.0)
        return out

    def take_cost(self):
        cost, self.cost = self.cost, StepCost()
        return cost


def _pool(eta, engine=None):
    engine = engine or FakeEngine()
    draws = iter(range(1, 1000))
    opts = SimpleNamespace(max_staleness=eta, on_new_weights="finish")
    pool = AsyncPool(engine, lambda v, w: None, opts, lambda: _plan(next(draws)))
    pool.load_weights(0, {})
    return pool, engine


def _step(pool, k, plan):
    """One loop step: generate, then 'train' (publish version k + 1)."""
    groups = pool.generate(plan, [], k)
    pool.load_weights(k + 1, {})
    return groups


@pytest.mark.parametrize("eta", [0, 1, 2])
def test_every_plan_starts_at_most_eta_versions_behind_and_in_draw_order(eta):
    pool, engine = _pool(eta)
    trained, loop_plans = [], iter(range(100, 1000))
    for k in range(6):
        groups = _step(pool, k, _plan(0) if k == 0 else _plan(next(loop_plans)))
        trained.append(groups[0].prompt.id)
        # admitted rollouts of step k were drawn at version >= k - eta
        assert all(k - r.policy_version <= eta for g in groups for r in g.rollouts)
    pool.close()
    # plan k is the k-th draw: the loop's first plan, then eta plans drawn ahead, then the loop's
    expected = ["p0"] + [f"p{i}" for i in range(1, eta + 1)] + [f"p{i}" for i in range(100, 100 + 6 - eta - 1)]
    assert trained == expected[:6]
    # the gate: plan j starts only once version j - eta is published
    for j, (_pid, held) in enumerate(engine.started):
        assert held >= j - eta
    if eta == 0:  # synchronous: every plan is generated with the weights of the step that trains it
        assert [held for _, held in engine.started] == list(range(6))


def test_eta_one_generates_the_next_plan_while_the_step_trains():
    pool, engine = _pool(1)
    pool.generate(_plan(0), [], 0)  # step 0 trains plan 0; plan 1 (drawn ahead) may start now
    deadline = time.time() + 5
    while len(engine.started) < 2 and time.time() < deadline:
        time.sleep(0.01)
    assert engine.started == [("p0", 0), ("p1", 0)]  # plan 1 started before version 1 exists
    # ... but not plan 2: it is not drawn until step 1, and the gate would hold it until version 1
    assert pool.state_dict()["drawn"] == 2
    pool.close()


def test_stale_rollouts_are_not_admitted():
    pool, _ = _pool(1)
    r = Rollout("p", (1,), (2,), (-0.1,), "stop", 0, "x", Verdict(1.0), token_versions=(0,))
    ok = Rollout("p", (1,), (2,), (-0.1,), "stop", 2, "x", Verdict(1.0))
    kept = pool._admit([("prompt", r), ("prompt", ok)], version=3)  # lags 3 and 1, eta = 1
    assert kept == [("prompt", ok)]
    cost = pool.take_cost()
    assert cost.metrics["async/stale_dropped"] == 1 and cost.metrics["async/staleness_1"] == 1
    pool.close()


def test_costs_are_charged_at_the_step_that_trains_the_plan():
    pool, _ = _pool(1)
    _step(pool, 0, _plan(0))
    c0 = pool.take_cost()
    assert c0.rollouts == 2 and c0.generated_tokens == 4  # plan 0 only, not plan 1 generated meanwhile
    _step(pool, 1, _plan(100))
    assert pool.take_cost().rollouts == 2
    pool.close()


def test_state_keeps_generated_plans_and_regenerates_the_others():
    engine = FakeEngine()
    pool, _ = _pool(2, engine)
    _step(pool, 0, _plan(0))
    deadline = time.time() + 5
    while not all(j.done for j in pool.jobs.values()) and time.time() < deadline:
        time.sleep(0.01)
    engine.gate.clear()  # the next plan hangs in the engine: "being generated" at the checkpoint
    pool.generate(_plan(100), [], 1)
    state = pool.state_dict()
    engine.gate.set()
    pool.close()
    jobs = {k: pairs for k, _, pairs, _ in state["jobs"]}
    assert state["next_index"] == 2 and state["drawn"] == 4
    assert jobs[2] is not None  # drawn at step 0, generated: kept with its rollouts
    saved = jobs[2]
    # resume: a new pool trains plan 2 from the saved rollouts (not regenerated), then plan 3
    engine2 = FakeEngine()
    pool2, _ = _pool(2, engine2)
    pool2.load_state_dict(state)
    pool2.load_weights(2, {})
    got = pool2.generate(_plan(200), [], 2)
    assert [r for g in got for r in g.rollouts] == [r for _, r in saved]
    assert pool2.take_cost().rollouts == 2  # charged once, at the step that trains it
    pool2.close()
    started = [pid for pid, _ in engine2.started]
    assert "p2" not in started  # the accepted plan was not generated again
    assert started.count(state["jobs"][-1][1].requests[0].prompt.id) <= 1


# ---------------------------------------------------------------- interruptible generation


def _tiny_backend():
    from rollwise.backends.hf import HFBackend
    from rollwise.tokens import Codec
    from rollwise.trainer.tiny import build_tiny

    model, tok = build_tiny("tiny-s", seed=1)
    return HFBackend(model.eval(), [tok.eos_token_id], tok.pad_token_id, max_batch=64, seed=0), Codec(
        tok, use_chat=False
    )


def _publishing_during_the_first_call(backend, engine, on_new_weights, load, weights):
    """An async pool over ``engine`` whose trainer publishes version 1 (``weights``, received by
    ``load``) right after the first decode step of the first generate call; returns (pool, the
    row count of every generate call)."""
    opts = SimpleNamespace(max_staleness=1, on_new_weights=on_new_weights)
    pool = AsyncPool(engine, load, opts, lambda: Plan(), backend=backend, codec=engine.codec, sampling=engine.sampling)
    pool.load_weights(0, {})
    pool._load_pending()
    real = backend.generate
    calls = []

    def generate(seqs, smp, gen=None, max_new_tokens=None, stop_when=None, decode_hook=None):
        calls.append(len(seqs))
        if len(calls) == 1:  # the trainer publishes version 1 during the first call

            def stop(done, first=[True]):  # noqa: B006  (a flag kept across calls)
                if first[0]:
                    first[0] = False
                    pool.load_weights(1, weights)
                return stop_when(done)

            return real(seqs, smp, gen, max_new_tokens, stop)
        return real(seqs, smp, gen, max_new_tokens, stop_when)

    backend.generate = generate
    return pool, calls


def test_interrupt_switches_versions_mid_rollout_and_greedy_continuation_is_exact():
    """Greedy decoding, weights 'published' after the first decode step but unchanged: the
    interrupted rollouts continue from their tokens and equal uninterrupted ones (spec §2,
    property 4); their per-token versions are non-decreasing and show the switch 0 -> 1."""
    from rollwise.distributed.local import LocalPool

    backend, codec = _tiny_backend()
    sampling = Sampling(0.0, 1.0, 12)
    verify = lambda p, t: Verdict(0.0)  # noqa: E731
    plan = Plan((Request(Prompt("a", "t", "1+2=", "3"), 2), Request(Prompt("b", "t", "4+4=", "8"), 1)))
    plain = LocalPool(backend, codec, verify, sampling).rollouts(plan, 0)

    engine = LocalPool(backend, codec, verify, sampling)
    pool, calls = _publishing_during_the_first_call(backend, engine, "interrupt", lambda v, w: None, {})
    out = pool._interruptible(plan)
    assert len(calls) == 2  # stopped once, continued once
    for (_, a), (_, b) in zip(plain, out):
        assert a.completion_ids == b.completion_ids  # pause + continue with the same weights = uninterrupted
        assert b.token_versions is not None and b.token_versions[0] == 0 and b.token_versions[-1] == 1
        assert list(b.token_versions) == sorted(b.token_versions)
        assert b.token_versions.count(0) == 1  # one token decoded before the switch
    cost = engine.take_cost()
    assert cost.metrics["async/interrupted"] == 3
    assert cost.generated_tokens == sum(len(r.completion_ids) for _, r in out)


def test_discard_drops_unfinished_tokens_charges_them_and_restarts_under_the_new_weights():
    """``on_new_weights = "discard"``: weights that change the model are published after the first
    decode step; every unfinished rollout's token is dropped (counted, and charged as generated)
    and the rollout is generated again from its prompt under the new weights: its tokens equal a
    plain greedy generation with the new weights (not the old ones), all of one version."""
    from rollwise.distributed.local import LocalPool
    from rollwise.trainer.tiny import build_tiny

    backend, codec = _tiny_backend()
    old = {k: v.clone() for k, v in backend.model.state_dict().items()}
    new = build_tiny("tiny-s", seed=7)[0].state_dict()
    sampling = Sampling(0.0, 1.0, 12)
    verify = lambda p, t: Verdict(0.0)  # noqa: E731
    plan = Plan((Request(Prompt("a", "t", "1+2=", "3"), 2), Request(Prompt("b", "t", "4+4=", "8"), 1)))
    with_new = LocalPool(backend, codec, verify, sampling)
    backend.model.load_state_dict(new)
    greedy_new = [r.completion_ids for _, r in with_new.rollouts(plan, 1)]
    backend.model.load_state_dict(old)
    greedy_old = [r.completion_ids for _, r in with_new.rollouts(plan, 0)]
    assert greedy_new != greedy_old  # the new weights decode differently: the test can tell them apart

    engine = LocalPool(backend, codec, verify, sampling)
    pool, calls = _publishing_during_the_first_call(
        backend, engine, "discard", lambda v, w: w and backend.model.load_state_dict(w), new
    )
    out = pool._interruptible(plan)
    assert calls == [3, 3]  # stopped once, every rollout generated again
    assert [r.completion_ids for _, r in out] == greedy_new
    assert all(r.policy_version == 1 and r.token_versions is None for _, r in out)  # no token of version 0 kept
    cost = engine.take_cost()
    assert cost.metrics["async/restarted"] == 3 and cost.metrics["async/discarded_tokens"] == 3  # one token each
    assert cost.metrics["async/interrupted"] == 0
    assert cost.generated_tokens == sum(len(r.completion_ids) for _, r in out) + 3  # the dropped tokens are charged
    assert cost.rollouts == 3


# ---------------------------------------------------------------- config refusals (before any model loads)


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["train.async.max_staleness=1", "replay.name=spec_rl"], "replay.name = 'spec_rl'"),
        (
            ["train.async.max_staleness=1", "replay.name=april", "train.async.on_new_weights=interrupt"],
            "replay.name = 'april' (APRIL)",
        ),
        (["train.async.max_staleness=1", "sampling.latr.enabled=true"], "sampling.latr.enabled"),
        (["train.async.on_new_weights=interrupt"], "train.async.max_staleness >= 1"),
        (
            ["train.async.max_staleness=1", "train.async.on_new_weights=interrupt", "model.backend=vllm"],
            "model.backend = 'hf'",
        ),
        (["train.async.periodic=true", "train.async.max_staleness=1"], "train.async.max_staleness = 0"),
        (["train.async.periodic=true", "train.epochs=2"], "train.epochs > 1"),
        (["train.async.periodic=true", "replay.name=rollout_replay"], "replay.name = 'rollout_replay'"),
    ],
)
def test_bad_async_configs_are_refused_naming_the_key(overrides, needle):
    from rollwise.config import load_config
    from rollwise.registry import UserError

    with pytest.raises(UserError, match=re.escape(needle)):
        load_config(overrides=overrides)


def test_async_key_reads_and_writes_as_train_async():
    from rollwise.config import load_config, to_toml

    cfg = load_config(overrides=["train.async.max_staleness=2", "objective.name=decoupled_ppo"])
    assert cfg.train.async_.max_staleness == 2 and cfg.train.async_.on
    assert "[train.async]" in to_toml(cfg) and "max_staleness = 2" in to_toml(cfg)
    assert not load_config().train.async_.on  # default: the synchronous loop


def test_no_plan_past_the_last_step_is_drawn_ahead_or_generated():
    """train.steps = 3, eta = 2: the loop's plans of its last two steps (indices 3, 4) are never
    trained, so the generator never generates them, and none is drawn ahead past step 2."""
    engine = FakeEngine()
    draws = iter(range(1, 1000))
    opts = SimpleNamespace(max_staleness=2, on_new_weights="finish")
    pool = AsyncPool(engine, lambda v, w: None, opts, lambda: _plan(next(draws)), steps=3)
    pool.load_weights(0, {})
    trained = [_step(pool, k, _plan(100 + k))[0].prompt.id for k in range(3)]
    time.sleep(0.3)  # the generator would take plans 3 and 4 now (versions 1..3 published, gate open)
    pool.close()
    assert trained == ["p100", "p1", "p2"]
    assert [pid for pid, _ in engine.started] == ["p100", "p1", "p2"]
    assert sorted(pool.jobs) == [3, 4] and not any(
        j.done for j in pool.jobs.values()
    )  # kept for a resume with more steps
