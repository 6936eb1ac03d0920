"""Credit assignment for multi-turn episodes (issue #30): trajectory GRPO through ``collate``, the
``turn_return`` and ``gigpo`` estimators on hand-made episode rollouts, and their one-turn case."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from rollwise.collate import collate, flatten
from rollwise.objectives import ADVANTAGES
from rollwise.objectives.advantages import GrpoOptions, grpo
from rollwise.objectives.gigpo import GigpoOptions, gigpo
from rollwise.objectives.inputs import advantage_inputs
from rollwise.objectives.turn_return import (
    TurnReturnOptions,
    discounted_returns,
    turn_return,
    turn_rewards,
)
from rollwise.types import Episode, Group, Prompt, Rollout, Turn, Verdict

S3 = 1 / math.sqrt(3)  # 0.57735
S2 = 1 / math.sqrt(2)  # 0.70711


def episode(pid: str, score: float, turns: list[tuple], prompt_len: int = 2) -> Rollout:
    """A multi-turn rollout: ``turns`` = [(policy tokens, observation tokens, reward, anchor)], laid
    out as policy then observation tokens per turn; observation tokens have log-prob 0, loss mask 0."""
    ids, lps, mask, recs, at = [], [], [], [], 0
    for k, (n_pol, n_obs, reward, anchor) in enumerate(turns):
        ids += [10 + k] * n_pol + [90] * n_obs
        lps += [-0.5] * n_pol + [0.0] * n_obs
        mask += [1] * n_pol + [0] * n_obs
        recs.append(Turn(at, at + n_pol, at + n_pol + n_obs, reward=reward, anchor=anchor))
        at += n_pol + n_obs
    return Rollout(
        pid,
        (1,) * prompt_len,
        tuple(ids),
        tuple(lps),
        "stop",
        0,
        verdict=Verdict(score),
        loss_mask=tuple(mask),
        episode=Episode(tuple(recs)),
    )


def single(pid: str, score: float, n: int = 3) -> Rollout:
    return Rollout(pid, (1, 1), (5,) * n, (-0.5,) * n, "stop", 0, verdict=Verdict(score))


def groups_of(*rows_by_prompt: list[Rollout]) -> list[Group]:
    return [Group(Prompt(rows[0].prompt_id, "t", "x", None), tuple(rows)) for rows in rows_by_prompt]


def estimate(fn, groups, opts):
    rows, rewards, gidx = flatten(groups)
    return rows, rewards, gidx, fn(rewards, gidx, opts, **advantage_inputs(fn, rows))


# ---------------------------------------------------------------- 1. trajectory GRPO (the default)


def test_trajectory_grpo_broadcasts_the_row_advantage_to_policy_tokens_only():
    """grpo of the trajectory rewards (1, 0): A = +-0.7071. Through collate the loss mask is 1 exactly
    on the policy tokens (observation tokens are context) and every policy token carries its row's A."""
    a = episode("p", 1.0, [(2, 3, None, None), (2, 2, None, None), (1, 0, None, None)])
    b = episode("p", 0.0, [(3, 1, None, None), (2, 0, None, None)])
    rows, rewards, gidx = flatten(groups_of([a, b]))
    advs = grpo(rewards, gidx, GrpoOptions(eps=0.0))
    assert advs.values.tolist() == pytest.approx([S2, -S2], abs=1e-6)
    batch = collate(rows, rewards, gidx, advs, pad_id=0)
    assert batch.token_advantages is None  # the objective broadcasts batch.advantages
    for i, r in enumerate(rows):
        p, c = len(r.prompt_ids), len(r.completion_ids)
        policy = torch.zeros(batch.loss_mask.shape[1])
        for t in r.episode.turns:
            policy[p + t.start : p + t.end] = 1.0
        assert torch.equal(batch.loss_mask[i], policy)
        assert batch.loss_mask[i, p : p + c].sum() == r.episode.policy_tokens()
        per_token = batch.advantages[:, None] * batch.loss_mask
        assert per_token[i][policy.bool()].tolist() == pytest.approx([advs.values[i].item()] * int(policy.sum()))
    assert batch.num_loss_tokens == a.episode.policy_tokens() + b.episode.policy_tokens() == 10


# ---------------------------------------------------------------- 2. turn_return


