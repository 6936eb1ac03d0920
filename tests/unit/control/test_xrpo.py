"""XRPO controller (control/xrpo.py, allocation.md §2.1-2.2, §2.6): the Student-t allocator with
numbers worked by hand, the budget, in-context seeding, exact resume, and the real loop."""

import json
import math

import pytest

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.backends.scripted import ScriptedBackend
from rollwise.config import load_config
from rollwise.control import REGISTRY
from rollwise.control.xrpo import (
    Exemplar,
    ExemplarStore,
    Xrpo,
    XrpoOptions,
    exploration_bonus,
    half_width,
    priority,
    retrieve,
    sample_std,
    seeded_prompt,
    similarity,
    t_quantile,
    uncertainty_reduction,
)
from rollwise.registry import UserError
from rollwise.types import Group, Prompt, Rollout, RunState, Verdict

A = 0.05


def _prompts(n):
    return [Prompt(f"p{i}", "t", f"{i}+{i}=", str(2 * i)) for i in range(n)]


def _rollout(pid, score, text=""):
    return Rollout(pid, (1,), (2,), (-1.0,), "stop", 0, text, Verdict(score))


def _cfg(**o):
    over = [f"control.{k}={json.dumps(v)}" for k, v in o.items()]
    return load_config(overrides=over).control


def _ctrl(n_prompts=3, opts=None, **cfg):
    cfg.setdefault("prompts_per_step", n_prompts)
    return Xrpo(_prompts(10), _cfg(**cfg), XrpoOptions(**(opts or {})), seed=0)


def _merge(groups, plan, reward_of):
    """What the worker pool does: append the plan's rollouts to the group of the same prompt id."""
    merged = {g.prompt.id: g for g in groups}
    for req in plan.requests:
        g = merged.get(req.prompt.id) or Group(req.prompt, ())
        new = tuple(_rollout(req.prompt.id, reward_of(req.prompt, len(g.rollouts) + j), "ok") for j in range(req.n))
        merged[req.prompt.id] = Group(g.prompt, g.rollouts + new)
    return list(merged.values())


def _step(ctrl, reward_of, state=None):
    """One step of the loop's generation rounds; returns the groups and the plan sizes."""
    state = state or RunState()
    plan = ctrl.plan(ctrl.select(state), state)
    groups, sizes = [], []
    while plan:
        sizes.append(plan.total)
        groups = _merge(groups, plan, reward_of)
        plan = ctrl.next_round(groups, state)
    ctrl.observe(groups, state)
    return groups, sizes


# ------------------------------------------------------------------ formulas (§2.1, §2.6)


def test_t_quantile_matches_tables():
    # df=1: P(|T|<=t) = 2 atan(t)/pi = 0.95 -> t = tan(0.475 pi) = 12.7062
    assert t_quantile(1, A) == pytest.approx(12.7062, abs=1e-4)
    # df=2: P(|T|<=t) = t / sqrt(2 + t^2) = 0.95 -> t = 0.95 sqrt(2) / sqrt(1 - 0.9025) = 4.3027
    assert t_quantile(2, A) == pytest.approx(4.3027, abs=1e-4)
    assert t_quantile(3, A) == pytest.approx(3.1824, abs=1e-4)  # tables
    assert t_quantile(4, A) == pytest.approx(2.7764, abs=1e-4)
    assert t_quantile(30, A) == pytest.approx(2.0423, abs=1e-4)
    assert t_quantile(2000, A) == pytest.approx(1.9612, abs=1e-3)  # -> z = 1.96


def test_half_width_decreases_in_n_and_reduction_is_zero_without_variance():
    s = 0.5
    hs = [half_width(s, n, A) for n in range(2, 40)]
    assert all(a > b for a, b in zip(hs, hs[1:]))
    # n = 4, s = 0.5: h(4) = 3.1824 * 0.5 / 2 = 0.7956; h(5) = 2.7764 * 0.5 / sqrt(5) = 0.6208
    assert half_width(0.5, 4, A) == pytest.approx(0.7956, abs=1e-4)
    assert uncertainty_reduction(0.5, 4, A) == pytest.approx(0.7956 - 0.6208, abs=1e-4)
    assert uncertainty_reduction(0.0, 4, A) == 0.0
    # increasing in s at equal n: p-hat = 1/2 (s = 0.577) beats p-hat = 1/4 (s = 0.5)
    assert uncertainty_reduction(sample_std([1, 0, 1, 0]), 4, A) > uncertainty_reduction(sample_std([1, 0, 0, 0]), 4, A)


