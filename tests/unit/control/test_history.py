from rollwise.control.history import PromptHistory
from rollwise.types import Group, Prompt, Rollout, Verdict


def _group(pid, scores):
    p = Prompt(pid, "t", "x", "1")
    return Group(p, tuple(Rollout(pid, (1,), (2,), (-1.0,), "stop", 0, "", Verdict(s)) for s in scores))


def test_records_counts_and_streaks():
    h = PromptHistory()
    h.record([_group("a", [1, 0, 1, None]), _group("b", [0, 0])], step=0)
    h.record([_group("a", [1, 1]), _group("b", [0, 0])], step=1)
    h.record([_group("b", [1, 0])], step=2)
    # a: step 0 has 3 verified (None left out), 2 correct; step 1: 2 of 2
    assert h.totals("a") == (5, 4)
    assert h.last("a").is_zv and h.zv_streak("a") == 1
    assert h.zv_streak("b") == 0 and h.of("b")[0].is_zv
    assert h.last("a").mean_reward == 1.0 and abs(h.of("a")[0].mean_reward - 2 / 3) < 1e-12
    other = PromptHistory()
    other.load_state_dict(h.state_dict())
    assert other.records == h.records
    assert h.dump()["a"] == {"visits": 2, "rollouts": 5, "correct": 4, "last_mean": 1.0, "zv_streak": 1}


def test_zero_variance_test_on_groups():
    assert _group("a", [1, 1]).is_zero_variance()
    assert not _group("a", [1, 0]).is_zero_variance()
    assert _group("a", [1, None]).is_zero_variance()  # one verified reward: no signal
    assert _group("a", [0.5, 0.55]).is_zero_variance(tol=0.1)
