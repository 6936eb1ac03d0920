"""The built-in arithmetic task: determinism, disjoint splits, levels, options, CoT traces."""

from collections import Counter

import pytest

from rollwise.registry import UserError, validate_options
from rollwise.tasks import REGISTRY
from rollwise.tasks.arithmetic import RAMBLE_MAX_SEGMENTS, allocate, draw, draw_ramble, ramble_trace, trace, value
from rollwise.types import Task

make = REGISTRY.get("arithmetic")


def texts(prompts):
    return [p.text for p in prompts]


def test_is_a_task_with_defaults():
    t = make(None, {})
    assert isinstance(t, Task)
    assert len(t.train_prompts()) == 5000 and len(t.heldout_prompts()) == 200
    p = t.train_prompts()[0]
    assert p.text.endswith("=") and p.answer == str(eval(p.text[:-1]))  # noqa: S307 (digits and +-* only)
    assert p.messages is None and p.task == "arithmetic"
    assert all(32 <= ord(c) < 127 for p in t.train_prompts() for c in p.text + p.answer)


def test_same_seed_same_splits_other_seed_differs():
    a, b, c = make(None, {"seed": 3}), make(None, {"seed": 3}), make(None, {"seed": 4})
    assert texts(a.train_prompts()) == texts(b.train_prompts())
    assert texts(a.heldout_prompts()) == texts(b.heldout_prompts())
    assert texts(a.heldout_prompts()) != texts(c.heldout_prompts())


def test_heldout_does_not_depend_on_n_train():
    a, b = make(None, {"n_train": 100}), make(None, {"n_train": 3000})
    assert texts(a.heldout_prompts()) == texts(b.heldout_prompts())


def test_splits_disjoint_and_ids_unique():
    t = make(None, {"levels": [1, 2, 3, 4, 5], "n_train": 2000, "n_heldout": 300})
    train, held = set(texts(t.train_prompts())), set(texts(t.heldout_prompts()))
    assert len(train) == 2000 and len(held) == 300 and not train & held
    ids = [p.id for p in (*t.train_prompts(), *t.heldout_prompts())]
    assert len(ids) == len(set(ids))


def test_levels_are_shared_evenly_within_capacity():
    t = make(None, {"levels": [1, 2, 3, 4, 5], "n_train": 1000, "n_heldout": 100})
    assert Counter(p.metadata["level"] for p in t.heldout_prompts()) == {lv: 20 for lv in range(1, 6)}
    # level 1 has 100 - 20 = 80 expressions left for train; its missing 120 go to the other four
    assert Counter(p.metadata["level"] for p in t.train_prompts()) == {1: 80, 2: 230, 3: 230, 4: 230, 5: 230}
    # level 1 has 100 expressions: at most 25 held out, the rest of the 200 spills to level 2;
    # train then gets the 75 left of level 1 and 5000 - 75 of level 2.
    t = make(None, {})
    assert Counter(p.metadata["level"] for p in t.heldout_prompts()) == {1: 25, 2: 175}
    assert Counter(p.metadata["level"] for p in t.train_prompts()) == {1: 75, 2: 4925}


def test_allocate_spills_over():
    assert allocate(10, {1: 2, 2: 100, 3: 100}, "x") == {1: 2, 2: 4, 3: 4}
    with pytest.raises(UserError, match="at most 25 held-out"):
        allocate(26, {1: 25}, "held-out")


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5])
def test_level_definitions(level):
    import random

    rng = random.Random(level)
    for _ in range(300):
        e = draw(level, rng)
        nums, ops = e[0::2], set(e[1::2])
        assert value(e) >= 0
        if level == 1:
            assert ops == {"+"} and max(nums) <= 9
        elif level in (2, 4):
            hi = 99 if level == 2 else 999
            assert len(nums) == 2 and ops <= {"+", "-"} and hi // 10 < max(nums) <= hi
        elif level == 3:
            assert len(nums) == 3 and ops <= {"+", "-"} and max(nums) <= 99 and value(e[:3]) >= 0
        else:
            assert ops == {"*"} and max(nums) <= 99


def test_bad_options_are_user_errors():
    with pytest.raises(UserError, match="levels"):
        validate_options("task", "arithmetic", make, {"levels": [0]})
    with pytest.raises(UserError, match="n_train"):
        make(None, {"n_train": 0})
    with pytest.raises(UserError, match="bogus"):
        make(None, {"bogus": 1})
    with pytest.raises(UserError, match="at most 25 held-out"):
        make(None, {"levels": [1]})  # default n_heldout 200 > 25
    with pytest.raises(UserError, match="at most 75 train"):
        make(None, {"levels": [1], "n_heldout": 25, "n_train": 76})
    with pytest.raises(UserError, match="no argument"):
        make("x", {})