def test_turn_rewards_and_discounted_returns():
    turns = (Turn(0, 1, 1), Turn(1, 2, 2, reward=0.5), Turn(2, 3, 3))
    assert turn_rewards(turns, 1.0, "if_absent") == [0.0, 0.5, 0.0]
    assert turn_rewards(turns, 1.0, "add") == [0.0, 0.5, 1.0]
    assert turn_rewards((Turn(0, 1, 1), Turn(1, 2, 2)), 1.0, "if_absent") == [0.0, 1.0]
    assert discounted_returns([0.0, 1.0, 2.0], 0.5) == [1.0, 2.0, 2.0]


# One group, gamma = 0.5, eps = 0, unbiased std:
#   a: 3 turns, no per-turn rewards, outcome 1 -> r = [0, 0, 1]  -> G = [0.25, 0.5, 1]
#   b: 2 turns, turn 0 reward 0.5, outcome 0   -> r = [0.5, 0]   -> G = [0.5, 0]
#   c: 2 turns, no per-turn rewards, outcome 0 -> r = [0, 0]     -> G = [0, 0]
# normalise = "turn_index":
#   turn 0: G = (0.25, 0.5, 0), mean 0.25, std sqrt((0 + 0.0625 + 0.0625) / 2) = 0.25 -> A = (0, 1, -1)
#   turn 1: G = (0.5, 0, 0), mean 1/6, std sqrt((1/9 + 1/36 + 1/36) / 2) = sqrt(1/12) -> A = (1.1547, -0.5774, -0.5774)
#   turn 2: only a reaches it -> A = 0
THREE = [
    ("a", 1.0, [(2, 2, None, None), (2, 2, None, None), (2, 0, None, None)]),  # tokens 0-1 | 4-5 | 8-9
    ("b", 0.0, [(3, 2, 0.5, None), (2, 0, None, None)]),  # tokens 0-2 | 5-6
    ("c", 0.0, [(1, 2, None, None), (1, 0, None, None)]),  # tokens 0 | 3
]


def three_rows():
    return groups_of([episode("p", s, t) for _, s, t in THREE])


def test_turn_return_hand_worked_gamma_half_per_turn_index():
    rows, rewards, gidx, advs = estimate(turn_return, three_rows(), TurnReturnOptions(gamma=0.5, eps=0.0))
    want = [[0.0, 2 * S3, 0.0], [1.0, -S3], [-1.0, -S3]]
    assert advs.values.tolist() == pytest.approx([0.0, 1.0, -1.0], abs=1e-5)
    tv = advs.token_values
    assert tv.shape == (3, 10)
    assert tv[0].tolist() == pytest.approx([0, 0, 0, 0, 2 * S3, 2 * S3, 0, 0, 0, 0], abs=1e-5)
    assert tv[1, :7].tolist() == pytest.approx([1, 1, 1, 0, 0, -S3, -S3], abs=1e-5)
    assert tv[2, :4].tolist() == pytest.approx([-1, 0, 0, -S3], abs=1e-5)
    # through collate: turn k's policy tokens carry A_k, observation tokens are out of the loss
    batch = collate(rows, rewards, gidx, advs, pad_id=0)
    for i, r in enumerate(rows):
        for k, t in enumerate(r.episode.turns):
            span = slice(2 + t.start, 2 + t.end)
            assert batch.token_advantages[i, span].tolist() == pytest.approx([want[i][k]] * (t.end - t.start), abs=1e-5)
            assert batch.loss_mask[i, span].tolist() == [1.0] * (t.end - t.start)
            assert batch.loss_mask[i, 2 + t.end : 2 + t.obs_end].sum() == 0


def test_turn_return_pooled_over_the_group():
    """normalise = 'group': one baseline over the 7 returns (0.25, 0.5, 1 | 0.5, 0 | 0, 0)."""
    _, _, _, advs = estimate(turn_return, three_rows(), TurnReturnOptions(gamma=0.5, eps=0.0, normalise="group"))
    g = torch.tensor([0.25, 0.5, 1.0, 0.5, 0.0, 0.0, 0.0])
    a = ((g - g.mean()) / g.std()).tolist()
    tv = advs.token_values
    assert [tv[0, 0], tv[0, 4], tv[0, 8], tv[1, 0], tv[1, 5], tv[2, 0], tv[2, 3]] == pytest.approx(a, abs=1e-5)