def test_exploration_bonus_prefers_less_sampled_prompts():
    # T = 15 -> log(16) = 2.7726; n = 4: 0.1 * sqrt(2.7726 / 4) = 0.08326
    assert exploration_bonus(15, 4, 0.1) == pytest.approx(0.1 * math.sqrt(math.log(16) / 4))
    assert exploration_bonus(15, 4, 0.1) == pytest.approx(0.08326, abs=1e-5)
    assert exploration_bonus(15, 4, 0.1) > exploration_bonus(15, 8, 0.1)
    # same s: fewer rollouts -> higher priority (Delta and phi both fall with n)
    assert priority(0.5, 4, 15, A, 0.1) > priority(0.5, 6, 15, A, 0.1)
    # s = 0: only the bonus
    assert priority(0.0, 4, 15, A, 0.1) == pytest.approx(exploration_bonus(15, 4, 0.1))
    assert priority(0.5, 1, 15, A, 0.1) == math.inf  # no variance estimate yet


# ------------------------------------------------------------------ allocator


def test_more_uncertain_prompt_gets_more_rollouts():
    """Phase 0: 4 rollouts each for p0 (rewards 1,0,1,0: s = 0.5774), p1 (1,0,0,0: s = 0.5) and
    p2 (1,1,1,1: s = 0); budget 17 -> 5 left, one round, no exploration bonus.

    Delta(n) = s * (t_{n-1}/sqrt(n) - t_n/sqrt(n+1)); the bracket is 1.5912 - 1.2416 = 0.3496 at
    n=4, 1.2416 - 1.0495 = 0.1922 at n=5, 1.0495 - 0.9248 = 0.1247 at n=6. Priorities:
    p0: 0.2018, 0.1110, 0.0720; p1: 0.1748, 0.0961, 0.0623; p2: 0.
    Picks in order: p0 (0.2018), p1 (0.1748), p0 (0.1110), p1 (0.0961), p0 (0.0720) -> 3, 2, 0.
    """
    ctrl = _ctrl(3, {"rounds": 1, "explore": 0.0, "icl": False}, budget_rollouts=17)
    pattern = {"p0": [1, 0, 1, 0], "p1": [1, 0, 0, 0], "p2": [1, 1, 1, 1]}
    prompts = [p for p in _prompts(3)]
    plan = ctrl.plan(prompts, RunState())
    assert [r.n for r in plan.requests] == [4, 4, 4]
    groups = _merge([], plan, lambda p, j: pattern[p.id][j])
    extra = ctrl.next_round(groups, RunState())
    assert {r.prompt.id: r.n for r in extra.requests} == {"p0": 3, "p1": 2}
    assert not ctrl.next_round(_merge(groups, extra, lambda p, j: 1), RunState())  # budget spent


def test_far_more_uncertain_prompt_takes_the_whole_round():
    # p1's rewards 0.5, 0.4, 0.5, 0.4 have s = 0.0577: Delta(4) = 0.0577 * 0.3496 = 0.0202, below
    # p0's Delta at n = 4..8 (0.2018, 0.1110, 0.0720, 0.0513, 0.0389 for n = 8 via bracket 0.0674).
    ctrl = _ctrl(2, {"rounds": 1, "explore": 0.0, "icl": False}, budget_rollouts=13)
    pattern = {"p0": [1, 0, 1, 0], "p1": [0.5, 0.4, 0.5, 0.4]}
    plan = ctrl.plan(_prompts(2), RunState())
    extra = ctrl.next_round(_merge([], plan, lambda p, j: pattern[p.id][j]), RunState())
    assert {r.prompt.id: r.n for r in extra.requests} == {"p0": 5}


