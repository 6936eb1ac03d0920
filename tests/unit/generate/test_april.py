"""APRIL partial rollouts (generate/april.py; systems.md §1 testable properties)."""

import pytest
import torch

from rollwise.backends.hf import HFBackend
from rollwise.backends.scripted import ScriptedBackend
from rollwise.collate import collate, flatten
from rollwise.distributed.local import LocalPool
from rollwise.generate.april import PartialRollouts
from rollwise.tokens import Codec
from rollwise.trainer.tiny import build_tiny, char_tokenizer
from rollwise.types import Advantages, Plan, Prompt, Request, Sampling, Verdict


@pytest.fixture(scope="module")
def tiny():
    model, tok = build_tiny("tiny-s", seed=1)
    return model.eval(), tok


def _prompts(k):
    return [Prompt(f"p{i}", "t", f"{i}+{i}=", str(2 * i)) for i in range(k)]


class _Stream:
    """A controller with a prompt stream, as ``uniform`` (extra prompts for over-provisioning)."""

    def __init__(self, prompts, n):
        self.rest, self.n = list(prompts), n
        self.stream = self

    def take(self, k):
        out, self.rest = self.rest[:k], self.rest[k:]
        return out

    def plan(self, prompts, state):
        return Plan(tuple(Request(p, self.n) for p in prompts))


def _scripted_pool(lengths, budget=8, **opts):
    """Scripted answers: prompt p<i> answers ``lengths[i]`` digits '1' then EOS (a continued
    prefix gets the digits still missing)."""
    tok = char_tokenizer()
    codec = Codec(tok, use_chat=False)

    def respond(seq, call):
        text = tok.decode(seq, skip_special_tokens=True)
        i = int(text.split("+")[0])
        return tok.encode("1" * (lengths[i] - len(text.split("=", 1)[1])), add_special_tokens=False)

    backend = ScriptedBackend(respond, eos_id=tok.eos_token_id)
    pool = LocalPool(
        backend, codec, lambda p, t: Verdict(1.0 if t.startswith("1") else 0.0), Sampling(1.0, 1.0, budget)
    )
    buf = PartialRollouts(None, PartialRollouts.Options(**opts), 0)
    return pool, buf, codec


def test_stop_when_on_the_hf_sampler_then_resume_equals_uninterrupted_greedy(tiny):
    """Resume fidelity (property 2) on the real KV-cache sampler: abort after k decode steps with
    ``stop_when``, continue from the token ids, get the uninterrupted greedy decode."""
    model, tok = tiny
    b = HFBackend(model, [], tok.pad_token_id, max_batch=8)  # no EOS: every row runs to its budget
    seqs = [[tok.bos_token_id] + tok.encode("7+8="), [tok.bos_token_id] + tok.encode("12+345=")]
    greedy = Sampling(0.0, 1.0, 12)
    whole = b.generate(seqs, greedy)
    steps = []
    head = b.generate(seqs, greedy, stop_when=lambda done: steps.append(1) or len(steps) >= 5)
    assert [c.finish for c in head] == ["partial", "partial"] and [len(c.token_ids) for c in head] == [5, 5]
    tail = b.generate([s + list(h.token_ids) for s, h in zip(seqs, head)], greedy, max_new_tokens=[7, 7])
    for w, h, t in zip(whole, head, tail):
        assert h.token_ids + t.token_ids == w.token_ids
        assert len(h.token_ids) + len(t.token_ids) <= 12  # budget (property 3)
        assert torch.allclose(torch.tensor(h.logprobs + t.logprobs), torch.tensor(w.logprobs), atol=1e-4)
        assert t.finish == "length"


