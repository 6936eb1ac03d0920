"""The episode pool (rollwise.generate.episodes; docs/architecture.md §11) with a scripted policy."""

import threading
import time

import pytest

from rollwise.backends.scripted import ScriptedBackend
from rollwise.envs.base import StepResult
from rollwise.generate.episodes import EpisodeLimits, EpisodePool
from rollwise.tokens import Codec, episode_ids
from rollwise.trainer.tiny import char_tokenizer
from rollwise.types import Plan, Prompt, Request, Sampling, ToolCall, Verdict

TOK = char_tokenizer()
CODEC = Codec(TOK, use_chat=False)
EOS = TOK.eos_token_id


class ScriptEnv:
    """Answers each action with ``obs(turn, action)``; ``done_at`` ends the episode; hooks for tests."""

    def __init__(self, prompt, spec):
        self.prompt, self.spec, self.turn = prompt, spec, 0

    def reset(self, seed):
        self.seed = seed

    def step(self, action):
        self.turn += 1
        hook = self.spec.get("hook")
        if hook is not None:
            hook(self.prompt, self.turn, action)
        if self.turn == self.spec.get("done_at"):
            return StepResult("", reward=1.0, done=True, verdict=self.spec.get("verdict"))
        calls = (ToolCall("calc", action, 0.01, "ok"),) if self.spec.get("tools") else ()
        reward = self.spec.get("reward", 0.0)
        return StepResult(self.spec.get("obs", " ok:"), reward=reward, tool_calls=calls, anchor=action)


class ScriptTask:
    name = "script"

    def __init__(self, **spec):
        self.spec = spec

    def train_prompts(self):
        return [Prompt("p0", "script", "go: ", None, metadata={"seed": 3})]

    heldout_prompts = train_prompts

    def verify(self, prompt, completion):
        return Verdict(None, "no")

    def environment(self, prompt):
        return ScriptEnv(prompt, self.spec)


def policy(text="7"):
    """Every turn answers ``text`` (then EOS)."""
    return ScriptedBackend(lambda seq, i: TOK.encode(text), EOS)


SMP = Sampling(max_new_tokens=8)


def run(task, backend=None, n=1, prompts=None, sampling=SMP, **limits):
    pool = EpisodePool(backend or policy(), CODEC, task, sampling, EpisodeLimits(**limits))
    plan = Plan(tuple(Request(p, n) for p in (prompts or task.train_prompts())))
    try:
        return pool, [r for _, r in pool.rollouts(plan, version=5)]
    finally:
        pool.close()


def test_layout_masks_logprobs_and_verdict():
    pool, [r] = run(ScriptTask(done_at=3, verdict=Verdict(1.0, "correct")), max_turns=5)
    ep = r.episode
    assert ep.end == "done" and r.finish == "stop" and r.verdict == Verdict(1.0, "correct")
    assert [(t.start, t.end, t.obs_end) for t in ep.turns] == [(0, 2, 6), (6, 8, 12), (12, 14, 14)]
    assert r.completion_ids == tuple(TOK.encode("7") + [EOS] + TOK.encode(" ok:")) * 2 + tuple(TOK.encode("7") + [EOS])
    for t in ep.turns:  # policy tokens: mask 1, sampler log-probs; observation tokens: mask 0, log-prob 0.0
        assert r.loss_mask[t.start : t.end] == (1,) * (t.end - t.start)
        assert r.logprobs[t.start : t.end] == (-0.5,) * (t.end - t.start)
        assert r.loss_mask[t.end : t.obs_end] == (0,) * (t.obs_end - t.end)
        assert r.logprobs[t.end : t.obs_end] == (0.0,) * (t.obs_end - t.end)
    assert [t.reward for t in ep.turns] == [0.0, 0.0, 1.0] and ep.turns[0].anchor == "7"
    assert (
        r.text == "7 ok:7 ok:7"
        and r.policy_version == 5
        and r.prompt_ids == CODEC.encode_prompt(Prompt("p0", "", "go: ", None))
    )


def test_without_a_final_verdict_the_turn_rewards_sum_and_a_none_reward_is_never_zero():
    _, [r] = run(ScriptTask(done_at=2), max_turns=5)
    assert r.verdict.score == 1.0 and r.verdict.reason == "episode_done"
    _, [r] = run(ScriptTask(reward=None), max_turns=2)
    assert r.episode.end == "max_turns" and r.verdict.score is None and r.finish == "length"


