import pytest

from rollwise.eval import metrics
from rollwise.eval.metrics import maj_at_k, pass_at_k


def test_pass_at_k_hand_values():
    # n=4, c=1, k=1: 1 - C(3,1)/C(4,1) = 1 - 3/4 = 0.25
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # n=5, c=2, k=3: 1 - C(3,3)/C(5,3) = 1 - 1/10 = 0.9
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)
    # n-c < k: some pick must be correct
    assert pass_at_k(4, 3, 2) == 1.0
    assert pass_at_k(4, 0, 4) == 0.0


def test_pass_at_1_is_fraction_correct():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)


def test_pass_at_k_rejects_bad_args():
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 2, 5)


def test_public_estimator_is_exported():
    import rollwise.eval as ev

    assert ev.pass_at_k is metrics.pass_at_k


def test_maj_at_k():
    # votes: 7,7,8 -> winner 7 (correct)
    assert maj_at_k(["7", "7", "8", "8"], [True, True, False, False], 3) == 1.0
    # tie 7 vs 8 in first 4: first appearance wins -> "8" first here, wrong
    assert maj_at_k(["8", "7", "8", "7"], [False, True, False, True], 4) == 0.0
    # unverified samples do not vote
    assert maj_at_k([None, None, "5"], [None, None, True], 3) == 1.0
    assert maj_at_k([None], [None], 1) == 0.0