def test_turn_return_gamma_one_and_outcome_add():
    """gamma 1, 'add': b's r = [0.5, 0 + 0] still (outcome 0); a's G = (1, 1, 1); turn-1 returns (1, 0, 0)."""
    _, _, _, advs = estimate(turn_return, three_rows(), TurnReturnOptions(gamma=1.0, eps=0.0, outcome="add"))
    # turn 0: G = (1, 0.5, 0) -> mean 0.5, std 0.5 -> (1, 0, -1)
    assert advs.values.tolist() == pytest.approx([1.0, 0.0, -1.0], abs=1e-5)


# ---------------------------------------------------------------- 3. gigpo


# One group of three episodes, gamma 0.5, omega 1, eps 0, unbiased std. Anchors: every episode's first
# turn acts on "s0"; a's and c's second turns both reach "x1"; the other turns are alone.
#   a: anchors (s0, x1, a2), outcome 1, no turn rewards -> r = [0, 0, 1], R = 1,   G = [0.25, 0.5, 1]
#   b: anchors (s0, b1),     turn 0 reward 0.5, outcome 0 -> r = [0.5, 0], R = 0.5, G = [0.5, 0]
#   c: anchors (s0, x1),     outcome 1                  -> r = [0, 1],   R = 1,   G = [0.5, 1]
# episode level: R = (1, 0.5, 1), mean 5/6, std sqrt(1/12) -> A^E = (0.5774, -1.1547, 0.5774)
# step "s0": G = (0.25, 0.5, 0.5), mean 5/12, std sqrt(1/48) -> A^S = (-1.1547, 0.5774, 0.5774)
# step "x1": G = (a 0.5, c 1) -> A^S = (-0.7071, +0.7071); "b1", "a2": one member -> 0
# A = A^E + A^S:  a = (-0.5774, -0.1298, 0.5774); b = (-0.5774, -1.1547); c = (1.1547, 1.2845)
GIGPO = [
    ("a", 1.0, [(2, 1, None, "s0"), (2, 1, None, "x1"), (1, 0, None, "a2")]),  # tokens 0-1 | 3-4 | 6
    ("b", 0.0, [(1, 1, 0.5, "s0"), (2, 0, None, "b1")]),  # tokens 0 | 2-3
    ("c", 1.0, [(2, 2, None, "s0"), (1, 0, None, "x1")]),  # tokens 0-1 | 4
]


def test_gigpo_hand_worked_shared_anchors():
    groups = groups_of([episode("p", s, t) for _, s, t in GIGPO])
    rows, rewards, gidx, advs = estimate(gigpo, groups, GigpoOptions(gamma=0.5, omega=1.0, eps=0.0))
    want = [[-S3, S3 - S2, S3], [-S3, -2 * S3], [2 * S3, S3 + S2]]
    assert advs.values.tolist() == pytest.approx([w[0] for w in want], abs=1e-5)
    tv = advs.token_values
    assert tv[0, :7].tolist() == pytest.approx([-S3, -S3, 0, S3 - S2, S3 - S2, 0, S3], abs=1e-5)
    assert tv[1, :4].tolist() == pytest.approx([-S3, 0, -2 * S3, -2 * S3], abs=1e-5)
    assert tv[2, :5].tolist() == pytest.approx([2 * S3, 2 * S3, 0, 0, S3 + S2], abs=1e-5)
    # omega = 0 is the episode level alone on every policy token
    _, _, _, ep = estimate(gigpo, groups, GigpoOptions(gamma=0.5, omega=0.0, eps=0.0))
    assert ep.token_values[1, :4].tolist() == pytest.approx([-2 * S3, 0, -2 * S3, -2 * S3], abs=1e-5)


def test_gigpo_anchors_do_not_cross_prompts():
    """The same anchor key in two prompts' groups forms two step groups (one member each here -> 0)."""
    g = groups_of(
        [episode("p", 1.0, [(1, 1, None, "s0"), (1, 0, None, None)]), episode("p", 0.0, [(1, 0, None, None)])],
        [episode("q", 0.0, [(1, 1, None, "s0"), (1, 0, None, None)]), episode("q", 1.0, [(1, 0, None, None)])],
    )
    _, _, _, advs = estimate(gigpo, g, GigpoOptions(eps=0.0))
    assert advs.token_values[:, 0].tolist() == pytest.approx([S2, -S2, -S2, S2], abs=1e-5)