def test_max_turns_ends_the_episode_without_a_last_observation():
    _, [r] = run(ScriptTask(reward=0.5), max_turns=3)
    assert r.episode.end == "max_turns" and len(r.episode.turns) == 3 and r.verdict.score == 1.5
    last = r.episode.turns[-1]
    assert last.obs_end == last.end == len(r.completion_ids)


def test_token_budget_caps_each_turn_and_ends_the_episode():
    # turn 1: 5 ids + EOS, observation 4 ids (10 of 14); turn 2 may decode only the 4 left: cut, "token_budget"
    backend = policy("12345")
    _, [r] = run(ScriptTask(), backend, max_turns=9, max_episode_tokens=14, sampling=Sampling(max_new_tokens=8))
    assert r.episode.end == "token_budget" and r.finish == "length" and len(r.completion_ids) == 14
    t1, t2 = r.episode.turns
    assert (t1.end - t1.start, t1.obs_end - t1.end, t2.end - t2.start, t2.obs_end) == (6, 4, 4, 14)
    assert EOS not in r.completion_ids[t2.start :]
    # no room for a turn after the observation: ends without appending it
    _, [r] = run(ScriptTask(), backend, max_turns=9, max_episode_tokens=9, sampling=Sampling(max_new_tokens=8))
    assert r.episode.end == "token_budget" and len(r.completion_ids) == 6 and r.episode.turns[0].obs_end == 6
    # a turn cut by sampling.max_new_tokens that the environment does not end: "length"
    _, [r] = run(ScriptTask(), backend, max_turns=9, max_episode_tokens=100, sampling=Sampling(max_new_tokens=3))
    assert r.episode.end == "length" and len(r.episode.turns) == 1


def test_observation_truncated_and_counted():
    pool = EpisodePool(
        policy(),
        CODEC,
        ScriptTask(obs=" " + "x" * 50),
        Sampling(),
        EpisodeLimits(max_turns=2, max_observation_tokens=5),
    )
    [(_, r)] = pool.rollouts(Plan((Request(ScriptTask().train_prompts()[0], 1),)), 0)
    t = r.episode.turns[0]
    assert t.obs_end - t.end == 5
    cost = pool.take_cost()
    assert cost.metrics["episodes/obs_truncated"] == 1 and cost.observation_tokens == 5
    pool.close()


def test_an_env_step_that_raises_ends_its_episode_with_error_and_the_rest_go_on():
    def hook(prompt, turn, action):
        if prompt.id == "bad" and turn == 2:
            raise RuntimeError("tool crashed")

    task = ScriptTask(done_at=3, hook=hook)
    prompts = [Prompt("good", "s", "go: ", None), Prompt("bad", "s", "go: ", None)]
    _, (good, bad) = run(task, prompts=prompts, max_turns=5)
    assert good.episode.end == "done" and good.verdict.score == 1.0
    assert bad.episode.end == "error" and bad.finish == "error" and bad.verdict.score is None
    assert "tool crashed" in bad.verdict.details["error"] and len(bad.episode.turns) == 2
    assert bad.episode.turns[-1].reward is None


def test_env_steps_run_concurrently():
    spans, lock = [], threading.Lock()

    def hook(prompt, turn, action):
        t0 = time.perf_counter()
        time.sleep(0.2)
        with lock:
            spans.append((t0, time.perf_counter()))

    _, rs = run(ScriptTask(done_at=1, hook=hook), n=8, tool_workers=8)
    assert len(rs) == 8 and len(spans) == 8
    assert max(s for s, _ in spans) < min(e for _, e in spans)  # all eight steps were running at one moment


