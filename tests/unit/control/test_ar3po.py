"""AR3PO (control/ar3po.py, docs/specs/selection.md §3, a reconstruction): the §3.6 properties worked by
hand, the response store, the off-policy labels of a reused response, the budget, the checkpoint
state, and the real loop with a scripted backend where a stored response rescues a group."""

import io
import json
import math
import random

import pytest
import torch

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.backends.scripted import ScriptedBackend
from rollwise.collate import flatten
from rollwise.config import load_config
from rollwise.control import REGISTRY
from rollwise.control.ar3po import AR3PO, expected_fresh_responses
from rollwise.filter.basic import zero_variance
from rollwise.objectives import ADVANTAGES
from rollwise.types import Group, Prompt, Rollout, RunState, Verdict


def _prompts(n):
    return [Prompt(f"p{i}", "t", f"{i}", "0") for i in range(n)]


def _rollouts(prompt, scores, version=0, logprob=-1.0):
    return tuple(Rollout(prompt.id, (1,), (2, 3), (logprob, logprob), "stop", version, "", Verdict(s)) for s in scores)


def _ar3po(*overrides, options=None, prompts=20):
    cfg = load_config(
        overrides=[f"control.prompts_per_step={min(2, prompts)}", "control.rollouts_per_prompt=4", *overrides]
    ).control
    return AR3PO(_prompts(prompts), cfg, AR3PO.Options(**(options or {})), seed=0)


def _generate(plan, groups, scores, version=0):
    """What the worker pool does: merge each request's rollouts (scores[prompt id], consumed in
    order) into the group of its prompt."""
    merged = {g.prompt.id: g for g in groups}
    for req in plan.requests:
        new = _rollouts(req.prompt, [scores[req.prompt.id].pop(0) for _ in range(req.n)], version)
        g = merged.get(req.prompt.id) or Group(req.prompt, ())
        merged[req.prompt.id] = Group(g.prompt, g.rollouts + new)
    return list(merged.values())


def _step(ctrl, scores, step=0, version=0):
    """One step of the loop's rounds; returns (groups after the last round, rollouts planned per round)."""
    state = RunState(step=step, policy_version=version)
    plan = ctrl.plan(ctrl.select(state), state)
    groups, planned = [], []
    while plan:
        planned.append(plan.total)
        groups = _generate(plan, groups, scores, version)
        plan = ctrl.next_round(groups, state)
    ctrl.observe(groups, state)
    return groups, planned


def _by_id(groups):
    return {g.prompt.id: g for g in groups}


def _seed_store(ctrl, version=0):
    """A step where every prompt succeeds at once, so each gets a stored correct response."""
    ids = [p.id for p in ctrl.stream.prompts]
    return _step(ctrl, {pid: [1, 0, 0, 0] for pid in ids}, version=version)


# ------------------------------------------------------------------ §3.6 response counts, S = 2, k = 4


def test_response_counts_by_stage_of_first_success():
    ctrl = _ar3po(prompts=2)  # p0, p1 every step (prompts_per_step = 2)
    # p0: first success in stage 1 -> 4 responses; p1: in stage 2 -> 8
    groups, planned = _step(ctrl, {"p0": [0, 1, 0, 0], "p1": [0] * 4 + [0, 0, 1, 0]})
    assert {g.prompt.id: g.size for g in groups} == {"p0": 4, "p1": 8}
    assert planned == [8, 4]  # stage 2 asks only for the prompt without a success
    # next step both fail in both stages: 8 fresh + 1 reused each = 9 (both succeeded before)
    groups, planned = _step(ctrl, {"p0": [0] * 8, "p1": [0] * 8}, step=1, version=1)
    assert [g.size for g in groups] == [9, 9] and planned == [8, 8]
    assert all(sorted(g.rewards()) == [0.0] * 8 + [1.0] for g in groups)
    assert all(zero_variance(g).keep for g in groups)


def test_no_success_and_nothing_stored_stays_zero_variance_and_is_dropped():
    ctrl = _ar3po(prompts=2)
    groups, planned = _step(ctrl, {"p0": [0] * 8, "p1": [1, 1, 1, 1]})
    assert {g.prompt.id: g.size for g in groups} == {"p0": 8, "p1": 4}
    assert planned == [8, 4]
    assert zero_variance(groups[0]).reason == "all_wrong"  # never succeeded: no reuse possible
    assert zero_variance(groups[1]).reason == "all_correct"  # all correct after stage 1: dropped, no refill
    assert ctrl.metrics["control/ar3po_reused"] == 0 and ctrl.metrics["control/ar3po_unrescued"] == 1