def test_verify_and_sft_examples():
    t = make(None, {"n_train": 50, "n_heldout": 10})
    p = t.heldout_prompts()[0]
    assert t.verify(p, p.answer).score == 1.0
    assert t.verify(p, str(int(p.answer) + 1)).score == 0.0
    ex = t.sft_examples(80, seed=1)  # more than the pool: repeats allowed
    assert len(ex) == 80 and ex == t.sft_examples(80, seed=1)
    train = set(texts(t.train_prompts()))
    assert all(p.text in train and target == p.answer for p, target in ex)


def test_cot_traces():
    # 47+85: 7+5=12 write 2 carry 1; 4+8+1=13 -> 132
    assert trace((47, "+", 85)) == "7+5+0=12,4+8+1=13,=132"
    # 42-17: 2-7 borrows (-5+10=5); 4-1-1=2 -> 25
    assert trace((42, "-", 17)) == "2-7-0=-5+10=5,4-1-1=2,=25"
    # 47*36: 47*6=282, 47*3=141, 282+1410=1692
    assert trace((47, "*", 36)) == "47*6=282,47*3=141,282+1410=1692,=1692"
    assert trace((12, "+", 34, "-", 5)) == "2+4+0=6,1+3+0=4,=46;6-5-0=1,4-0-0=4,=41"
    t = make(None, {"levels": [1, 2, 3, 4, 5], "cot": True, "n_train": 200, "n_heldout": 20})
    for p, target in t.sft_examples(200, seed=0):
        assert target.endswith("=" + p.answer)
        assert t.verify(p, target).score == 1.0
    lengths = [len(target) for _, target in t.sft_examples(200, seed=0)]
    assert max(lengths) > 3 * min(lengths)  # long-tailed lengths


# ---------------------------------------------------------------- rambling traces (issue #43 item 3)


def test_ramble_trace_hand_examples():
    # 47+85 = "7+5+0=12,4+8+1=13,=132": after its second digit step (4+8+1=13) the step is redone
    # with 13-1 and 13+2, then '?' closes the ramble without '=132'
    assert ramble_trace((47, "+", 85), 1, (-1, 2)) == "7+5+0=12,4+8+1=13?4+8+1=12?4+8+1=15?"
    # a borrowing step's result is the one after '+10': 2-7-0=-5+10=5, re-checked as 6
    assert ramble_trace((42, "-", 17), 0, (1,)) == "2-7-0=-5+10=5?2-7-0=-5+10=6?"
    # 47*36: the third digit step is the sum of the partials, 282+1410=1692
    assert ramble_trace((47, "*", 36), 2, (1,)) == "47*6=282,47*3=141,282+1410=1692?282+1410=1693?"
    # 12+34-5: the operation results (=46) are not steps; the third digit step is 6-5-0=1
    assert ramble_trace((12, "+", 34, "-", 5), 2, (2,)) == "2+4+0=6,1+3+0=4,=46;6-5-0=1?6-5-0=3?"


def test_drawn_rambles_are_wrong_and_geometric():
    import random
    import statistics

    from rollwise.verify import exact

    rng = random.Random(0)
    for expr in [(1, "+", 0), (9, "*", 1), (99, "*", 99), (12, "+", 34, "-", 5), (42, "-", 17)]:
        for _ in range(200):
            r = draw_ramble(expr, rng, 4.0)
            checks = r.split("?")[1:-1]  # the re-checks: each one's result is off the answer
            assert (
                r.endswith("?")
                and checks
                and all(int(c.rsplit("=", 1)[1]) not in (value(expr), -1, -2) for c in checks)
            )
            assert exact.last_int(r) != value(expr)
    # 1+0 = "1+0+0=1,=1": one step, result 1 = the answer, so every slip is +1 or +2 or -1 (0)
    assert {exact.last_int(draw_ramble((1, "+", 0), rng, 2.0)) for _ in range(200)} == {0, 2, 3}
    counts = [draw_ramble((47, "+", 85), rng, 5.0).count("?") - 1 for _ in range(4000)]  # re-checks
    assert min(counts) == 1 and abs(statistics.mean(counts) - 5.0) < 0.3  # 1 + geometric: mean 5
    assert sum(c == 1 for c in counts) / len(counts) == pytest.approx(0.2, abs=0.03)  # stop at the first '?': 1/5
    assert max(draw_ramble((47, "+", 85), rng, 48.0).count("?") - 1 for _ in range(300)) == RAMBLE_MAX_SEGMENTS


