"""Rollout replay (replay/rollout_replay.py, allocation.md §7.3, 7.7): batch composition, the FIFO
buffer (size, deduplication), warm-up and staleness, the replay-aware clip as objective options
(against the spec's formula), checkpoint state, and the loop equivalences fraction 0 ≡ staleness
0 ≡ on_policy."""

import json

import pytest
import torch

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.config import load_config
from rollwise.objectives import grpo
from rollwise.replay.rollout_replay import RolloutReplay, RolloutReplayOptions
from rollwise.types import Batch, Group, Prompt, Rollout, RunState, Verdict


def _group(pid, version=0, scores=(1.0, 0.0)):
    p = Prompt(pid, "t", pid, "0")
    return Group(p, tuple(Rollout(pid, (1,), (2,), (-1.0,), "stop", version, "", Verdict(s)) for s in scores))


def _replay(**opts):
    return RolloutReplay(None, RolloutReplayOptions(**opts), seed=0)


def test_replay_count_by_hand():
    r = _replay()  # f = 0.5: as many replayed as fresh
    assert [r.replay_count(n) for n in (0, 1, 8)] == [0, 1, 8]
    r = _replay(replay_fraction=0.25)  # f/(1-f) = 1/3: 3 fresh -> 1, 4 -> 1.33 -> 1, 5 -> 1.67 -> 2
    assert [r.replay_count(n) for n in (3, 4, 5)] == [1, 1, 2]
    assert _replay(replay_fraction=0.0).replay_count(100) == 0


def test_each_step_has_sigma_b_fresh_and_the_rest_replayed_or_fewer():
    r = _replay(replay_fraction=0.5, buffer_size=100)
    step0 = [_group(f"a{i}") for i in range(4)]
    assert r.mix(step0, RunState(step=0, policy_version=0)) == step0  # empty buffer: fresh only
    r.add(step0)
    step1 = [_group(f"b{i}", 1) for i in range(2)]
    batch = r.mix(step1, RunState(step=1, policy_version=1))
    assert batch[:2] == step1 and len(batch) == 4 and all(g in step0 for g in batch[2:])  # 2 fresh + 2 replayed
    r.add(step1)
    step2 = [_group(f"c{i}", 2) for i in range(8)]
    batch = r.mix(step2, RunState(step=2, policy_version=2))
    assert len(batch) == 8 + 6  # wants 8 replayed, the buffer holds 6
    assert len({id(g) for g in batch[8:]}) == 6


def test_buffer_is_bounded_deduplicated_and_keeps_the_newest_group():
    r = _replay(buffer_size=3)
    r.add([_group("a", 0), _group("b", 0)])
    r.add([_group("a", 1), _group("c", 1)])
    assert [(g.prompt.id, g.rollouts[0].policy_version) for g in r.buffer] == [("b", 0), ("a", 1), ("c", 1)]
    r.add([_group("d", 2), _group("e", 2)])
    assert [g.prompt.id for g in r.buffer] == ["c", "d", "e"]  # newest 3
    for step in range(10):
        r.add([_group(f"x{step % 4}", step), _group("a", step)])
        ids = [g.prompt.id for g in r.buffer]
        assert len(ids) <= 3 and len(ids) == len(set(ids))


def test_warmup_steps_replay_nothing_but_fill_the_buffer():
    r = _replay(warmup_steps=2)
    for step in range(2):
        fresh = [_group(f"s{step}")]
        assert r.mix(fresh, RunState(step=step, policy_version=step)) == fresh
        r.add(fresh)
    assert len(r.buffer) == 2 and len(r.mix([_group("t")], RunState(step=2, policy_version=2))) == 2


def test_max_replay_age_limits_the_replayed_versions():
    r = _replay(replay_fraction=0.75, max_replay_age=1)  # 1 fresh -> 3 wanted
    r.add([_group("v0", 0), _group("v1", 1), _group("v2", 2)])
    batch = r.mix([_group("f", 3)], RunState(step=3, policy_version=3))
    assert sorted(g.prompt.id for g in batch[1:]) == ["v2"]  # 3 - 2 <= 1; v1, v0 too old
    r0 = _replay(max_replay_age=0)
    r0.add([_group("old", 2)])
    fresh = [_group("f", 3)]
    assert r0.mix(fresh, RunState(step=3, policy_version=3)) == fresh  # staleness 0 = on-policy


def test_state_round_trips_buffer_and_rng():
    r = _replay(buffer_size=8)
    for step in range(4):
        fresh = [_group(f"s{step}-{i}", step) for i in range(3)]
        r.mix(fresh, RunState(step=step, policy_version=step))
        r.add(fresh)
    s = RolloutReplay(None, r.opts, seed=5)
    s.load_state_dict(r.state_dict())
    assert s.buffer == r.buffer
    fresh = [_group("z0", 4), _group("z1", 4)]
    st = RunState(step=4, policy_version=4)
    assert [g.prompt.id for g in s.mix(fresh, st)] == [g.prompt.id for g in r.mix(fresh, st)]