def _slow_and_fast(schedule, wait_s):
    """Episode 'slow' waits (up to ``wait_s``) in its first step for episode 'fast' to generate its
    second turn; returns whether it saw that happen while it waited."""
    second_turn = threading.Event()
    seen = {}

    def respond(seq, i):
        if TOK.decode(seq, skip_special_tokens=True).startswith("fast") and TOK.decode(seq).count("ok") == 1:
            second_turn.set()
        return TOK.encode("7")

    def hook(prompt, turn, action):
        if prompt.id == "slow" and turn == 1:
            seen["overlap"] = second_turn.wait(wait_s)

    prompts = [Prompt("slow", "s", "slow: ", None), Prompt("fast", "s", "fast: ", None)]
    pool, rs = run(
        ScriptTask(done_at=3, hook=hook), ScriptedBackend(respond, EOS), prompts=prompts, episode_schedule=schedule
    )
    assert all(r.episode.end == "done" for r in rs)
    return seen["overlap"], pool


def test_overlap_schedule_generates_while_a_slow_env_waits():
    overlapped, pool = _slow_and_fast("overlap", wait_s=10.0)
    assert overlapped
    assert pool.limits.episode_schedule == "overlap"


def test_lockstep_waits_for_every_env_step():
    overlapped, _ = _slow_and_fast("lockstep", wait_s=0.3)
    assert not overlapped


def test_lockstep_is_reproducible():
    import torch

    def sampled(seq, i):  # a "policy" that reads a shared generator: call order decides the text
        return TOK.encode(str(int(torch.randint(0, 100, (1,), generator=gen))))

    outs = []
    for _ in range(2):
        gen = torch.Generator().manual_seed(0)
        _, rs = run(
            ScriptTask(hook=lambda *a: time.sleep(0.001 * (hash(a[0].id) % 3))),
            ScriptedBackend(sampled, EOS),
            n=4,
            max_turns=3,
        )
        outs.append(rs)
    assert [r.completion_ids for r in outs[0]] == [r.completion_ids for r in outs[1]]


def test_tool_calls_and_costs_reach_the_ledger_fields(tmp_path):
    from rollwise.generate.common import StepCost
    from rollwise.ledger import Ledger

    pool = EpisodePool(
        policy(), CODEC, ScriptTask(tools=True, done_at=3), Sampling(), EpisodeLimits(max_turns=4, max_tool_calls=1)
    )
    pool.rollouts(Plan((Request(ScriptTask().train_prompts()[0], 2),)), 0)
    cost = pool.take_cost()
    pool.close()
    assert (cost.episodes, cost.turns, cost.tool_calls, cost.rollouts) == (2, 6, 4, 2)
    assert cost.generated_tokens == 6 * 2 and cost.observation_tokens == 2 * 2 * 4
    assert cost.tool_s == pytest.approx(0.04) and cost.waiting_s >= 0 and cost.metrics["episodes/end_done"] == 2
    assert cost.metrics["episodes/tool_ok"] == 4  # tool calls by outcome
    ledger = Ledger(tmp_path)
    line = ledger.record(0, 1, cost, 12, {})
    assert line["episodes/count"] == 2 and line["episodes/turns"] == 6 and line["episodes/tool_calls"] == 4
    assert line["episodes/observation_tokens"] == 16 and "episodes/waiting_s" in line and "episodes/tool_s" in line
    assert line["cost/generated_tokens"] == 12
    assert not any(k.startswith("episodes/") for k in ledger.record(1, 2, StepCost(generated_tokens=3), 3, {}))


def test_tool_limits_are_passed_to_the_environment():
    seen = []

    class Limited(ScriptEnv):
        def set_tool_limits(self, calls_left, timeout_s):
            seen.append((calls_left, timeout_s))

    task = ScriptTask(tools=True, done_at=3)
    task.environment = lambda p: Limited(p, task.spec)
    run(task, max_turns=4, max_tool_calls=1, tool_timeout_s=2.5)
    assert seen == [(1, 2.5), (0, 2.5), (0, 2.5)]


def test_prefixed_requests_are_refused():
    pool = EpisodePool(policy(), CODEC, ScriptTask(), Sampling())
    p = ScriptTask().train_prompts()[0]
    with pytest.raises(ValueError, match="prefix"):
        pool.rollouts(Plan((Request(p, 1, prefix=(5,), prefix_logprobs=(0.0,)),)), 0)


