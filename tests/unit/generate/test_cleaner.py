"""CLEANER (issue #44 item 3; rollwise.generate.cleaner): a failed calculator call repaired by a later
turn becomes one successful call, shallow or deep by the code similarity; the spliced row's log-probs
from the splice on are the sampler's re-scored ones; an episode without a repair is unchanged; refusals."""

import dataclasses

import pytest

from calc_episodes import TOK, play, says, turn_texts
from rollwise.backends.scripted import ScriptedBackend
from rollwise.config import load_config
from rollwise.generate.cleaner import find_repairs, similarity
from rollwise.registry import UserError
from rollwise.sections.task import CleanerConfig
from rollwise.types import ToolCall, Turn


class Scoring(ScriptedBackend):
    """The scripted policy, whose ``score`` gives token p of a sequence the log-prob -p/100 (so a test
    can tell a re-scored position, and which position it was scored at, from a sampled one: -0.5)."""

    def __init__(self, turns):
        super().__init__(says(turns), TOK.eos_token_id)
        self.scored = []

    def score(self, sequences, starts, sampling, full=False):
        self.scored.append((list(map(tuple, sequences)), list(starts)))
        return [tuple(-p / 100 for p in range(st, len(s))) for s, st in zip(sequences, starts)]


def run(turns, threshold=0.5, enabled=True, charge=True):
    backend = Scoring(turns)
    r, cost = play(backend, charge, cleaner=CleanerConfig(enabled=enabled, threshold=threshold))
    return r, backend, cost


def untimed(r):
    """The rollout with its tool calls' seconds (wall-clock) zeroed."""
    turns = tuple(
        dataclasses.replace(t, tool_calls=tuple(dataclasses.replace(c, seconds=0.0) for c in t.tool_calls))
        for t in r.episode.turns
    )
    return dataclasses.replace(r, episode=dataclasses.replace(r.episode, turns=turns))


FAILED_THEN_FIXED = ["try <calc>12+</calc>", "fix <calc>12+3</calc>", "15"]


def test_a_repaired_call_becomes_one_successful_call_shallow_keeps_the_failed_turns_reasoning():
    r, backend, cost = run(FAILED_THEN_FIXED, threshold=0.5)  # similarity("12+", "12+3") = 6/7 >= 0.5
    assert turn_texts(r) == [("try <calc>12+3</calc>", "<out>15</out>"), ("15", "")]
    assert [c.outcome for c in r.episode.tool_calls] == ["ok"] and r.reward == 1.0
    assert r.episode.turns[0].start == 0 and r.text == "try <calc>12+3</calc><out>15</out>15"
    # the ledger counted the calls that ran (the failure included) before the splice
    assert cost.metrics["episodes/tool_error"] == 1 and cost.metrics["episodes/tool_ok"] == 1
    assert cost.metrics["cleaner/rows"] == 1 and cost.metrics["cleaner/shallow"] == 1
    unspliced = len("try <calc>12+</calc>") + 1 + len("<out>ValueError: cannot parse '12+'</out>")
    assert cost.metrics["cleaner/tokens_removed"] == unspliced  # the failed turn and its observation


def test_deep_splice_below_the_threshold_takes_the_repairs_reasoning_too():
    assert similarity("12+", "12+3") == pytest.approx(6 / 7)
    r, _, cost = run(FAILED_THEN_FIXED, threshold=0.9)
    assert turn_texts(r) == [("fix <calc>12+3</calc>", "<out>15</out>"), ("15", "")]
    assert cost.metrics["cleaner/deep"] == 1 and cost.metrics.get("cleaner/shallow", 0) == 0


def test_spliced_rows_are_rescored_from_the_splice_on_at_their_new_positions():
    r, backend, _ = run(FAILED_THEN_FIXED)
    ((seqs, starts),) = backend.scored
    p = len(r.prompt_ids)
    assert seqs == [r.prompt_ids + r.completion_ids] and starts == [p]  # the splice is at turn 0
    policy = {i for t in r.episode.turns for i in range(t.start, t.end)}
    for i, lp in enumerate(r.logprobs):
        assert lp == (pytest.approx(-(p + i) / 100) if i in policy else 0.0)
    assert r.loss_mask == tuple(int(i in policy) for i in range(len(r.completion_ids)))


def test_consecutive_failures_are_one_call_and_a_splice_after_a_good_turn_keeps_the_turns_before_it():
    turns = ["<calc>1+1</calc>", "<calc>12+</calc>", "<calc>12+ +</calc>", "<calc>12+3</calc>"]
    r, backend, _ = run([*turns, "15"][:4])
    assert [t for t, _ in turn_texts(r)] == ["<calc>1+1</calc>", "<calc>12+3</calc>"]
    assert [c.outcome for c in r.episode.tool_calls] == ["ok", "ok"]
    ((_, starts),) = backend.scored
    first = r.episode.turns[1].start
    assert starts == [len(r.prompt_ids) + first]
    assert all(lp == -0.5 for lp in r.logprobs[: r.episode.turns[0].end])  # before the splice: as sampled


def test_an_episode_without_a_repair_is_unchanged_and_evaluation_is_never_spliced():
    plain, backend, cost = run(["<calc>12+</calc>", "15"])  # a failure, then the answer: nothing repaired it
    off, _, _ = run(["<calc>12+</calc>", "15"], enabled=False)
    assert untimed(plain) == untimed(off) and backend.scored == [] and "cleaner/rows" not in cost.metrics
    evaluated, backend, _ = run(FAILED_THEN_FIXED, charge=False)
    assert len(evaluated.episode.turns) == 3 and backend.scored == []


def test_find_repairs_on_outcomes():
    def turn(*outcomes, code="x"):
        return Turn(0, 0, 0, tool_calls=tuple(ToolCall("calc", code, 0.0, o) for o in outcomes))

    answer = Turn(0, 0, 0)
    assert find_repairs([turn("error"), turn("ok"), answer], 0.5)[0].failed == 0
    assert find_repairs([turn("error"), answer], 0.5) == []
    assert find_repairs([turn("timeout"), turn("limit")], 0.5) == []  # a call over the limit did not run
    assert find_repairs([turn("ok"), turn("truncated")], 0.5) == []  # truncated output: the call ran
    (rep,) = find_repairs([turn("parse_error", code="ab"), turn("unknown_tool"), turn("ok", code="zz")], 0.5)
    assert (rep.failed, rep.repair, rep.depth) == (0, 2, "deep")


def test_cleaner_is_refused_on_tasks_without_tools_and_on_single_turn_tasks(tmp_path):
    import rollwise

    with pytest.raises(UserError, match=r"task\.cleaner\.enabled .* task\.name = 'guess_number' calls no tools"):
        load_config(None, ["task.name=guess_number", "task.cleaner.enabled=true"])
    cfg = load_config(None, [f"run.dir={tmp_path}", "run.name=t", "task.cleaner.enabled=true", "train.steps=1"])
    with pytest.raises(UserError, match=r"task\.cleaner applies to environment tasks"):
        rollwise.train(cfg, log=lambda m: None)
    assert not (tmp_path / "t").exists()
    assert load_config(None, ["task.name=calculator", "task.cleaner.enabled=true"]).task.cleaner.threshold == 0.5