def test_hf_per_row_budget_and_later_chunks_come_back_partial(tiny):
    model, tok = tiny
    b = HFBackend(model, [], tok.pad_token_id, max_batch=2)
    seqs = [[1, 5, 6]] * 4
    out = b.generate(seqs, Sampling(1.0, 1.0, 6), max_new_tokens=[2, 0, 6, 3])
    assert [len(c.token_ids) for c in out] == [2, 0, 6, 3] and {c.finish for c in out} == {"length"}
    # stop as soon as the first row is done: it is in chunk 1; chunk 2 never starts
    out = b.generate(seqs, Sampling(1.0, 1.0, 6), max_new_tokens=[1, 4, 4, 4], stop_when=lambda d: d[0])
    assert [c.finish for c in out] == ["length", "partial", "partial", "partial"]
    assert [len(c.token_ids) for c in out] == [1, 1, 0, 0]


def test_without_overprovisioning_the_step_equals_a_plain_synchronous_rollout(tiny):
    """Property 1: over_provision 1, no filter -> same prompts, order and samples as LocalPool."""
    model, tok = tiny
    codec = Codec(tok, use_chat=False)
    plan = Plan(tuple(Request(p, 3) for p in _prompts(4)))
    verify = lambda p, t: Verdict(float(t == p.answer))  # noqa: E731
    s = Sampling(1.0, 1.0, 6)
    plain = LocalPool(HFBackend(model, [tok.eos_token_id], tok.pad_token_id, 8, seed=5), codec, verify, s, 8)
    base = plain.generate(plan, [], 0)
    pool = LocalPool(HFBackend(model, [tok.eos_token_id], tok.pad_token_id, 8, seed=5), codec, verify, s, 8)
    buf = PartialRollouts(None, PartialRollouts.Options(over_provision=1.0), 0)
    april = buf.wrap_pool(pool).generate(plan, [], 0)
    assert [g.prompt.id for g in april] == [g.prompt.id for g in base]
    assert [[r.completion_ids for r in g.rollouts] for g in april] == [
        [r.completion_ids for r in g.rollouts] for g in base
    ]
    assert buf.buffer == [] and pool.cost.generated_tokens == plain.cost.generated_tokens


def test_overprovision_stops_at_target_and_buffers_partials_fifo():
    # p0..p3 answer 1..4 digits; p4.. long (7). Target 2 groups of 2, pull 4 (factor 2).
    pool, buf, _ = _scripted_pool([1, 2, 7, 7, 7, 7, 7, 7], budget=8, over_provision=2.0)
    ps = _prompts(8)
    ctrl = _Stream(ps[2:], 2)  # the plan holds p0, p1; extra prompts come from the stream
    april = buf.wrap_pool(pool, ctrl, lambda: None)
    out = april.generate(Plan((Request(ps[0], 2), Request(ps[1], 2))), [], 0)
    assert [g.prompt.id for g in out] == ["p0", "p1"]
    # stopped after decode step 3 (p1's "11"+EOS): p2, p3 hold 3 tokens each
    assert [e.prompt.id for e in buf.buffer] == ["p2", "p3"]
    assert all(len(s.ids) == 3 and s.rollout is None for e in buf.buffer for s in e.slots)
    cost = pool.take_cost()
    assert cost.generated_tokens == 2 * 2 + 2 * 3 + 4 * 3 and cost.rollouts == 4 and cost.verifier_calls == 4
    assert cost.metrics["april/buffered_groups"] == 2 and cost.metrics["april/partial_rollouts"] == 4
    # next step: buffered groups first (FIFO), continued to completion, never past the budget
    out = april.generate(Plan((Request(ps[6], 2), Request(ps[7], 2))), [], 1)
    assert [g.prompt.id for g in out] == ["p2", "p3"]
    for g in out:
        for r in g.rollouts:
            assert len(r.completion_ids) == 8 and r.token_versions == (0,) * 3 + (1,) * 5  # 7 digits + EOS
            assert r.finish == "stop" and r.loss_mask is None
    assert [e.prompt.id for e in buf.buffer] == ["p6", "p7"]  # fresh, partially generated
    assert pool.take_cost().metrics["april/resumed_rollouts"] == 4


