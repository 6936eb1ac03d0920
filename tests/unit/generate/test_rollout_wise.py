"""DART's environment slots and rollout-wise schedule (rollwise.generate.rollout_wise) with a scripted policy,
and its high-entropy turn filter (rollwise.generate.entropy_turns) on hand-worked entropies."""

import threading

import pytest

from rollwise.backends.scripted import ScriptedBackend
from rollwise.envs.base import StepResult
from rollwise.generate.entropy_turns import keep_high_entropy_turns, turn_entropies
from rollwise.generate.episodes import EpisodeLimits
from rollwise.generate.rollout_wise import SlotPool
from rollwise.tokens import Codec
from rollwise.trainer.tiny import char_tokenizer
from rollwise.types import Episode, Plan, Prompt, Request, Rollout, Sampling, Turn, Verdict

TOK = char_tokenizer()
CODEC = Codec(TOK, use_chat=False)
EOS = TOK.eos_token_id
PROMPT = Prompt("p0", "script", "go: ", None)


class LoggedEnv:
    """Environment number ``k`` (in the order the pool makes them) ends after ``turns[k]`` steps and logs
    ("reset", k) / ("done", k); ``hook(k, turn)`` runs in each step."""

    def __init__(self, k, turns, log, hook):
        self.k, self.turns, self.log, self.hook, self.turn = k, turns, log, hook, 0

    def reset(self, seed):
        self.log.append(("reset", self.k))

    def step(self, action):
        self.turn += 1
        self.hook(self.k, self.turn)
        if self.turn >= self.turns[self.k]:
            self.log.append(("done", self.k))
            return StepResult("", reward=1.0, done=True)
        return StepResult(" ok:", reward=0.0)


class LoggedTask:
    name = "script"

    def __init__(self, turns, hook=lambda k, turn: None):
        self.turns, self.hook, self.log, self.made = turns, hook, [], 0
        self.lock = threading.Lock()

    def verify(self, prompt, completion):
        return Verdict(None, "no")

    def environment(self, prompt):
        with self.lock:
            k, self.made = self.made, self.made + 1
        return LoggedEnv(k, self.turns, self.log, self.hook)


def run(task, n, max_batch=None, **limits):
    pool = SlotPool(
        ScriptedBackend(lambda seq, i: TOK.encode("7"), EOS),
        CODEC,
        task,
        Sampling(max_new_tokens=4),
        EpisodeLimits(max_turns=8, **limits),
        max_batch=max_batch,
    )
    try:
        out = [r for _, r in pool.rollouts(Plan((Request(PROMPT, n),)), version=0)]
        return out, pool.take_cost()
    finally:
        pool.close()


def _slowest_holds(schedule, wait_s):
    """Three episodes, two slots. Episode 0 (the slowest: 3 turns) waits in its first step, up to
    ``wait_s``, for episode 2's environment to be reset; episodes 1 and 2 end after one turn."""
    third = threading.Event()
    seen = {}

    def hook(k, turn):
        if k == 0 and turn == 1:
            seen["third_started"] = third.wait(wait_s)

    task = LoggedTask([3, 1, 1], hook)
    real_env = task.environment

    def environment(prompt):
        env = real_env(prompt)
        if env.k == 2:
            third.set()
        return env

    task.environment = environment
    rs, _ = run(task, 3, env_slots=2, tool_workers=2, episode_schedule=schedule)
    assert [r.episode.end for r in rs] == ["done"] * 3 and [len(r.episode.turns) for r in rs] == [3, 1, 1]
    return seen["third_started"], task.log


def test_rollout_wise_a_freed_slot_starts_the_next_episode_before_the_slowest_finishes():
    started, log = _slowest_holds("rollout_wise", wait_s=10.0)
    assert started  # episode 2 took episode 1's slot while episode 0 was still in its first step
    assert log.index(("reset", 2)) < log.index(("done", 0))
    assert log.index(("done", 1)) < log.index(("reset", 2))  # ... and only once a slot was free
    live = 0
    for what, _ in log:  # never more than env_slots environments at once
        live += 1 if what == "reset" else -1
        assert live <= 2