def test_warm_start_layout_equals_the_pools():
    """A demonstration tokenised for the warm start (tokens.episode_ids) is the rollout the pool
    builds when the policy plays the demonstrated actions."""
    from rollwise.envs.guess import make

    task = make(None, {"high": 16})
    prompt, steps = task.episode_examples(1, 3)[0]
    actions = iter([a for a, _ in steps])
    backend = ScriptedBackend(lambda seq, i: TOK.encode(next(actions)), EOS)
    _, [r] = run(task, backend, prompts=[prompt], max_turns=8, max_observation_tokens=4)
    ids, mask = episode_ids(CODEC, prompt, steps, max_observation_tokens=4)
    assert r.completion_ids == tuple(ids) and r.loss_mask == tuple(mask) and r.verdict.score == 1.0


def test_chat_observation_is_the_template_difference():
    tok = char_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<bos>{{ m['role'] }}:{{ m['content'] }}<eos>;{% endfor %}"
        "{% if add_generation_prompt %}<bos>assistant:{% endif %}"
    )
    codec = Codec(tok, use_chat=True)
    p = Prompt("c", "s", "hi", None, messages=({"role": "user", "content": "hi"},))
    assert codec.chat(p)
    obs, cut = codec.encode_observation("lower", p, role="tool")
    assert not cut
    assert tok.decode(obs) == ";<bos>tool:lower<eos>;<bos>assistant:"
    # prompt + a turn ending in EOS + the observation == the template of the whole conversation (up to the
    # assistant's text, which the policy wrote)
    turn = tok.encode("8", add_special_tokens=False) + [tok.eos_token_id]
    whole = codec._template(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "8"},
            {"role": "tool", "content": "lower"},
        ],
        True,
    )
    assert list(codec.encode_prompt(p)) + turn + obs == whole


@pytest.mark.parametrize(
    "override, key",
    [
        ("sampling.latr.enabled=true", "sampling.latr.enabled"),
        ("sampling.arrol.enabled=true", "sampling.arrol.enabled"),
        ("replay.name=april", "replay.name = 'april'"),
        ("train.async.periodic=true", "train.async.periodic"),
        ("reward.ttrl.enabled=true", "reward.ttrl.enabled"),
    ],
)
def test_episodes_refuse_single_completion_parts_at_config_load(override, key):
    from rollwise.config import load_config
    from rollwise.registry import UserError

    with pytest.raises(UserError) as e:
        load_config(None, ["task.name=guess_number", override])
    assert "runs multi-turn episodes" in str(e.value) and key in str(e.value)


def test_episode_keys_load_for_an_env_task_and_the_default_config_is_unchanged():
    from rollwise.config import load_config

    cfg = load_config(None, ["task.name=guess_number", "task.max_turns=3", "task.episode_schedule=overlap"])
    assert cfg.task.max_turns == 3 and cfg.task.episode_schedule == "overlap"
    assert load_config(None, []).task.max_turns == 8


def test_a_tool_demonstration_is_laid_out_as_the_pool_lays_out_its_rollout_on_a_chat_template():
    """Calculator on a chat template: the warm start's layout of a demonstration (tool outputs in
    'tool' messages, as the pool writes them after a turn that called a tool) is the rollout the
    pool builds when the policy plays the demonstrated actions."""
    from rollwise.envs.calculator import make

    tok = char_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<bos>{{ m['role'] }}:{{ m['content'] }}<eos>;{% endfor %}"
        "{% if add_generation_prompt %}<bos>assistant:{% endif %}"
    )
    codec = Codec(tok, use_chat=True)
    task = make(None, {"format": "json"})  # chat prompts (messages), tool calls in JSON
    prompt, steps = task.episode_examples(1, 3)[0]
    assert prompt.messages and [s[2] for s in steps[:-1]] == ["tool"] * (len(steps) - 1)
    actions = iter([s[0] for s in steps])
    backend = ScriptedBackend(lambda seq, i: tok.encode(next(actions)), tok.eos_token_id)
    pool = EpisodePool(backend, codec, task, Sampling(1.0, 1.0, 200), EpisodeLimits(max_turns=8))
    try:
        [(_, r)] = list(pool.rollouts(Plan((Request(prompt, 1),)), version=0))
    finally:
        pool.close()
    ids, mask = episode_ids(codec, prompt, steps)
    assert "tool:" in tok.decode(ids) and r.verdict.score == 1.0
    assert r.completion_ids == tuple(ids) and r.loss_mask == tuple(mask)
