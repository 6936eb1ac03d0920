"""Turn budgets (issue #44 item 6; rollwise.generate.turn_budget): the cap read from the observed
turns, its extensions, the savings in the ledger, and the refusal on single-turn tasks, with
scripted episodes in the episode pool."""

import pytest

from rollwise.backends.scripted import ScriptedBackend
from rollwise.config import load_config
from rollwise.envs.base import StepResult
from rollwise.generate.episodes import EpisodeLimits, EpisodePool
from rollwise.generate.turn_budget import TurnBudget, moving
from rollwise.registry import UserError
from rollwise.sections.task import TaskConfig, TurnBudgetConfig, check_single_turn
from rollwise.tokens import Codec
from rollwise.trainer.tiny import char_tokenizer
from rollwise.types import Plan, Prompt, Request, Sampling, ToolCall, Turn, Verdict

TOK = char_tokenizer()
CODEC = Codec(TOK, use_chat=False)


class Env:
    """Ends (reward 1) at turn ``done_at`` of the prompt's metadata; each other turn answers " ok:".
    Its state (the anchor) changes every turn when ``moves``, else stays the same."""

    def __init__(self, prompt):
        self.done_at, self.moves, self.turn = prompt.metadata["done_at"], prompt.metadata["moves"], 0

    def reset(self, seed):
        pass

    def step(self, action):
        self.turn += 1
        anchor = f"s{self.turn}" if self.moves else "s"
        if self.turn == self.done_at:
            return StepResult("", reward=1.0, done=True, verdict=Verdict(1.0, "correct"), anchor=anchor)
        return StepResult(" ok:", reward=0.0, anchor=anchor)


class Task:
    name = "script"

    def environment(self, prompt):
        return Env(prompt)

    def verify(self, prompt, completion):
        return Verdict(None, "no")


def prompt(name, done_at, moves=True):
    return Prompt(name, "script", "go: ", None, metadata={"done_at": done_at, "moves": moves})


def plan(*prompts):
    return Plan(tuple(Request(p, 1) for p in prompts))


def pool(**budget):
    opts = TurnBudgetConfig(enabled=True, **{"warmup_episodes": 4, "max_extensions": 0, **budget})
    backend = ScriptedBackend(lambda seq, i: TOK.encode("7"), TOK.eos_token_id)  # 2 tokens a turn ("7", EOS)
    return EpisodePool(backend, CODEC, Task(), Sampling(max_new_tokens=4), EpisodeLimits(max_turns=8, turn_budget=opts))


WARMUP = plan(*(prompt(f"w{n}", n) for n in (1, 2, 3, 4)))  # recorded turns (1, 2, 3, 4): 0.75 -> cap 3


def turns_and_ends(pairs):
    return [(len(r.episode.turns), r.episode.end) for _, r in pairs]


def test_the_cap_is_the_quantile_of_the_observed_turns_and_the_ledger_counts_the_savings():
    p = pool()
    try:
        first = p.rollouts(WARMUP, 0)  # warm-up: task.max_turns, nothing capped
        assert turns_and_ends(first) == [(1, "done"), (2, "done"), (3, "done"), (4, "done")]
        warm = p.take_cost().metrics
        assert warm["turn_budget/cap"] == 8 and warm["turn_budget/capped"] == 0
        second = p.rollouts(WARMUP, 1)
        assert turns_and_ends(second) == [(1, "done"), (2, "done"), (3, "done"), (3, "turn_cap")]
        capped = second[3][1]
        assert capped.finish == "length" and capped.verdict.score == 0.0  # the missing 4th turn's reward
        assert capped.episode.turns[-1].obs_end == capped.episode.turns[-1].end  # no observation after the cap
        m = p.take_cost().metrics
        # E[T - 3 | T > 3] over (1, 2, 3, 4) = 1 turn; 2 policy tokens a turn (9 turns, 18 tokens decoded)
        assert m["turn_budget/cap"] == 3 and m["turn_budget/capped"] == 1
        assert m["turn_budget/saved_turns_est"] == 1.0 and m["turn_budget/saved_tokens_est"] == 2.0
        assert m["turn_budget/saved_s_est"] >= 0.0 and m["turn_budget/extensions"] == 0
        assert m["episodes/end_turn_cap"] == 1
        # evaluation (charge=False) is never capped, and is not recorded
        ev = p.rollouts(WARMUP, 2, charge=False)
        assert turns_and_ends(ev)[3] == (4, "done") and len(p.budget.seen) == 8  # 4 + 4, one censored
        assert (3, True) in p.budget.seen
    finally:
        p.close()


def test_an_episode_that_still_moves_is_extended_and_one_that_is_stuck_is_not():
    """Cap 3, one extension of 1 turn: a moving episode that ends at turn 4 is extended and ends
    "done"; a moving one that needs 6 turns is extended once and capped at 4; one whose state never
    changes is capped at 3."""
    p = pool(max_extensions=1, extension=1)
    try:
        p.rollouts(WARMUP, 0)
        p.take_cost()
        out = p.rollouts(plan(prompt("a", 4), prompt("b", 6), prompt("c", 6, moves=False)), 1)
        assert turns_and_ends(out) == [(4, "done"), (4, "turn_cap"), (3, "turn_cap")]
        m = p.take_cost().metrics
        assert m["turn_budget/extensions"] == 2 and m["turn_budget/capped"] == 2
        # (4, 3) recorded turns (1, 2, 3, 4): E[T - 4 | T > 4] = 0 (none longer), E[T - 3 | T > 3] = 1
        assert m["turn_budget/saved_turns_est"] == 1.0
        assert sorted(p.budget.seen) == [
            (1, False),
            (2, False),
            (3, False),
            (3, True),
            (4, False),
            (4, False),
            (4, True),
        ]
    finally:
        p.close()


