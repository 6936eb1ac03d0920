"""TRL-signature reward functions as one verifier (rollwise.verify.functions): the weighted sum of
the values that are not None, hand-worked; every mistake a function makes names it and the row."""

import numpy as np
import pytest

from rollwise.registry import UserError
from rollwise.types import Verdict
from rollwise.verify.functions import RewardFunctions, function_names


def exact(prompts, completions, answer, **kwargs):
    return [float(c.strip() == str(a)) for c, a in zip(completions, answer)]


def length_bonus(prompts, completions, **kwargs):
    return [len(c) / 10 for c in completions]


def score(funcs, weights=None, completion="42", columns=None, row="dataset row 3"):
    return RewardFunctions(funcs, weights).score("6*7=", completion, columns or {"answer": 42}, row)


def test_one_function_gets_the_columns_as_keyword_lists():
    seen = {}

    def spy(prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions, **kwargs)
        return [0.25]

    v = score([spy], columns={"answer": 42, "level": "easy"})
    assert seen == {"prompts": ["6*7="], "completions": ["42"], "answer": [42], "level": ["easy"]}
    assert v.score == 0.25 and v.verified


def test_weighted_sum_hand_worked():
    # exact("42", 42) = 1, length_bonus("42") = 0.2: 2 * 1 + 0.5 * 0.2 = 2.1
    assert score([exact, length_bonus], [2.0, 0.5]).score == pytest.approx(2.1)
    # a wrong answer of 4 characters: 2 * 0 + 0.5 * 0.4 = 0.2
    assert score([exact, length_bonus], [2.0, 0.5], completion="4242").score == pytest.approx(0.2)
    # default weights 1 each: 1 + 0.2
    assert score([exact, length_bonus]).score == pytest.approx(1.2)


def test_none_is_skipped_and_all_none_is_unverified():
    def unsure(prompts, completions, **kwargs):
        return [None]

    # TRL's nansum: the None of `unsure` adds nothing, 3 * 1 = 3
    v = score([exact, unsure], [3.0, 5.0])
    assert v.score == 3.0 and v.details["reward_funcs"] == {"exact": 1.0, "unsure": None}
    assert score([unsure, unsure]).score is None  # never read as 0
    assert score([lambda prompts, completions, **k: [float("nan")]]).score is None  # NaN, as TRL reads None


def test_rollwise_verdicts_are_accepted_and_kept_alone():
    own = Verdict(1.0, "correct", {"answer": "42"})
    assert score([lambda prompts, completions, **k: [own]]) is own
    assert score([lambda prompts, completions, **k: [Verdict(None, "no_answer")]]).score is None
    # with another function, the verdict's score is one term of the sum: 0.5 * 1 + 1 * 1
    assert score([lambda prompts, completions, **k: [own], exact], [0.5, 1.0]).score == 1.5


def test_numpy_values_and_async_functions():
    assert score([lambda prompts, completions, **k: np.array([0.75])]).score == 0.75

    async def later(prompts, completions, **kwargs):
        return [0.5 for _ in completions]

    assert score([later]).score == 0.5


def test_conversational_completion_is_one_assistant_message():
    def content(prompts, completions, **kwargs):
        return [float(c[0]["content"] == "42" and c[0]["role"] == "assistant") for c in completions]

    r = RewardFunctions([content])
    assert (
        r.score([{"role": "user", "content": "6*7?"}], [{"role": "assistant", "content": "42"}], {}, "row 1").score == 1
    )


def test_a_function_that_raises_is_named_with_the_row():
    def fragile(prompts, completions, answer, **kwargs):
        return [1.0 / (int(c) - 42) for c in completions]

    with pytest.raises(UserError, match=r"reward function 'fragile' raised ZeroDivisionError: .*dataset row 3"):
        score([exact, fragile])


def test_wrong_length_non_number_non_list_and_infinity_are_named():
    def two(prompts, completions, **kwargs):
        return [1.0, 0.0]

    def word(prompts, completions, **kwargs):
        return ["yes"]

    def scalar(prompts, completions, **kwargs):
        return 1.0

    def huge(prompts, completions, **kwargs):
        return [float("inf")]

    with pytest.raises(UserError, match=r"'two' returned 2 values for 1 completion \(dataset row 3\)"):
        score([two])
    with pytest.raises(UserError, match=r"'word' returned 'yes' \(str\) \(dataset row 3\)"):
        score([word])
    with pytest.raises(UserError, match=r"'scalar' returned float .* not a list .*dataset row 3"):
        score([scalar])
    with pytest.raises(UserError, match=r"'huge' returned inf \(dataset row 3\)"):
        score([huge])


def test_bad_functions_and_weights_are_refused_when_given():
    with pytest.raises(UserError, match=r"reward_funcs\[1\] is 'my-model'"):
        RewardFunctions([exact, "my-model"])
    with pytest.raises(UserError, match="reward_funcs: give a list"):
        RewardFunctions([])
    with pytest.raises(
        UserError, match=r"reward_weights has 1 value\(s\) for 2 reward function\(s\) \(exact, length_bonus\)"
    ):
        RewardFunctions([exact, length_bonus], [1.0])
    with pytest.raises(UserError, match=r"reward_weights\[0\] \(for 'exact'\) must be a finite number"):
        RewardFunctions([exact], [float("nan")])


def test_names_are_unique_and_callable_objects_named_by_class():
    class Judge:
        def __call__(self, prompts, completions, **kwargs):
            return [0.0]

    assert function_names([exact, exact, Judge()]) == ["exact", "exact#2", "Judge"]