def test_zero_variance_prompts_compete_by_bonus_only():
    # all three groups have s = 0 -> Delta = 0; equal bonus at equal n -> round-robin by n
    ctrl = _ctrl(3, {"rounds": 1, "explore": 0.1, "icl": False}, budget_rollouts=18)
    plan = ctrl.plan(_prompts(3), RunState())
    extra = ctrl.next_round(_merge([], plan, lambda p, j: 0), RunState())
    assert sorted(r.n for r in extra.requests) == [2, 2, 2]


@pytest.mark.parametrize("budget,max_per_prompt,rounds", [(24, 32, 2), (40, 32, 3), (10, 32, 2), (50, 8, 2), (7, 4, 1)])
def test_budget_is_spent_exactly_and_never_exceeded(budget, max_per_prompt, rounds):
    """Sum n_q = budget unless every prompt reaches max_per_prompt (then P * max)."""
    ctrl = _ctrl(4, {"rounds": rounds, "max_per_prompt": max_per_prompt, "icl": False}, budget_rollouts=budget)
    groups, sizes = _step(ctrl, lambda p, j: (j + int(p.id[1:])) % 3 == 0)
    total = sum(g.size for g in groups)
    assert total == sum(sizes) == min(budget, 4 * max_per_prompt)
    assert all(g.size <= max_per_prompt for g in groups)
    assert len(sizes) <= 1 + rounds


def test_rounds_split_the_remaining_budget():
    # budget 28, phase 0 = 3 x 4 = 12, left 16 over 2 rounds -> ceil(16/2) = 8, then 8
    ctrl = _ctrl(3, {"rounds": 2, "icl": False}, budget_rollouts=28)
    _, sizes = _step(ctrl, lambda p, j: j % 2)
    assert sizes == [12, 8, 8]


def test_phase_zero_is_capped_by_the_budget():
    ctrl = _ctrl(3, {"icl": False}, budget_rollouts=6)
    plan = ctrl.plan(_prompts(3), RunState())
    assert [r.n for r in plan.requests] == [4, 2]
    assert not ctrl.next_round(_merge([], plan, lambda p, j: j % 2), RunState())


# ------------------------------------------------------------------ in-context seeding (§2.2)


def test_similarity_and_retrieval_order():
    assert similarity("3+4=", "5+4=") == pytest.approx(3 / 5)  # {3,+,4,=} vs {5,+,4,=}
    store = ExemplarStore(per_prompt=2, max_prompts=10)
    store.add("q1", "5+4=", "9")
    store.add("q2", "7*8=", "56")
    target = Prompt("q0", "t", "3+4=", "7")
    pool = [Exemplar(problem="3+4+1=", solution="8")]
    render = lambda e: e.problem + e.solution  # noqa: E731
    # no own solution: pool "3+4+1=" (4 of 5 tokens shared: 0.8) beats "5+4=" (0.6) beats "7*8=" (1/6)
    got = retrieve(target, store, pool, ["own", "solved", "pool"], 3, render, 100)
    assert [e.problem for e in got] == ["3+4+1=", "5+4=", "7*8="]
    store.add("q0", "3+4=", "7")
    got = retrieve(target, store, pool, ["own", "solved", "pool"], 2, render, 100)
    assert [(e.problem, e.solution) for e in got] == [("3+4=", "7"), ("3+4+1=", "8")]  # own first
    assert retrieve(target, store, pool, ["pool"], 3, render, 100) == pool
    short = retrieve(target, store, pool, ["own", "solved", "pool"], 3, render, 5)  # "3+4+1=8", "7*8=56" > 5 chars
    assert [(e.problem, e.solution) for e in short] == [("3+4=", "7"), ("5+4=", "9")]


def test_store_keeps_recent_solutions_and_evicts_oldest_prompt():
    s = ExemplarStore(per_prompt=2, max_prompts=2)
    for sol in ["a", "b", "a", "c"]:
        s.add("x", "X", sol)
    assert s.items["x"]["solutions"] == ["a", "c"]  # duplicates move to the end; 2 kept
    s.add("y", "Y", "1")
    s.add("x", "X", "d")  # x refreshed -> y is now the least recently updated
    s.add("z", "Z", "2")
    assert list(s.items) == ["x", "z"]
    t = ExemplarStore(2, 2)
    t.load_state_dict(s.state_dict())
    assert t.items == s.items