def test_budget_holds_across_resumes():
    pool, buf, _ = _scripted_pool([1, 20, 20], budget=6, over_provision=2.0)
    ps = _prompts(3)
    april = buf.wrap_pool(pool, _Stream([ps[2]], 1), lambda: None)
    april.generate(Plan((Request(ps[0], 1),)), [], 0)
    out = april.generate(Plan((Request(ps[0], 1),)), [], 1)
    out += april.generate(Plan((Request(ps[0], 1),)), [], 2)
    lengths = [len(r.completion_ids) for g in out for r in g.rollouts]
    assert max(lengths) <= 6 and any(r.finish == "length" for g in out for r in g.rollouts)


def test_completed_rollouts_in_a_buffered_group_are_not_regenerated():
    pool, buf, _ = _scripted_pool([1, 5, 1], budget=8, over_provision=2.0)
    ps = _prompts(3)
    # p1's group mixes a short and a long answer: scripted per call index
    calls = []
    inner = pool.backend.respond
    pool.backend.respond = lambda seq, i: calls.append(i) or (inner(seq, i) if i != 2 else [5])
    april = buf.wrap_pool(pool, _Stream([], 2), lambda: None)
    april.generate(Plan((Request(ps[0], 2), Request(ps[1], 2))), [], 0)  # width 4 but only 2 prompts
    # both groups finished (no over-provision possible): nothing buffered
    assert buf.buffer == []
    april2 = PartialRollouts(None, PartialRollouts.Options(over_provision=2.0), 0)
    pool2, _, _ = _scripted_pool([1, 5, 1], budget=8)
    a2 = april2.wrap_pool(pool2, _Stream([ps[1]], 2), lambda: None)
    seen = []
    inner2 = pool2.backend.respond
    pool2.backend.respond = lambda seq, i: seen.append(i) or ([5] if i == 2 else inner2(seq, i))
    a2.generate(Plan((Request(ps[0], 2),)), [], 0)  # p0 (2 rows) + p1 from the stream (rows 2, 3)
    (e,) = april2.buffer
    assert e.prompt.id == "p1" and e.slots[0].rollout is not None and e.slots[1].rollout is None
    n_calls = pool2.backend.calls
    a2.generate(Plan((Request(ps[2], 2),)), [], 1)
    assert pool2.backend.calls - n_calls == 1 + 2  # p1's unfinished row and p2's two; not p1's finished one


@pytest.mark.parametrize("mode", ["keep", "mask", "tis"])
def test_prefix_modes(mode):
    pool, buf, _ = _scripted_pool([1, 5, 5], budget=8, over_provision=2.0, prefix_mode=mode)
    ps = _prompts(3)
    april = buf.wrap_pool(pool, _Stream([ps[1]], 1), lambda: None)
    april.generate(Plan((Request(ps[0], 1),)), [], 0)  # stops after step 2: p1 holds 2 tokens
    (g,) = april.generate(Plan((Request(ps[2], 1),)), [], 1)
    (r,) = g.rollouts
    assert g.prompt.id == "p1" and r.token_versions == (0, 0, 1, 1, 1, 1)
    rows, rewards, gidx = flatten([g])
    batch = collate(rows, rewards, gidx, Advantages(torch.ones(1), torch.ones(1, dtype=torch.bool)), 0)
    p = len(r.prompt_ids)
    mask = batch.loss_mask[0, p : p + 6].tolist()
    if mode == "mask":  # 1 exactly on the tokens generated after the last resume (property 5)
        assert r.loss_mask == (0, 0, 1, 1, 1, 1) and mask == [0, 0, 1, 1, 1, 1] and batch.num_loss_tokens == 4
    else:  # keep / tis: every token trains; tis weights come from the per-segment mu (old_logprobs)
        assert r.loss_mask is None and mask == [1.0] * 6 and batch.num_loss_tokens == 6
    assert batch.policy_versions[0, p : p + 6].tolist() == [0, 0, 1, 1, 1, 1]


