"""Test-time RL (``reward.ttrl``): the training reward of a rollout is its agreement with the
majority answer of its group; no reference answer is used for training.

Paper: "TTRL: Test-Time Reinforcement Learning", Zuo et al. (PRIME-RL), arXiv 2504.16084; code
PRIME-RL/TTRL @ 3e2cc93 (``reward_manager/ttrl.py``, ``ttt_metrics.py``); docs/specs/guidance.md §5.1.

Per group (one prompt, N_vote rollouts) after generation:

1. every rollout's answer is the one its task verifier extracted (``Verdict.details["answer"]``,
   the key maj@k voting reads; the verifiers normalise it: ``exact`` gives the integer, ``math``
   its parsed form), else its stripped text; rollouts without an answer do not vote;
2. pseudo-label ``y_hat`` = the most frequent answer, ties to the first seen
   (:func:`rollwise.outcomes.majority_answer`, as ``Counter.most_common`` in the code);
3. reward ``1`` if the rollout's answer equals ``y_hat``, else ``0`` (no answer: 0); the verdict
   becomes ``Verdict(agree, "ttrl_agree" | "ttrl_disagree", details)`` with the original
   verdict's score kept as ``details["true_score"]`` for the metrics below only. A group in which
   no rollout has an answer cannot be labelled: its rollouts get ``Verdict(None,
   "ttrl_no_label")`` (could not verify, never 0);
4. with ``train_samples = N_sample`` only the first N_sample rollouts of each group are kept for
   training (the vote used all N_vote; ``_select_top_k_per_prompt`` takes the first, not the best).

Evaluation is untouched: it generates through ``rollouts`` of the wrapped pool and is scored
against the reference answers (ground truth only in evaluation).

Logged per step (the code's ``ttt_metrics``): ``ttrl/label_acc`` (groups whose pseudo-label is
correct, i.e. its rollouts' true score >= 0.5), ``ttrl/reward_acc`` (rollouts whose pseudo-reward
equals their true 0/1 reward), ``ttrl/majority_ratio`` (mean share of the vote won by y_hat),
``ttrl/gt_ratio`` (mean share of correct answers), ``ttrl/unlabelled`` (groups without a label).

Differences: agreement is equality of the extracted answers (the code calls its math grader on
(answer, y_hat)); the verifier is called once per rollout with the task's reference to extract
the answer (its score is kept only for the metrics), so a task whose verifier cannot extract
without a reference falls back to the stripped text. The code's reward-position quirk (§5.1) does
not arise: rewards here are per sequence. A controller's extra rounds merge into the groups and
are re-voted with all rollouts kept so far.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rollwise.outcomes import majority_answer
from rollwise.sections.reward import TtrlOptions as Options  # noqa: F401 (the schema lives in its section)
from rollwise.types import Group, Plan, PoolWrapper, Rollout, Verdict


def answer_of(r: Rollout) -> str | None:
    """The rollout's extracted answer (module docstring, step 1); None when it has none."""
    v = r.verdict
    original = v.details.get("ttrl_original", v) if v is not None else None
    if original is None:
        return r.text.strip() or None
    if "answer" in original.details:
        a = original.details["answer"]
        return None if a is None else str(a)
    return r.text.strip() or None


def true_score(r: Rollout) -> float | None:
    v = r.verdict
    return None if v is None else v.details.get("ttrl_original", v).score


def relabel(group: Group) -> tuple[Group, dict]:
    """The group with majority-vote pseudo-rewards (module docstring) and its label statistics."""
    answers = [answer_of(r) for r in group.rollouts]
    label = majority_answer(answers)
    out = []
    for r, a in zip(group.rollouts, answers):
        original = (
            r.verdict.details.get("ttrl_original", r.verdict) if r.verdict is not None else Verdict(None, "no_verdict")
        )
        if label is None:
            v = Verdict(None, "ttrl_no_label", {"ttrl_original": original})
        else:
            agree = a is not None and a == label
            v = Verdict(
                1.0 if agree else 0.0,
                "ttrl_agree" if agree else "ttrl_disagree",
                {"answer": a, "pseudo_label": label, "true_score": original.score, "ttrl_original": original},
            )
        out.append(dataclasses.replace(r, verdict=v))
    votes = [a for a in answers if a is not None]
    truth = [true_score(r) for r in group.rollouts]
    stats = {
        "labelled": label is not None,
        "majority_ratio": votes.count(label) / len(votes) if votes else 0.0,
        "label_correct": any(a == label and s is not None and s >= 0.5 for a, s in zip(answers, truth)),
        "gt_ratio": sum(s is not None and s >= 0.5 for s in truth) / max(1, len(truth)),
        "reward_hits": sum(
            (v.verdict.score is not None and s is not None and (v.verdict.score >= 0.5) == (s >= 0.5))
            for v, s in zip(out, truth)
        ),
        "rollouts": len(out),
    }
    return Group(group.prompt, tuple(out)), stats


def step_metrics(stats: Sequence[dict]) -> dict[str, float]:
    n = max(1, len(stats))
    labelled = [s for s in stats if s["labelled"]]
    return {
        "ttrl/label_acc": sum(s["label_correct"] for s in labelled) / max(1, len(labelled)),
        "ttrl/reward_acc": sum(s["reward_hits"] for s in stats) / max(1, sum(s["rollouts"] for s in stats)),
        "ttrl/majority_ratio": sum(s["majority_ratio"] for s in stats) / n,
        "ttrl/gt_ratio": sum(s["gt_ratio"] for s in stats) / n,
        "ttrl/unlabelled": float(len(stats) - len(labelled)),
    }


class TtrlPool(PoolWrapper):
    """Wraps a pool: training groups get majority-vote pseudo-rewards (module docstring);
    evaluation (``rollouts``) and the cost hand-over are the wrapped pool's."""

    def __init__(self, pool, opts: Options):
        super().__init__(pool)
        self.opts = opts

    def generate(self, plan: Plan, groups: list[Group], version: int) -> list[Group]:
        out, stats = [], []
        for g in self.pool.generate(plan, groups, version):
            g, s = relabel(g)
            if self.opts.train_samples is not None:
                g = Group(g.prompt, g.rollouts[: self.opts.train_samples])
            out.append(g)
            stats.append(s)
        self.pool.cost.metrics.update(step_metrics(stats))  # the latest round's view of every group of the step
        return out

    def __getattr__(self, name):  # backend, codec, ... are the wrapped pool's
        if name == "pool":
            raise AttributeError(name)
        return getattr(self.pool, name)
