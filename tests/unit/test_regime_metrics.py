"""The per-step regime statistics (session.regime_metrics, issue #18): all-correct / all-wrong
group shares over groups with two or more verified rewards, and response-length quantiles."""

from rollwise.session import regime_metrics, step_metrics
from rollwise.types import Group, Prompt, Rollout, Verdict


def _group(i, scores, lengths, finish="stop"):
    p = Prompt(f"p{i}", "t", f"{i}", "0")
    rs = tuple(Rollout(p.id, (1,), (2,) * n, (-1.0,) * n, finish, 0, "", Verdict(s)) for s, n in zip(scores, lengths))
    return Group(p, rs)


def test_all_correct_all_wrong_and_lengths_by_hand():
    groups = [
        _group(0, [1.0, 1.0], [2, 4]),  # all correct
        _group(1, [0.0, 0.0], [6, 8]),  # all wrong
        _group(2, [1.0, 0.0], [10, 12]),  # mixed
        _group(3, [0.0, None], [14, 16], "length"),  # one verified reward: not counted
    ]
    m = regime_metrics(groups)
    assert m["groups/all_correct_frac"] == 1 / 3 and m["groups/all_wrong_frac"] == 1 / 3
    # lengths 2..16 (8 values): p50 = 4th = 8, p90 = ceil(7.2) = 8th = 16, max 16; 2 of 8 cut
    assert (m["length/p50"], m["length/p90"], m["length/p99"], m["length/max"]) == (8, 16, 16, 16)
    assert m["length/truncated_frac"] == 2 / 8
    assert step_metrics(groups, {}, [8])["groups/all_wrong_frac"] == 1 / 3


def test_partial_credit_is_neither():
    m = regime_metrics([_group(0, [0.5, 0.4], [1, 1])])  # one at CORRECT (0.5), one below
    assert m["groups/all_correct_frac"] == 0 and m["groups/all_wrong_frac"] == 0
    assert regime_metrics([])["groups/all_correct_frac"] == 0