@pytest.mark.parametrize("stages,sizes", [(1, [4, 5]), (3, [12, 13])])
def test_stages_option(stages, sizes):
    ctrl = _ar3po(prompts=2, options={"stages": stages})
    _seed_store(ctrl)
    ctrl.store.pop("p0")  # p0 has nothing stored, p1 has
    groups, planned = _step(ctrl, {"p0": [0] * 12, "p1": [0] * 12}, step=1)
    assert [_by_id(groups)[p].size for p in ("p0", "p1")] == sizes and planned == [8] * stages


# ------------------------------------------------------------------ §3.6 expected fresh responses


def test_expected_fresh_responses_by_hand():
    # E = k sum_{s<S} (1-p)^{k s}; k = 4, S = 2: p = .5 -> 4 (1 + 1/16) = 4.25; p = 0 -> 8; p = 1 -> 4
    assert expected_fresh_responses(0.5, 4, 2) == pytest.approx(4.25)
    assert expected_fresh_responses(0.0, 4, 2) == 8
    assert expected_fresh_responses(1.0, 4, 2) == 4
    assert expected_fresh_responses(0.5, 4, 4) == pytest.approx(4 * (1 + 1 / 16 + 1 / 256 + 1 / 4096))


def test_controller_spends_the_expected_number_of_fresh_responses():
    # 2000 prompts with Bernoulli(0.5) rewards: mean fresh responses per prompt ~ 4.25
    # (std of one prompt's count is 4 * sqrt(1/16 * 15/16) = 0.968 -> std of the mean 0.022)
    rng = random.Random(0)
    ctrl = _ar3po("control.prompts_per_step=2000", prompts=2000)
    groups, _ = _step(ctrl, {f"p{i}": [float(rng.random() < 0.5) for _ in range(8)] for i in range(2000)})
    mean = sum(g.size for g in groups) / len(groups)
    assert abs(mean - 4.25) < 0.08
    assert ctrl.metrics["control/ar3po_fresh_per_prompt"] == pytest.approx(mean)


# ------------------------------------------------------------------ §3.6 reuse advantage


def test_reuse_advantage_by_hand():
    ctrl = _ar3po(prompts=2)
    _seed_store(ctrl)
    groups, _ = _step(ctrl, {"p0": [0] * 8, "p1": [0] * 8}, step=1)
    _, rewards, gidx = flatten(groups[:1])  # 8 wrong + 1 reused correct
    assert sorted(rewards.tolist()) == [0.0] * 8 + [1.0]
    i = int(rewards.argmax())
    # mean-only: mean 1/9 -> +8/9 for the correct row, -1/9 for the wrong ones
    a = ADVANTAGES.get("dr_grpo")(rewards, gidx).values
    assert a[i].item() == pytest.approx(8 / 9) and a[0].item() == pytest.approx(-1 / 9)
    # population std: sqrt(1/9 * 8/9) = sqrt(8)/9 -> (8/9) / (sqrt 8 / 9) = sqrt 8 = 2.83; -(1/9)/(sqrt 8/9) = -0.354
    grpo = ADVANTAGES.get("grpo")
    a = grpo(rewards, gidx, grpo.Options(std="population", eps=0.0)).values
    assert a[i].item() == pytest.approx(math.sqrt(8), rel=1e-5) and a[0].item() == pytest.approx(
        -1 / math.sqrt(8), rel=1e-5
    )


# ------------------------------------------------------------------ §3.6 where reuse applies


def test_reuse_only_after_the_last_stage_and_at_most_once():
    ctrl = _ar3po(prompts=2)
    _seed_store(ctrl)
    state = RunState(step=1, policy_version=1)
    plan = ctrl.plan(ctrl.select(state), state)
    groups = _generate(plan, [], {"p0": [0] * 4, "p1": [0, 0, 1, 0]})
    plan = ctrl.next_round(groups, state)
    # after stage 1: p0 (k = 0) gets stage 2, not a reused response; p1 (k = 1) is finished, untouched
    assert [(r.prompt.id, r.n) for r in plan.requests] == [("p0", 4)]
    assert [g.size for g in groups] == [4, 4]
    groups = _generate(plan, groups, {"p0": [0] * 4})
    assert not ctrl.next_round(groups, state)
    sizes = lambda: {g.prompt.id: g.size for g in groups}  # noqa: E731
    assert sizes() == {"p0": 9, "p1": 4}  # p0 rescued after stage S = 2; p1 never
    assert not ctrl.next_round(groups, state)  # another call (e.g. dynamic sampling's) adds nothing
    assert sizes() == {"p0": 9, "p1": 4}
    g0 = _by_id(groups)["p0"]
    assert ctrl.rescue(g0, state) is g0  # has a correct response now: no second reuse