def test_tis_mode_requires_an_objective_weight():
    from rollwise.config import load_config
    from rollwise.registry import UserError

    with pytest.raises(UserError, match="tis_level"):
        load_config(overrides=["replay.name=april", 'replay.options={prefix_mode = "tis"}'])
    load_config(
        overrides=[
            "replay.name=april",
            'replay.options={prefix_mode = "tis"}',
            'objective.options={tis_level = "token"}',
        ]
    )


def test_state_dict_round_trip_resumes_identically():
    pool, buf, _ = _scripted_pool([1, 2, 7, 7, 7, 7], budget=8, over_provision=2.0)
    ps = _prompts(6)
    april = buf.wrap_pool(pool, _Stream(ps[2:4], 2), lambda: None)
    april.generate(Plan((Request(ps[0], 2), Request(ps[1], 2))), [], 0)
    import io

    f = io.BytesIO()
    torch.save(buf.state_dict(), f)
    f.seek(0)
    copy = PartialRollouts(None, buf.opts, 0)
    copy.load_state_dict(torch.load(f, weights_only=False))
    pool2, _, _ = _scripted_pool([1, 2, 7, 7, 7, 7], budget=8)
    nxt = Plan((Request(ps[4], 2), Request(ps[5], 2)))
    a = april.generate(nxt, [], 1)
    b = copy.wrap_pool(pool2, _Stream([], 2), lambda: None).generate(nxt, [], 1)
    assert a == b and buf.state_dict() == copy.state_dict()


@pytest.mark.parametrize("extra, launched, buffered", [(["p7"], 4, ["p6", "p7"]), (["p3"], 3, ["p6"])])
def test_a_fresh_request_for_a_buffered_prompt_is_skipped(extra, launched, buffered):
    """The stream wrapped: p2 comes back fresh while its group is buffered. The fresh request is
    skipped (the buffered group stands for it) and the step tops up from the stream, skipping
    prompts already buffered or launched too: no prompt id is returned or buffered twice."""
    pool, buf, _ = _scripted_pool([1, 2, 7, 7, 7, 7, 7, 7], budget=8, over_provision=2.0)
    ps = {p.id: p for p in _prompts(8)}
    ctrl = _Stream([ps["p2"], ps["p3"]] + [ps[i] for i in extra], 2)
    april = buf.wrap_pool(pool, ctrl, lambda: None)
    april.generate(Plan((Request(ps["p0"], 2), Request(ps["p1"], 2))), [], 0)
    assert [e.prompt.id for e in buf.buffer] == ["p2", "p3"]
    pool.take_cost()
    out = april.generate(Plan((Request(ps["p2"], 2), Request(ps["p6"], 2))), [], 1)
    assert [g.prompt.id for g in out] == ["p2", "p3"]  # the buffered (resumed) groups, once each
    assert all(r.token_versions[0] == 0 for g in out for r in g.rollouts)
    assert [e.prompt.id for e in buf.buffer] == buffered
    assert pool.take_cost().metrics["april/launched_groups"] == launched


@pytest.mark.parametrize(
    "override, key",
    [
        (["control.name=greso"], "control.name"),
        (
            ["control.dynamic_sampling.enabled=true", 'filter.names=["zero_variance"]'],
            "control.dynamic_sampling.enabled",
        ),
        (["sampling.latr.enabled=true"], "sampling.latr.enabled"),
    ],
)
def test_config_refuses_controllers_with_per_step_state_and_latr(override, key):
    from rollwise.config import load_config
    from rollwise.registry import UserError

    with pytest.raises(UserError, match=key.replace(".", r"\.")):
        load_config(overrides=["replay.name=april", *override])
    load_config(overrides=override)  # fine without APRIL