# ------------------------------------------------------------------ the replay-aware clip


def _batch(mu, prox, adv):
    b, t = mu.shape
    mask = torch.ones(b, t, dtype=torch.float64)
    mask[1, -1] = 0.0  # a padded position
    return Batch(
        torch.zeros(b, t, dtype=torch.long),
        mask.bool(),
        mask,
        mu * mask,
        torch.tensor(adv, dtype=torch.float64),
        torch.zeros(b, dtype=torch.float64),
        torch.arange(b),
        torch.zeros(b, t, dtype=torch.long),
        num_loss_tokens=int(mask.sum()),
        num_sequences=b,
        prox_logprobs=prox * mask,
    )


def _spec_loss(batch, new, eps=0.2):
    """§7.3.4: max(-A r, -A clip(r, r_old (1 - eps), r_old (1 + eps))), r = pi/mu, r_old = pi_old/mu, token mean."""
    r = torch.exp(new - batch.old_logprobs)
    r_old = torch.exp(batch.prox_logprobs - batch.old_logprobs)
    a = batch.advantages[:, None]
    per = torch.maximum(-a * r, -a * torch.clamp(r, r_old * (1 - eps), r_old * (1 + eps)))
    return (per * batch.loss_mask).sum() / batch.num_loss_tokens


REPLAY_CLIP = grpo.Options(tis_level="token", tis_cap=1e9)


def test_replay_clip_options_equal_the_spec_formula_on_stale_rows():
    g = torch.Generator().manual_seed(0)
    mu = -torch.rand(3, 5, generator=g, dtype=torch.float64) * 2  # behaviour log-probs (old policy)
    prox = mu + torch.randn(3, 5, generator=g, dtype=torch.float64) * 0.5  # the policy has moved since
    new = (prox + torch.randn(3, 5, generator=g, dtype=torch.float64) * 0.3).requires_grad_(True)
    batch = _batch(mu, prox, [1.0, -0.5, 2.0])
    out = grpo.loss(batch, new, REPLAY_CLIP)
    want = _spec_loss(batch, new)
    assert out.loss.item() == pytest.approx(want.item(), rel=1e-10)
    (g1,) = torch.autograd.grad(out.loss, new)
    (g2,) = torch.autograd.grad(_spec_loss(batch, new), new)
    assert torch.allclose(g1, g2)


def test_replay_clip_is_standard_ppo_when_mu_equals_pi_old():
    g = torch.Generator().manual_seed(1)
    prox = -torch.rand(2, 4, generator=g, dtype=torch.float64) * 2
    new = prox + torch.randn(2, 4, generator=g, dtype=torch.float64) * 0.4
    batch = _batch(prox.clone(), prox, [0.7, -1.2])  # fresh rows: mu = pi_old, r_old = 1
    assert grpo.loss(batch, new, REPLAY_CLIP).loss.item() == pytest.approx(
        grpo.loss(batch, new, grpo.Options()).loss.item()
    )


# ------------------------------------------------------------------ the loop equivalences


def _stable(path):
    return [
        {k: v for k, v in json.loads(x).items() if k != "wall_s" and not k.startswith("time/")}
        for x in path.read_text().splitlines()
    ]


def test_fraction_zero_and_staleness_zero_equal_on_policy_in_the_loop(tmp_path, trained):
    runs = {
        "fraction0": {"replay.name": "rollout_replay", "replay.options": {"replay_fraction": 0.0}},
        "staleness0": {"replay.name": "rollout_replay", "replay.options": {"max_replay_age": 0}},
    }
    # the on-policy run only read: shared (tests/conftest.py ``trained``, also test_sapo's reference)
    on_policy = trained(tiny_overrides(tmp_path, steps=3, **{"eval.at_start": False, "run.threads": 1}))
    lines = {"on_policy": _stable(on_policy / "metrics.jsonl")}
    for name, extra in runs.items():
        o = tiny_overrides(tmp_path, name=name, steps=3, **{"eval.at_start": False, "run.threads": 1}, **extra)
        result = rollwise.train(load_config(overrides=as_sets(o)), log=lambda m: None)
        lines[name] = _stable(result.run_dir / "metrics.jsonl")
    assert lines["fraction0"] == lines["on_policy"] == lines["staleness0"]
    # and replay does change the batch: at 0.5 every step after the first trains on twice the groups
    o = tiny_overrides(
        tmp_path, name="half", steps=3, **{"eval.at_start": False, "run.threads": 1, "replay.name": "rollout_replay"}
    )
    half = _stable(rollwise.train(load_config(overrides=as_sets(o)), log=lambda m: None).run_dir / "metrics.jsonl")
    assert half[0]["cost/trained_tokens"] == lines["on_policy"][0]["cost/trained_tokens"]
    assert half[-1]["cost/trained_tokens"] > lines["on_policy"][-1]["cost/trained_tokens"]
    assert half[-1]["cost/rollouts"] == lines["on_policy"][-1]["cost/rollouts"]  # replay generates nothing