def test_store_holds_the_newest_fresh_success_and_never_a_prompt_without_one():
    ctrl = _ar3po(prompts=2)
    g = _by_id(_step(ctrl, {"p0": [0, 1, 0, 0], "p1": [0] * 8}, version=0)[0])
    assert set(ctrl.store) == {"p0"} and ctrl.store["p0"] is g["p0"].rollouts[1]
    g = _by_id(_step(ctrl, {"p0": [1, 1, 0, 0], "p1": [0] * 8}, step=1, version=1)[0])
    assert ctrl.store["p0"] is g["p0"].rollouts[1] and ctrl.store["p0"].policy_version == 1  # newest wins
    assert "p1" not in ctrl.store and g["p1"].size == 8  # p1 never succeeded: never rescued
    # a rescued group's reused response is not stored again, nor recorded as a fresh rollout
    g = _by_id(_step(ctrl, {"p0": [0] * 8, "p1": [0] * 8}, step=2, version=2)[0])
    assert g["p0"].size == 9 and g["p1"].size == 8 and ctrl.store["p0"].policy_version == 1
    assert ctrl.history.last("p0").n == 8 and ctrl.history.last("p0").k == 0
    assert ctrl.metrics["control/ar3po_reused"] == 1 and ctrl.metrics["control/ar3po_reuse_staleness"] == 1
    assert ctrl.metrics["control/ar3po_reused_frac"] == pytest.approx(1 / 17)  # 1 reused of 16 fresh + 1


def test_reused_rollout_keeps_its_sampler_logprobs_and_versions():
    ctrl = _ar3po(prompts=1, options={"stages": 1})
    old = Rollout("p0", (1,), (5, 6, 7), (-0.1, -0.2, -0.3), "stop", 3, "", Verdict(1.0), token_versions=(2, 3, 3))
    ctrl.store["p0"] = old
    groups, _ = _step(ctrl, {"p0": [0] * 4}, step=9, version=9)
    assert groups[0].rollouts[-1] is old  # the very record: ids, mu, policy_version, token_versions
    from rollwise.collate import collate

    rows, rewards, gidx = flatten(groups)
    batch = collate(rows, rewards, gidx, ADVANTAGES.get("grpo")(rewards, gidx), pad_id=0)
    assert batch.policy_versions[-1, 1:4].tolist() == [2, 3, 3]  # fresh rows carry version 9
    assert batch.policy_versions[0, 1:3].tolist() == [9, 9]
    assert batch.old_logprobs[-1, 1:4].tolist() == pytest.approx([-0.1, -0.2, -0.3])


def test_max_reuse_age_and_reuse_off():
    ctrl = _ar3po(prompts=1, options={"stages": 1, "max_reuse_age": 3})
    _seed_store(ctrl, version=0)
    groups, _ = _step(ctrl, {"p0": [0] * 4}, step=1, version=3)  # 3 versions old: allowed
    assert groups[0].size == 5
    groups, _ = _step(ctrl, {"p0": [0] * 4}, step=2, version=4)  # 4 > 3: expired
    assert groups[0].size == 4
    ctrl = _ar3po(prompts=1, options={"stages": 1, "reuse": False})
    _seed_store(ctrl)
    assert _step(ctrl, {"p0": [0] * 4}, step=1)[0][0].size == 4


def test_budget_caps_the_stages():
    # 2 prompts x 4 = 8 in stage 1; budget 10 leaves 2 rollouts for stage 2 (trimmed, last prompt first)
    ctrl = _ar3po("control.budget_rollouts=10", prompts=2)
    assert ctrl.budget == 10 and _ar3po().budget == 2 * 4 * 2  # default: the most S stages can ask for
    _seed_store(ctrl)
    groups, planned = _step(ctrl, {"p0": [0] * 6, "p1": [0] * 6}, step=1)
    assert planned == [8, 2]
    # the first prompt got 2 more (still wrong), the second none; both stagings ended all wrong -> both rescued
    assert [g.size for g in groups] == [4 + 2 + 1, 4 + 1]


# ------------------------------------------------------------------ state, registry, config


def test_state_dict_round_trip():
    ctrl = _ar3po(prompts=6)
    rng = random.Random(1)
    for step in range(3):
        _step(ctrl, {f"p{i}": [float(rng.random() < 0.3) for _ in range(8)] for i in range(6)}, step=step, version=step)
    buf = io.BytesIO()
    torch.save(ctrl.state_dict(), buf)  # as the checkpoint stores it
    buf.seek(0)
    twin = _ar3po(prompts=6)
    twin.load_state_dict(torch.load(buf, weights_only=False))
    assert twin.store == ctrl.store and set(twin.store)
    assert twin.history.state_dict() == ctrl.history.state_dict()
    assert twin.stream.state_dict() == ctrl.stream.state_dict()
    scores = {f"p{i}": [0.0] * 8 for i in range(6)}
    a, _ = _step(ctrl, {k: list(v) for k, v in scores.items()}, step=3, version=3)
    b, _ = _step(twin, {k: list(v) for k, v in scores.items()}, step=3, version=3)
    assert a == b and ctrl.store == twin.store