# ---------------------------------------------------------------- 5. the one-turn case is GRPO


@pytest.mark.parametrize(
    "fn,opts",
    [
        (turn_return, TurnReturnOptions()),
        (turn_return, TurnReturnOptions(normalise="group", gamma=0.5)),
        (gigpo, GigpoOptions()),
        (gigpo, GigpoOptions(std="population", eps=1e-4, gamma=0.3, omega=2.0)),
    ],
)
def test_single_turn_rollouts_get_exactly_grpo(fn, opts):
    scores = [[1.0, 0.0, 0.0, 1.0, 1.0], [0.0, 0.0], [1.0, 0.0, 0.5]]
    groups = groups_of(*[[single(f"p{g}", s, n=2 + i) for i, s in enumerate(row)] for g, row in enumerate(scores)])
    rows, rewards, gidx, advs = estimate(fn, groups, opts)
    want = grpo(rewards, gidx, GrpoOptions(eps=opts.eps, std=opts.std)).values
    assert torch.allclose(advs.values, want, atol=1e-6)
    for i, r in enumerate(rows):  # every completion token carries the row's advantage
        c = len(r.completion_ids)
        assert torch.allclose(advs.token_values[i, :c], want[i].expand(c), atol=1e-6)
    # a one-turn Episode (no observation) is the same thing
    one = [
        Rollout(
            r.prompt_id,
            r.prompt_ids,
            r.completion_ids,
            r.logprobs,
            "stop",
            0,
            verdict=r.verdict,
            episode=Episode((Turn(0, len(r.completion_ids), len(r.completion_ids)),)),
        )
        for r in rows
    ]
    again = fn(rewards, gidx, opts, **advantage_inputs(fn, one))
    assert torch.allclose(again.token_values, advs.token_values, atol=1e-6)


def test_registered_with_options_and_refused_with_gspo():
    from rollwise.config import load_config
    from rollwise.registry import UserError

    for name in ("turn_return", "gigpo"):
        fn = ADVANTAGES.get(name)
        assert set(fn.inputs) == {"episodes", "completion_lengths"}
        for info in fn.Options.model_fields.values():
            assert info.description
        with pytest.raises(ValidationError):
            fn.Options(unknown=1)
        load_config(overrides=[f'advantage.name="{name}"'])
        with pytest.raises(UserError, match="per-token"):
            load_config(overrides=[f'advantage.name="{name}"', 'objective.name="gspo"'])


def test_bad_turns_are_refused():
    r = episode("p", 1.0, [(2, 1, None, None)])
    bad = Rollout(
        r.prompt_id,
        r.prompt_ids,
        r.completion_ids,
        r.logprobs,
        "stop",
        0,
        verdict=r.verdict,
        episode=Episode((Turn(0, 2, 9),)),
    )
    with pytest.raises(ValueError, match="turn 0"):
        turn_return(torch.tensor([1.0]), torch.tensor([0]), None, **advantage_inputs(turn_return, [bad]))


def test_the_batch_builder_carries_turn_advantages_to_the_trainer_batch():
    """The loop's batch builder (``batches.Batches``) with advantage 'turn_return': the batch's
    token advantages are the hand-worked ones on policy tokens, 0 on observation tokens."""
    from types import SimpleNamespace

    from rollwise.batches import Batches
    from rollwise.config import Config

    cfg = Config()
    batches = Batches(
        filters=[],
        controller=None,
        advantage=turn_return,
        advantage_options=TurnReturnOptions(gamma=0.5, eps=0.0),
        services=SimpleNamespace(codec=SimpleNamespace(pad_id=0)),
        reward=cfg.reward,  # no shaping: rewards as verified
        max_new_tokens=cfg.sampling.max_new_tokens,
        d3s=cfg.batch.d3s,
        steps=1,
    )
    rows, batch, _, _ = batches.build(three_rows())
    assert batch.token_advantages[1, 2:9].tolist() == pytest.approx([1, 1, 1, 0, 0, -S3, -S3], abs=1e-5)
    assert batch.loss_mask[1, 2:9].tolist() == [1, 1, 1, 0, 0, 1, 1]
