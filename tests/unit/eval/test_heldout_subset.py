"""eval.n_prompts takes prompts evenly spaced through the held-out split (rollwise.eval.evaluate.heldout_subset),
so a split listed by level keeps every level in its share."""

from rollwise.eval.evaluate import heldout_subset


def test_evenly_spaced_indices():
    # 10 prompts, 4 wanted: indices 0*10//4, 1*10//4, 2*10//4, 3*10//4 = 0, 2, 5, 7
    assert heldout_subset(range(10), 4) == [0, 2, 5, 7]


def test_all_when_n_covers_the_split():
    assert heldout_subset(range(5), 5) == [0, 1, 2, 3, 4]
    assert heldout_subset(range(5), 9) == [0, 1, 2, 3, 4]


def test_a_split_listed_by_level_keeps_both_levels():
    split = [4] * 100 + [5] * 100  # arithmetic's held-out split lists its levels in order
    half = heldout_subset(split, 100)
    assert half.count(4) == 50 and half.count(5) == 50  # the first 100 would be level 4 only