def test_registered_and_shipped_config():
    assert REGISTRY.get("ar3po") is AR3PO
    cfg = load_config("configs/ar3po.toml")
    assert cfg.control.name == "ar3po" and cfg.control.rollouts_per_prompt == 4
    assert cfg.filter.names == ["zero_variance"]
    assert cfg.objective.options == {"tis_level": "token", "tis_low": 1.0, "tis_cap": 1.0}  # option A
    with pytest.raises(Exception, match="stages"):
        load_config(overrides=["control.name=ar3po", "control.options={stages = 0}"])


# ------------------------------------------------------------------ the real loop, scripted answers


def test_loop_trains_on_a_rescued_group(tmp_path):
    """4 train prompts, 4 per step (the same 4 every step), k = 4, S = 2. Step 1: every answer right
    -> 4 rollouts each, all groups all-correct (dropped), all stored. Step 2: every answer wrong ->
    8 each, then each gets its stored response: 4 groups of 9 are trained."""
    from rollwise.trainer.tiny import char_tokenizer

    tok = char_tokenizer()

    def respond(seq, i):
        a, b = tok.decode(seq, skip_special_tokens=True).rstrip("=").replace("-", "+-").split("+")[:2]
        ans = int(a) + int(b)
        return tok.encode(str(ans if i < 16 else ans + 1))

    o = tiny_overrides(
        tmp_path,
        steps=2,
        **{
            "control.name": "ar3po",
            "filter.names": ["zero_variance"],
            "task.options": {"n_train": 4, "n_heldout": 4},
            "eval.at_start": False,
            "model.warm_start.steps": 0,
            "eval.n_prompts": 2,
            "objective.options": {"tis_level": "token", "tis_low": 1.0, "tis_cap": 1.0},
        },
    )
    result = rollwise.train(
        load_config(overrides=as_sets(o)), backend=ScriptedBackend(respond, tok.eos_token_id), log=lambda m: None
    )
    m1, m2 = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert m1["control/rounds"] == 1 and m1["cost/rollouts"] == 16 and m1["filter/all_correct"] == 4
    assert m1["cost/trained_tokens"] == 0 and m1["control/ar3po_store_size"] == 4
    assert m2["control/rounds"] == 2 and m2["cost/rollouts"] == 16 + 32  # cumulative; reused ones not charged
    assert m2["control/ar3po_reused"] == 4 and m2["control/ar3po_fresh_per_prompt"] == 8
    assert m2["control/rollouts_per_prompt_mean"] == 9 and m2["groups/degenerate_frac"] == 0
    assert m2["cost/trained_tokens"] > 0 and not any(k.startswith("filter/") for k in m2)


def test_stop_and_resume_matches_uninterrupted(tmp_path):
    """The store is in the checkpoint: 2 steps + resume for 2 more give the metrics of 4 steps (both
    runs evaluate at step 2, since the scripted backend's checkpointed call counter advances there)."""
    from rollwise.trainer.tiny import char_tokenizer

    tok = char_tokenizer()

    def respond(seq, i):
        a, b = tok.decode(seq, skip_special_tokens=True).rstrip("=").replace("-", "+-").split("+")[:2]
        ans = int(a) + int(b)
        return tok.encode(str(ans if (i * 7919) % 11 < 3 else ans + 1))  # mostly wrong: stages and reuse

    def run(name, steps, resume=False):
        o = tiny_overrides(
            tmp_path,
            name,
            steps=steps,
            **{
                "control.name": "ar3po",
                "filter.names": ["zero_variance"],
                "task.options": {"n_train": 6, "n_heldout": 4},
                "eval.at_start": False,
                "model.warm_start.steps": 0,
                "eval.n_prompts": 2,
                "eval.every": 2,
                "run.checkpoint_every": 2,
                "run.threads": 1,
            },
        )
        rollwise.train(
            load_config(overrides=as_sets(o)),
            resume=resume,
            log=lambda m: None,
            backend=ScriptedBackend(respond, tok.eos_token_id),
        )
        return [
            {k: v for k, v in json.loads(x).items() if not k.startswith(("wall_s", "time/"))}
            for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        ]

    full = run("full", 4)
    run("part", 2)
    assert run("part", 4, resume=True) == full
    assert sum(m["control/ar3po_reused"] for m in full) > 0