def test_cap_nearest_rank_warmup_window_and_bounds():
    b = TurnBudget(TurnBudgetConfig(enabled=True, warmup_episodes=6, window=8), max_turns=6)
    b.record([(1, "done"), (2, "done"), (2, "done"), (3, "max_turns"), (5, "done")])
    assert b.cap() == 6  # 5 of 6 warm-up episodes: task.max_turns
    b.record([(6, "max_turns")])
    # uncensored: 1 - S = 1/6, 1/2, 2/3 at 1, 2, 3, then 5/6 >= 0.75 at 5: the nearest rank, ceil(4.5) = 5th
    assert b.cap() == 5
    # E[T - 3 | T > 3] = (S(3) + S(4) + S(5)) / S(3) = (1/3 + 1/3 + 1/6) / (1/3): the episodes 5 and 6, 2 and 3 more
    assert b.expected_more(3) == pytest.approx(2.5)
    assert b.expected_more(6) == 0.0
    b.seen.clear()
    b.record([(7, "done")] * 6)  # never above task.max_turns
    assert b.cap() == 6 and b.survival()[5] == 1.0


def test_capped_episodes_are_censored_so_the_cap_does_not_ratchet_down():
    """Ended (1, 2, 2, 3, 5, 6) and two episodes capped at 3 (Kaplan-Meier, hand-worked):
    S(1) = 7/8, S(2) = 7/8 * 5/7 = 5/8, S(3) = 5/8 * 4/5 = 1/2, S(5) = 1/2 * 1/2 = 1/4 -> the 0.75
    quantile stays 5. Counting the capped pair as ended at 3 would give the 6th of 8 sorted turns, 3;
    dropping them (reading only what ended under the cap) keeps 5 here but not once the cap binds
    often (docs/results.md: 6 -> 4 -> 3 in three steps)."""
    b = TurnBudget(TurnBudgetConfig(enabled=True, warmup_episodes=6), max_turns=6)
    b.record([(1, "done"), (2, "done"), (2, "done"), (3, "done"), (5, "done"), (6, "max_turns")])
    b.record([(3, "turn_cap"), (3, "turn_cap")])
    assert b.survival() == pytest.approx([1.0, 7 / 8, 5 / 8, 1 / 2, 1 / 2, 1 / 4, 0.0])
    assert b.cap() == 5
    # a window of capped episodes only: the estimate never reaches 0.75 below them -> task.max_turns
    c = TurnBudget(TurnBudgetConfig(enabled=True, warmup_episodes=2), max_turns=6)
    c.record([(3, "turn_cap")] * 4)
    assert c.cap() == 6


def test_moving_reads_tool_outcomes_and_states():
    ok, err = ToolCall("calc", "1+1", 0.0, "ok"), ToolCall("calc", "1/0", 0.0, "error")
    assert moving([Turn(0, 1, 1, anchor="1-16"), Turn(1, 2, 2, anchor="9-16")])
    assert not moving([Turn(0, 1, 1, anchor="9-16"), Turn(1, 2, 2, anchor="9-16")])
    assert not moving([Turn(0, 1, 1, anchor=None), Turn(1, 2, 2, anchor="x")])
    assert not moving([Turn(0, 1, 1, anchor="x")])
    assert moving([Turn(0, 1, 1, tool_calls=(ok,))])
    assert not moving([Turn(0, 1, 1, anchor="a"), Turn(1, 2, 2, tool_calls=(ok, err), anchor="a")])


def test_the_turn_budget_is_refused_on_a_single_turn_task_and_loads_on_an_environment_task(tmp_path):
    """Like the other episode keys, refused for a single-turn task by the assembler, before the model
    loads or the run directory is written (``rollwise.sections.task.check_single_turn``)."""
    import rollwise

    check_single_turn(TaskConfig())  # the default turn budget (off) is no change
    with pytest.raises(UserError, match=r"task\.turn_budget applies to environment tasks.*task\.name = 'arithmetic'"):
        check_single_turn(TaskConfig(turn_budget=TurnBudgetConfig(enabled=True)))
    cfg = load_config(None, [f"run.dir={tmp_path}", "run.name=t", "task.turn_budget.enabled=true", "train.steps=1"])
    with pytest.raises(UserError, match=r"task\.turn_budget applies to environment tasks"):
        rollwise.train(cfg, log=lambda m: None)
    assert not (tmp_path / "t").exists()
    cfg = load_config(None, ["task.name=guess_number", "task.turn_budget.enabled=true"])
    assert cfg.task.turn_budget.quantile == 0.75
    with pytest.raises(UserError, match="quantile"):
        load_config(None, ["task.name=guess_number", "task.turn_budget.quantile=0"])
