from rollwise.filter.basic import errored, overlong, zero_variance
from rollwise.types import Group, Prompt, Rollout, Verdict


def _group(scores, finish="stop"):
    p = Prompt("p", "t", "x", "1")
    rs = tuple(Rollout("p", (1,), (2,), (-1.0,), finish, 0, "", Verdict(s)) for s in scores)
    return Group(p, rs)


def test_zero_variance_reasons():
    assert zero_variance(_group([1, 0, 1])).keep
    assert zero_variance(_group([1, 1])).reason == "all_correct"
    assert zero_variance(_group([0, 0])).reason == "all_wrong"
    assert zero_variance(_group([0.5, 0.5])).reason == "all_equal"
    # unverified rollouts are ignored, not counted as 0
    assert zero_variance(_group([1, None, 1])).reason == "all_correct"
    assert zero_variance(_group([None, None])).reason == "no_verified"


def test_zero_variance_tolerance():
    opts = zero_variance.Options(tol=0.1)
    assert not zero_variance(_group([0.50, 0.55]), opts).keep
    assert zero_variance(_group([0.5, 0.7]), opts).keep


def test_overlong_and_errored():
    assert not overlong(_group([0, 1], finish="length")).keep
    assert overlong(_group([0, 1])).keep
    assert not errored(_group([1, None])).keep
    assert errored(_group([1, 0])).keep