def test_lockstep_slots_run_in_waves_that_wait_for_their_slowest_episode():
    started, log = _slowest_holds("lockstep", wait_s=0.3)
    assert not started
    assert log.index(("done", 0)) < log.index(("reset", 2))  # the wave's barrier: the slot stayed idle


def test_rows_per_call_and_utilisation_fields():
    """Four 2-turn episodes in 2 slots, lockstep: two waves of two turns, each turn one call of 2 rows
    (4 calls, 2.0 rows per call); with model.max_batch = 1 every row is a call of its own (8, 1.0)."""
    _, cost = run(LoggedTask([2, 2, 2, 2]), 4, env_slots=2, tool_workers=2)
    m = cost.metrics
    assert m["episodes/backend_calls"] == 4 and m["episodes/rows_per_call"] == 2.0
    assert m["episodes/slot_s"] == pytest.approx(2 * m["episodes/wall_s"])
    assert 0.0 < m["episodes/env_utilisation"] <= 1.0 and 0.0 < m["episodes/sampler_utilisation"] <= 1.0
    _, cost = run(LoggedTask([2, 2, 2, 2]), 4, max_batch=1, env_slots=2, tool_workers=2)
    assert cost.metrics["episodes/backend_calls"] == 8 and cost.metrics["episodes/rows_per_call"] == 1.0


def test_an_environment_that_cannot_start_frees_its_slot():
    class Broken(LoggedTask):
        def environment(self, prompt):
            env = super().environment(prompt)
            if env.k == 0:
                raise RuntimeError("no VM")
            return env

    rs, _ = run(Broken([1, 1, 1]), 3, env_slots=1, tool_workers=1, episode_schedule="rollout_wise")
    assert [r.episode.end for r in rs] == ["error", "done", "done"]


# ---------------------------------------------------------------- the high-entropy turn filter


def _episode(turn_entropies_, tokens=2, obs=1):
    """A rollout whose turns each have ``tokens`` policy tokens of the given entropy, then ``obs``
    observation tokens (entropy 0, loss mask 0)."""
    ids, ent, mask, turns = [], [], [], []
    for h in turn_entropies_:
        s = len(ids)
        ids += [5] * tokens + [6] * obs
        ent += [h] * tokens + [0.0] * obs
        mask += [1] * tokens + [0] * obs
        turns.append(Turn(s, s + tokens, s + tokens + obs))
    return Rollout(
        "p0",
        (1,),
        tuple(ids),
        (-0.5,) * len(ids),
        "stop",
        0,
        "",
        Verdict(1.0),
        loss_mask=tuple(mask),
        entropies=tuple(ent),
        episode=Episode(tuple(turns), "done"),
    )


def test_turn_entropy_is_the_mean_over_the_turns_policy_tokens():
    r = _episode([0.5])
    r = Rollout(**{**r.__dict__, "entropies": (0.2, 0.6, 0.0)})  # policy tokens 0.2, 0.6; observation 0.0
    assert turn_entropies(r) == [pytest.approx(0.4)]


def test_keeps_the_top_turns_by_mean_entropy_across_the_call():
    """Turn entropies (0.1, 0.9 | 0.5 | 0.3, 0.7): keep 0.4 of 5 turns -> ceil(2.0) = 2, the turns of
    0.9 and 0.7; keep 0.5 -> ceil(2.5) = 3, and 0.5 too. Dropped turns' policy tokens leave the loss."""
    out = [(PROMPT, _episode(h)) for h in ([0.1, 0.9], [0.5], [0.3, 0.7])]
    from rollwise.generate.common import StepCost

    cost = StepCost()
    got = keep_high_entropy_turns(out, 0.4, cost)
    kept = [[r.loss_mask[t.start] for t in r.episode.turns] for _, r in got]
    assert kept == [[0, 1], [0], [0, 1]]
    assert cost.metrics == {"entropy_turns/kept": 2, "entropy_turns/dropped": 3, "entropy_turns/dropped_tokens": 6}
    kept = [[r.loss_mask[t.start] for t in r.episode.turns] for _, r in keep_high_entropy_turns(out, 0.5)]
    assert kept == [[0, 1], [1], [0, 1]]
    r0 = got[0][1]
    assert r0.loss_mask == (0, 0, 0, 1, 1, 0) and r0.completion_ids == out[0][1].completion_ids
    assert r0.verdict == out[0][1].verdict  # the reward (and so the advantage) is the episode's, unchanged