def test_seeded_prompt_text_and_messages():
    p = Prompt("q", "t", "3+4=", "7", metadata={"level": 1})
    sp = seeded_prompt(p, [Exemplar(problem="1+1=", solution="2")], "{problem}{solution} ")
    assert sp.text == "1+1=2 3+4=" and sp.answer == "7" and sp.id.startswith("q#icl-") and sp.id != p.id
    assert sp.metadata == {"level": 1, "icl_of": "q", "icl_exemplars": 1}
    other = seeded_prompt(p, [Exemplar(problem="1+2=", solution="3")], "{problem}{solution} ")
    assert other.id != sp.id  # a different exemplar is a different prompt (the codec caches ids by id)
    chat = Prompt(
        "c", "t", "3+4=", "7", messages=({"role": "system", "content": "S"}, {"role": "user", "content": "3+4="})
    )
    sc = seeded_prompt(chat, [Exemplar(problem="1+1=", solution="2")], "{problem}{solution} ")
    assert [m["role"] for m in sc.messages] == ["system", "user", "assistant", "user"]
    assert sc.messages[1]["content"] == "1+1=" and sc.messages[2]["content"] == "2"


def test_zero_reward_prompt_is_seeded_from_its_own_solved_history():
    ctrl = _ctrl(2, {"rounds": 1, "icl_rollouts": 3, "icl_template": "{problem}{solution} "}, budget_rollouts=14)
    p0, p1 = _prompts(2)
    # step 0: p0 solved once ("0" is its answer text) -> stored; p1 never solved
    ctrl.plan([p0, p1], RunState())
    g0 = Group(p0, (_rollout("p0", 1.0, "0"), _rollout("p0", 0.0, "5")))
    ctrl.observe([g0, Group(p1, (_rollout("p1", 0.0, "9"),))], RunState())
    assert ctrl.store.items["p0"] == {"problem": "0+0=", "solutions": ["0"]}
    # step 1: both fail in phase 0 -> p0 is seeded with its own solution; p1 has only p0's as "solved"
    plan = ctrl.plan([p0, p1], RunState(step=1))
    groups = _merge([], plan, lambda p, j: 0)
    extra = ctrl.next_round(groups, RunState(step=1))
    seeded = [r for r in extra.requests if "icl_of" in r.prompt.metadata]
    got = [(r.prompt.metadata["icl_of"], r.prompt.text, r.n) for r in seeded]
    assert got == [("p0", "0+0=0 0+0=", 3), ("p1", "0+0=0 1+1=", 3)]
    # budget 14 - 8 (phase 0) - 6 (seeding) = 0 left for the allocator; seeded prompts are out of it
    assert extra.total == 6
    groups = _merge(groups, extra, lambda p, j: 1.0 if p.metadata.get("icl_of") == "p1" else 0.0)
    ctrl.observe(groups, RunState(step=1))
    # seeded groups: not in the history, but their correct responses feed the store under p1
    assert set(ctrl.history.records) == {"p0", "p1"}
    assert ctrl.store.items["p1"]["solutions"] == ["ok"]
    assert ctrl.metrics["control/xrpo_icl_seeded"] == 2 and ctrl.metrics["control/xrpo_icl_solved"] == 1


def test_no_exemplar_no_seeding_and_option_off():
    ctrl = _ctrl(2, {"rounds": 1}, budget_rollouts=12)
    plan = ctrl.plan(_prompts(2), RunState())
    extra = ctrl.next_round(_merge([], plan, lambda p, j: 0), RunState())
    assert all("icl_of" not in r.prompt.metadata for r in extra.requests) and extra.total == 4
    pool = [{"problem": "1+1=", "solution": "2"}]
    off = _ctrl(2, {"rounds": 1, "icl": False, "icl_pool": pool}, budget_rollouts=12)
    plan = off.plan(_prompts(2), RunState())
    assert all(
        "icl_of" not in r.prompt.metadata for r in off.next_round(_merge([], plan, lambda p, j: 0), RunState()).requests
    )


