"""Episode branching (issue #44, ``rollwise.generate.branching``): the fork primitive reproduces an
episode's continuation token for token from the same random state and diverges from another; forkable
environments; the tree pool's shape; AEPO's budget split and ranking (``rollwise.generate.aepo``)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rollwise.backends.hf import HFBackend
from rollwise.backends.scripted import ScriptedBackend
from rollwise.envs import calculator, guess, python_math
from rollwise.envs.base import StepResult
from rollwise.generate.aepo import AepoRule, fresh_count
from rollwise.generate.branching import BranchingPool, Candidate, fork_episode, fork_generator
from rollwise.generate.episodes import EpisodeLimits, _Tally
from rollwise.generate.portool import PortoolRule
from rollwise.tokens import Codec
from rollwise.trainer.tiny import build_tiny, char_tokenizer
from rollwise.types import Plan, Prompt, Request, Sampling, ToolCall, Turn, Verdict

TOK = char_tokenizer()
CODEC = Codec(TOK, use_chat=False)
SMP = Sampling(max_new_tokens=4)


class TurnsEndAtTheCap:
    """The tiny model's sampler, with a turn cut at ``max_new_tokens`` treated as finished: the untrained
    model seldom emits EOS, and a cut turn would end its episode "length" after one turn."""

    def __init__(self, backend):
        self.backend = backend

    def generate(self, seqs, sampling, generator=None, **kw):
        return [dataclasses.replace(c, finish="stop") for c in self.backend.generate(seqs, sampling, generator, **kw)]


@pytest.fixture(scope="module")
def tiny():
    model, tok = build_tiny("tiny-s", seed=1)
    return model.eval(), tok


def test_a_fork_continued_from_the_same_random_state_reproduces_the_original_and_diverges_from_another(tiny):
    """Guess the number with the untrained tiny model: one turn, then two forks. The original and fork
    a continue from copies of one generator state, fork b from another: a decodes exactly the
    original's tokens (and ends in the same environment state), b does not."""
    model, tok = tiny
    backend = TurnsEndAtTheCap(HFBackend(model, [tok.eos_token_id], tok.pad_token_id, max_batch=8, seed=0))
    codec = Codec(tok, use_chat=False)
    task = guess.make(None, {"n_train": 4, "n_heldout": 1})
    pool = BranchingPool(
        backend, codec, task, SMP, EpisodeLimits(max_turns=5, max_episode_tokens=96), PortoolRule(2), 2
    )
    prompt = task.train_prompts()[0]
    e = pool._start(0, prompt, codec.encode_prompt(prompt), 5)
    tally, gen = _Tally(), torch.Generator().manual_seed(7)
    pool.advance([e], SMP, gen, tally)
    assert e.end is None and len(e.turns) == 1
    prefix = list(e.ids)
    a, b = fork_episode(e, 1), fork_episode(e, 2)
    state = fork_generator(gen)
    runs = [(e, fork_generator(state)), (a, fork_generator(state)), (b, torch.Generator().manual_seed(8))]
    for ep, g in runs:
        while ep.end is None:
            pool.advance([ep], SMP, g, tally)
    pool.close()
    assert len(e.ids) > len(prefix) and e.ids[: len(prefix)] == prefix
    assert a.ids == e.ids and a.logprobs == e.logprobs and a.mask == e.mask
    assert [(t.start, t.end, t.obs_end) for t in a.turns] == [(t.start, t.end, t.obs_end) for t in e.turns]
    assert (a.env.lo, a.env.hi, a.end) == (e.env.lo, e.env.hi, e.end)
    assert b.ids[: len(prefix)] == prefix and b.ids != e.ids


def test_forkable_environments_step_independently_and_the_others_refuse():
    g = guess.GuessEnv(secret=9, high=16)
    g.step("4")  # higher: lo = 5
    twin = g.fork()
    twin.step("12")  # lower: the twin's hi = 11, the original's stays 16
    assert (g.lo, g.hi) == (5, 16) and (twin.lo, twin.hi) == (5, 11)

    task = calculator.make(None, {"n_train": 2, "n_heldout": 1})
    env = task.environment(task.train_prompts()[0])
    env.reset(0)
    env.set_tool_limits(2, 5.0)
    assert env.forkable and env.step("<calc>1+2</calc>").observation
    copy = env.fork()
    copy.step("<calc>3+4</calc>")
    assert (env.runner.used, copy.runner.used) == (1, 2) and copy.told.startswith(env.told) and copy.told != env.told

    pm = python_math.make(None, {"n_train": 2, "n_heldout": 1})
    cells = pm.environment(pm.train_prompts()[0])
    assert not cells.forkable
    with pytest.raises(TypeError, match="not forkable"):
        cells.fork()


class ToolScript:
    """A forkable scripted environment: turn 1 calls a tool; turn 2 answers ("1" wins)."""

    forkable = True

    def __init__(self, turn=0, calls=True):
        self.turn, self.calls = turn, calls

    def reset(self, seed):
        return None

    def fork(self):
        return ToolScript(self.turn, self.calls)

    def step(self, action):
        self.turn += 1
        if self.turn >= 2 or not self.calls:
            won = action.startswith("1")
            return StepResult("", float(won), True, verdict=Verdict(float(won)))
        return StepResult(" out:", 0.0, tool_calls=(ToolCall("calc", action, 0.0, "ok"),))