def test_keep_one_changes_nothing_and_rollouts_without_entropies_are_left_alone():
    out = [(PROMPT, _episode([0.1, 0.9]))]
    assert keep_high_entropy_turns(out, 1.0) == out
    bare = Rollout(**{**_episode([0.1, 0.9]).__dict__, "entropies": None})
    assert keep_high_entropy_turns([(PROMPT, bare)], 0.5) == [(PROMPT, bare)]


# ---------------------------------------------------------------- config: loads and refusals


def refused(*sets, path=None) -> str:
    from rollwise.config import load_config
    from rollwise.registry import UserError

    with pytest.raises(UserError) as e:
        load_config(path, list(sets))
    return str(e.value)


CALC = "task.name=calculator"


def test_the_keys_load_on_an_environment_task_and_the_pool_is_the_slot_pool():
    from rollwise.config import load_config

    cfg = load_config(None, [CALC, "task.episode_schedule=rollout_wise", "task.env_slots=4"])
    assert cfg.task.env_slots == 4 and cfg.task.high_entropy_turns == 1.0  # default: every turn trained
    from rollwise.components import engine_pool
    from rollwise.tasks import REGISTRY

    task = REGISTRY.get("calculator")(None, {"n_train": 4, "n_heldout": 2})
    pool = engine_pool(cfg, ScriptedBackend(lambda s, i: [], EOS), CODEC, task, Sampling())
    assert type(pool) is SlotPool and pool.limits.env_slots == 4


def test_rollout_wise_needs_slots_and_slots_need_threads():
    assert "task.env_slots = 0" in refused(CALC, "task.episode_schedule=rollout_wise")
    msg = refused(CALC, "task.episode_schedule=rollout_wise", "task.env_slots=16", "task.tool_workers=8")
    assert "task.env_slots = 16" in msg and "task.tool_workers" in msg


@pytest.mark.parametrize(
    "key, value", [("env_slots", "4"), ("high_entropy_turns", "0.5"), ("episode_schedule", "rollout_wise")]
)
def test_a_single_turn_task_refuses_the_keys(key, value):
    """The task section's own check, run for a task whose factory declares no episodes."""
    from rollwise.config import load_config
    from rollwise.registry import UserError
    from rollwise.sections.task import check_single_turn

    with pytest.raises(UserError, match=rf"task\.{key} applies to environment tasks"):
        check_single_turn(load_config(None, [f"task.{key}={value}"]).task)


def test_branching_refuses_slots_and_rollout_wise():
    msg = refused(CALC, "sampling.branching.mode=portool", "task.env_slots=4")
    assert "task.env_slots = 4" in msg and "sampling.branching.mode = 'portool'" in msg
    msg = refused(CALC, "sampling.branching.mode=portool", "task.env_slots=4", "task.episode_schedule=rollout_wise")
    assert "task.episode_schedule = 'rollout_wise'" in msg


def test_high_entropy_turns_are_refused_where_no_entropy_is_recorded():
    msg = refused(CALC, "task.high_entropy_turns=0.5", "model.backend=vllm")
    assert "task.high_entropy_turns = 0.5" in msg and "model.backend = 'vllm'" in msg
    msg = refused(CALC, "task.high_entropy_turns=0.5", "distributed.workers=2")
    assert "distributed.workers = 2" in msg