def test_ramble_examples_share_by_level_and_default_unchanged():
    opts = {"levels": [2, 3], "cot": True, "n_train": 300, "n_heldout": 20}
    plain = make(None, opts).sft_examples(3000, seed=1)
    t = make(None, {**opts, "ramble": {3: 0.4}})
    ex = t.sft_examples(3000, seed=1)
    assert ex == t.sft_examples(3000, seed=1)  # drawn by the seed
    assert [p.id for p, _ in ex] == [p.id for p, _ in plain]  # the same prompts, in the same order
    rambles = [(p, s) for p, s in ex if s.endswith("?")]
    assert all(p.metadata["level"] == 3 for p, _ in rambles)  # level 2 never rambles
    level3 = sum(p.metadata["level"] == 3 for p, _ in ex)
    assert len(rambles) / level3 == pytest.approx(0.4, abs=0.04)
    assert all(t.verify(p, s).score == 0.0 for p, s in rambles)  # a ramble never answers
    assert all(s == u for (_, s), (_, u) in zip(ex, plain) if not s.endswith("?"))  # the others are the traces
    assert all(t.target(p) == trace(p.metadata["expr"]) for p, _ in rambles)  # references unchanged


def test_default_warm_start_examples_are_byte_identical():
    """Regime 1 (benchmarks/regime_cot.toml) and the embedded default keep their warm-start examples
    (and so their cached warm starts): digests of 2,000 examples taken before the ramble option."""
    import hashlib

    def digest(opts):
        ex = make(None, opts).sft_examples(2000, 0)
        return hashlib.sha256(repr([(p.id, s) for p, s in ex]).encode()).hexdigest()

    assert digest({"levels": [3, 4, 5], "cot": True}) == (
        "c17340c5b718a8a0dd2db8cdf3748022074672cb740174086ac219de01286969"
    )
    assert digest({}) == "6cd612055b0040c84e7b5c120e7fcb1ce682aa85a28ce24b61585319fdbb35bd"
    assert digest({"levels": [3, 4, 5], "cot": True, "ramble": {}}) == digest({"levels": [3, 4, 5], "cot": True})


@pytest.mark.parametrize(
    ("ramble", "extra", "match"),
    [
        ({5: 0.5}, {"cot": False}, "ramble needs cot = true"),
        ({4: 0.5}, {}, r"ramble names level\(s\) \[4\] that are not in levels \[3, 5\]"),
        ({5: 1.0}, {}, r"ramble.*\[0, 1\)"),
        ({5: -0.1}, {}, r"ramble.*\[0, 1\)"),
        ({"x": 0.5}, {}, "ramble"),
    ],
)
def test_bad_ramble_options_name_the_key(ramble, extra, match):
    with pytest.raises(UserError, match=match) as e:
        make(None, {"levels": [3, 5], "cot": True, "ramble": ramble, **extra})
    assert "task.options" in str(e.value)
    with pytest.raises(UserError, match="task.options.ramble_segments"):
        make(None, {"levels": [3, 5], "cot": True, "ramble": {5: 0.5}, "ramble_segments": 0.5})


TAIL_OPTIONS = "task.options={cot = true, levels = [2, 3, 5], ramble = {3 = 0.25, 5 = 0.6}}"  # regime_tail's


def test_ramble_without_max_new_tokens_is_refused_at_load_naming_both_keys():
    """At config load (``compat.check``), so before any model is built or warm-started."""
    from rollwise.config import Config, load_config
    from rollwise.defaults import derive
    from rollwise.tasks import build
    from rollwise.trainer.tiny import build_tiny

    # what the refusal prevents: unset, the cap follows the longest warm-start example, a 410-character
    # ramble: (410 + 1) x 1.25 -> 520 tokens, past the tiny model's 512 positions
    unchecked = Config.model_validate(
        {"task": {"options": {"cot": True, "levels": [2, 3, 5], "ramble": {3: 0.25, 5: 0.6}}}}
    )
    assert derive(unchecked, build(unchecked))["sampling.max_new_tokens"][0] == 520
    assert build_tiny("tiny")[0].config.max_position_embeddings == 512
    with pytest.raises(
        UserError, match=r"task\.options\.ramble = \{3: 0\.25, 5: 0\.6\}.*sampling\.max_new_tokens is unset"
    ):
        load_config(None, [TAIL_OPTIONS])
    # set, the key is the user's: accepted, as is a ramble-free chain of thought with the cap derived
    assert load_config(None, [TAIL_OPTIONS, "sampling.max_new_tokens=256"]).sampling.max_new_tokens == 256
    assert load_config(None, ["task.options={cot = true, levels = [2, 3, 5]}"]).task.options["cot"] is True