def test_pool_from_file_and_bad_options(tmp_path):
    path = tmp_path / "pool.jsonl"
    path.write_text(json.dumps({"problem": "1+1=", "solution": "2"}) + "\n")
    ctrl = _ctrl(1, {"icl_pool_path": str(path)})
    assert ctrl.pool == [Exemplar(problem="1+1=", solution="2")]
    with pytest.raises(UserError):
        _ctrl(1, {"icl_pool_path": str(tmp_path / "missing.jsonl")})
    with pytest.raises(UserError, match="icl_template"):
        load_config(overrides=['control.name="xrpo"', 'control.options={icl_template = "{question}"}'])
    with pytest.raises(UserError, match="n_init"):
        load_config(overrides=['control.name="xrpo"', "control.options={n_init = 1}"])
    assert REGISTRY.get("xrpo") is Xrpo


# ------------------------------------------------------------------ state


def test_state_round_trip_gives_the_same_future():
    def reward_of(p, j):
        return (j * 7 + int(p.id[1:].split("#")[0])) % 3 == 0

    opts = {"icl_template": "{problem}{solution} ", "icl_pool": [{"problem": "1+1=", "solution": "2"}]}
    a = _ctrl(3, opts, budget_rollouts=20)
    for step in range(3):
        _step(a, reward_of, RunState(step=step))
    b = _ctrl(3, opts, budget_rollouts=20)
    b.load_state_dict(a.state_dict())
    assert b.store.items == a.store.items and b.history.records == a.history.records
    for step in range(3, 6):
        ga, sa = _step(a, reward_of, RunState(step=step))
        gb, sb = _step(b, reward_of, RunState(step=step))
        assert sa == sb
        assert [(g.prompt.id, g.prompt.text, g.size) for g in ga] == [(g.prompt.id, g.prompt.text, g.size) for g in gb]


# ------------------------------------------------------------------ the real loop


def _scripted(correct):
    from rollwise.trainer.tiny import char_tokenizer

    tok = char_tokenizer()

    def respond(seq, i):
        text = tok.decode(seq, skip_special_tokens=True).split(" ")[-1]  # the problem after any exemplars
        a, b = text.rstrip("=").replace("-", "+-").split("+")[:2]
        ans = int(a) + int(b)
        return tok.encode(str(ans if correct(text, seq, i) else ans + 1))

    return ScriptedBackend(respond, eos_id=tok.eos_token_id), tok


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_loop_runs_with_xrpo_rounds(tmp_path):
    o = tiny_overrides(
        tmp_path,
        steps=2,
        **{
            "eval.at_start": False,
            "control.name": "xrpo",
            "control.rollouts_per_prompt": 6,
            "control.options": {"icl": False},
        },
    )
    cfg = load_config(overrides=as_sets(o))
    backend, _ = _scripted(lambda text, seq, i: i % 3 == 0)
    result = rollwise.train(cfg, backend=backend, log=lambda m: None)
    m = _lines(result.run_dir / "metrics.jsonl")
    # budget 4 x 6 = 24 per step: phase 0 (16) then 2 rounds of 4
    assert [x["control/budget_used"] for x in m] == [24, 24] and [x["control/rounds"] for x in m] == [3, 3]
    assert m[-1]["cost/rollouts"] == 48


def test_loop_seeds_zero_reward_prompts_from_the_pool(tmp_path):
    """Answers are right only when the prompt carries an exemplar (a space in the text): phase 0
    fails everywhere, every prompt is seeded from the pool, and the seeded groups succeed."""
    o = tiny_overrides(
        tmp_path, steps=1, **{"eval.at_start": False, "control.name": "xrpo", "control.budget_rollouts": 40}
    )
    data = {
        "control": {
            "options": {"icl_template": "{problem}{solution} ", "icl_pool": [{"problem": "1+1=", "solution": "2"}]}
        }
    }
    cfg = load_config(overrides=as_sets(o), data=data)
    backend, tok = _scripted(lambda text, seq, i: " " in tok.decode(seq, skip_special_tokens=True))
    result = rollwise.train(cfg, backend=backend, log=lambda m: None)
    m = _lines(result.run_dir / "metrics.jsonl")[0]
    # 16 phase-0 rollouts (all wrong) + 4 seeded prompts x 4; the other 8 cannot go anywhere
    # (every prompt is seeded, so none is left for the allocator)
    assert m["cost/rollouts"] == 32 and m["groups/count"] == 8
    assert m["reward/mean"] == pytest.approx(0.5) and m["groups/degenerate_frac"] == 1.0