class ScriptTask:
    name = "script"

    def __init__(self, calls=True):
        self.calls = calls

    def train_prompts(self):
        return [Prompt("p0", "script", "go: ", None), Prompt("p1", "script", "do: ", None)]

    heldout_prompts = train_prompts

    def verify(self, prompt, completion):
        return Verdict(None, "no")

    def environment(self, prompt):
        return ToolScript(calls=self.calls)


def tree_run(task, rule, n=4, factor=2, charge=True):
    # each backend row answers its call's row count: branches and originals decode different ids
    backend = ScriptedBackend(lambda seq, i: TOK.encode(str(i % 10)), TOK.eos_token_id)
    pool = BranchingPool(backend, CODEC, task, SMP, EpisodeLimits(max_turns=3), rule, factor)
    plan = Plan(tuple(Request(p, n) for p in task.train_prompts()))
    try:
        return pool, pool.rollouts(plan, version=0, charge=charge)
    finally:
        pool.close()


def test_portool_trees_fork_at_tool_calls_and_keep_the_group_size():
    """n = 4, fork_factor 2: 2 fresh episodes a prompt, each forks once after its tool call; a branch
    shares every id of its original up to the tool's output and differs after it."""
    pool, out = tree_run(ScriptTask(), PortoolRule(2))
    by_prompt = {}
    for p, r in out:
        by_prompt.setdefault(p.id, []).append(r)
    assert sorted(by_prompt) == ["p0", "p1"] and all(len(rs) == 4 for rs in by_prompt.values())
    for rs in by_prompt.values():
        first = {r.completion_ids[: r.episode.turns[0].obs_end] for r in rs}
        assert len(first) == 2  # two fresh starts, each shared by its branch
        assert len({r.completion_ids for r in rs}) == 4  # the branches differ after the fork
    cost = pool.take_cost()
    assert cost.metrics["branching/fresh"] == 4 and cost.metrics["branching/forks"] == 4
    assert cost.metrics["branching/branches"] == 4 and cost.episodes == 8


def test_trees_without_tool_calls_are_topped_up_with_fresh_episodes_and_evaluation_never_forks():
    pool, out = tree_run(ScriptTask(calls=False), PortoolRule(2))
    assert len(out) == 8 and pool.take_cost().metrics["branching/fresh"] == 8
    pool, out = tree_run(ScriptTask(), PortoolRule(2), charge=False)
    assert len(out) == 8 and len({r.completion_ids[:2] for _, r in out}) == 8  # all fresh, none shared


def test_aepo_pre_monitoring_splits_the_budget_by_the_entropy_gap():
    """n = 8, beta = 1: H_root - H_tool = ln 3 gives sigmoid = 3/4, 6 fresh and 2 branches; the
    opposite gap gives 2 fresh; no statistics yet gives half."""
    assert fresh_count(8, math.log(3) + 0.5, 0.5, 1.0) == 6
    assert fresh_count(8, 0.5, math.log(3) + 0.5, 1.0) == 2
    assert fresh_count(8, None, None, 1.0) == 4
    assert fresh_count(8, 2.0, 0.0, 0.0) == 4  # beta 0: half, whatever the entropies


def test_aepo_observes_root_and_tool_entropies_and_penalises_consecutive_branching():
    """Episode: turn 0 (entropies 1, 3) called a tool, turn 1 (entropy 0.5, 0.5) followed it:
    H_root = 2, H_tool = 0.5. Ranking with penalty 0.5: a line that branched twice (entropy 2.0, score
    1.0) goes after a fresh line with entropy 1.2 (score 1.2)."""

    class E:
        turns = [Turn(0, 2, 3, 0.0, (ToolCall("calc", "x", 0.0, "ok"),)), Turn(3, 5, 5, 1.0)]
        entropies = [1.0, 3.0, 0.0, 0.5, 0.5]

    rule = AepoRule(beta=1.0, penalty=0.5)
    rule.observe([E()])
    assert (rule.h_root, rule.h_tool) == (2.0, 0.5)
    assert rule.fresh(8) == 7  # 8 * sigmoid(1.5) = 6.54
    ranked = rule.rank([Candidate(0, 2.0, 2), Candidate(1, 1.2, 0), Candidate(2, 0.4, 0)])
    assert [c.index for c in ranked] == [1, 0, 2]


def test_a_fork_of_an_ended_or_undeclared_episode_is_refused():
    pool, _ = tree_run(ScriptTask(), PortoolRule(2))
    e = pool._start(0, Prompt("p", "script", "go: ", None), (1,), 3)
    e.end = "done"
    with pytest.raises(ValueError, match="has ended"):
        fork_episode(e, 1)
    e.end, e.env = None, object()
    with pytest.raises(TypeError, match="forkable = True"):
        fork_episode(e, 1)
