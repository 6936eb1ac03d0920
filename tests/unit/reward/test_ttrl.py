"""TTRL majority-vote pseudo-rewards (docs/specs/guidance.md §5.1) with the spec's numbers."""

import torch

from rollwise.objectives.advantages import grpo
from rollwise.outcomes import majority_answer
from rollwise.reward.ttrl import Options, TtrlPool, relabel, step_metrics
from rollwise.types import Group, Plan, Prompt, Rollout, Verdict

P = Prompt("p", "arithmetic", "2+3=", "5")


def roll(answer, score=None):
    if answer is None:
        v = Verdict(0.0, "no_answer", {"answer": None})
    else:
        v = Verdict(score if score is not None else float(answer == "5"), "x", {"answer": answer})
    return Rollout("p", (1,), (2,), (0.0,), "stop", 0, str(answer), v)


def test_majority_label_and_rewards():
    # answers [5, 5, 5, 3, 7, 5, 3, 2] -> y_hat = 5, majority ratio 4/8 = 0.5, reward 1 for the four 5s
    g, s = relabel(Group(P, tuple(roll(a) for a in "55537532")))
    assert [r.verdict.score for r in g.rollouts] == [1, 1, 1, 0, 0, 1, 0, 0]
    assert g.rollouts[0].verdict.details["pseudo_label"] == "5"
    assert s["majority_ratio"] == 0.5 and s["label_correct"]


def test_no_ground_truth_in_the_reward():
    # the majority answer 4 is wrong: agreeing rollouts get 1 although their true score is 0
    g, s = relabel(Group(P, tuple(roll(a) for a in "445")))
    assert [r.verdict.score for r in g.rollouts] == [1.0, 1.0, 0.0]
    assert [r.verdict.details["true_score"] for r in g.rollouts] == [0.0, 0.0, 1.0]
    assert not s["label_correct"] and s["reward_hits"] == 0  # every pseudo-reward disagrees with the truth
    m = step_metrics([s])
    assert m["ttrl/label_acc"] == 0.0 and m["ttrl/reward_acc"] == 0.0 and abs(m["ttrl/gt_ratio"] - 1 / 3) < 1e-9


def test_all_equal_answers_give_no_signal():
    g, _ = relabel(Group(P, tuple(roll("7") for _ in range(4))))
    rewards = torch.tensor([r.verdict.score for r in g.rollouts])
    assert rewards.tolist() == [1.0] * 4
    assert torch.equal(grpo(rewards, torch.zeros(4, dtype=torch.long)).values, torch.zeros(4))


def test_no_answer_does_not_vote_and_unlabelled_group_is_unverified():
    g, _ = relabel(Group(P, (roll(None), roll("3"), roll(None))))
    assert [r.verdict.score for r in g.rollouts] == [0.0, 1.0, 0.0]
    g, s = relabel(Group(P, (roll(None), roll(None))))
    assert all(r.verdict.score is None and r.verdict.reason == "ttrl_no_label" for r in g.rollouts)
    assert not s["labelled"]


def test_relabel_is_idempotent_across_rounds():
    g1, _ = relabel(Group(P, tuple(roll(a) for a in "445")))
    g2, _ = relabel(Group(P, g1.rollouts + (roll("5"), roll("5"))))  # a second round: 4,4,5,5,5 -> 5 wins now
    assert [r.verdict.score for r in g2.rollouts] == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert [r.verdict.details["true_score"] for r in g2.rollouts] == [0.0, 0.0, 1.0, 1.0, 1.0]


def test_ties_go_to_the_first_seen():
    assert majority_answer(["3", "5", "5", "3"]) == "3"
    assert majority_answer([None, None]) is None


class _Pool:
    def __init__(self, answers):
        from rollwise.generate.common import StepCost

        self.answers, self.cost, self.evaluated = answers, StepCost(), False

    def generate(self, plan, groups, version):
        return [Group(P, tuple(roll(a) for a in self.answers))]

    def rollouts(self, *a, **k):
        self.evaluated = True
        return "ground-truth scored"


def test_pool_keeps_first_n_sample_and_leaves_evaluation_alone():
    pool = TtrlPool(_Pool("5533335"), Options(train_samples=3))
    (g,) = pool.generate(Plan(), [], 0)
    assert [r.verdict.score for r in g.rollouts] == [0.0, 0.0, 1.0]  # vote over all 7 (3 wins), first 3 kept
    assert pool.cost.metrics["ttrl/majority_ratio"] == 4 / 7
    assert pool.rollouts() == "ground-truth scored" and pool.pool.evaluated
