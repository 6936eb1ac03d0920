"""DOTS (control/dots.py, allocation.md §7.1-7.2, 7.7): the hashed n-gram embedding, the
closed-form attention predictor and its calibration (worked by hand), near-greedy selection,
the round schedule (reference step, selection sizes mu*B then mu*B*sigma), the reference filter,
the step budget, checkpoint state, and a short loop run with rollout replay that resumes exactly."""

import json
import math

import numpy as np
import pytest

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.components import build_filters
from rollwise.config import load_config
from rollwise.control.dots import (
    DOTS,
    DOTSOptions,
    is_reference,
    linear_calibration,
    ngram_embedding,
    predict,
    reference_filter,
    select_round,
)
from rollwise.types import Group, Prompt, Rollout, RunState, Verdict


def _prompts(n):
    return [Prompt(f"p{i}", "t", f"question number {i}", "0") for i in range(n)]


def _group(prompt, k, n):
    scores = [1.0] * k + [0.0] * (n - k)
    return Group(prompt, tuple(Rollout(prompt.id, (1,), (2,), (-1.0,), "stop", 0, "", Verdict(s)) for s in scores))


def _ctrl(*overrides, options=None, prompts=None):
    cfg = load_config(overrides=["control.prompts_per_step=4", "control.rollouts_per_prompt=2", *overrides]).control
    return DOTS(prompts or _prompts(30), cfg, DOTSOptions(**(options or {})), seed=0)


# ------------------------------------------------------------------ embedding and predictor


def test_ngram_embedding_is_deterministic_unit_and_similarity_aware():
    a, a2 = ngram_embedding("compute 12+34"), ngram_embedding("compute 12+34")
    b, c = ngram_embedding("compute 12+35"), ngram_embedding("why is the sky blue?")
    assert np.array_equal(a, a2) and a.shape == (256,)
    assert np.linalg.norm(a) == pytest.approx(1.0)
    assert a @ b > a @ c and a @ b < 1.0
    assert not ngram_embedding("").any()
    # fixed across processes (a pinned value guards against Python's salted hash()): "ab" has the
    # n-grams a, b, ab -> three signed unit counts in distinct buckets, norm sqrt(3)
    s = 1 / math.sqrt(3)
    assert ngram_embedding("ab", dim=8, ngram_max=2) == pytest.approx([0, 0, 0, -s, -s, 0, s, 0])


def test_attention_prediction_by_hand():
    # references e1 (label 0) and e2 (label 1); query e1: scores cos = [1, 0] at temperature 1
    # w = softmax([1, 0]) = [e/(e+1), 1/(e+1)] = [0.7311, 0.2689] -> p_base = 0.2689
    emb = np.eye(3)
    p = predict(emb, [0, 1], [0.0, 1.0], temperature=1.0, calibrate=False)
    assert p[0] == pytest.approx(1 / (math.e + 1))
    assert p[1] == pytest.approx(math.e / (math.e + 1))
    assert p[2] == pytest.approx(0.5)  # e3 is orthogonal to both: equal weights
    # calibration fits v ~ a p + c through (0.2689, 0) and (0.7311, 1): a = 1/0.4621 = 2.164
    # and maps the references onto their labels exactly; the query e3 (0.5) onto 0.5
    q = predict(emb, [0, 1], [0.0, 1.0], temperature=1.0)
    assert q == pytest.approx([0.0, 1.0, 0.5])


def test_calibration_makes_the_reference_mean_equal_the_label_mean():
    rng = np.random.default_rng(1)
    emb = rng.normal(size=(50, 16))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    ref = [3, 7, 11, 19, 23, 42]
    labels = [0.0, 0.25, 0.5, 1.0, 0.125, 0.75]
    p = predict(emb, ref, labels, temperature=0.3)
    assert p[ref].mean() == pytest.approx(np.mean(labels))
    # constant predictions: the fit is the label mean
    f = linear_calibration(np.array([0.3, 0.3]), np.array([0.0, 1.0]))
    assert f(np.array([0.9]))[0] == pytest.approx(0.5)


def test_small_tau_selects_the_prompts_closest_to_alpha():
    p_hat = np.array([0.1, 0.45, 0.9, 0.52, 0.0, 0.7])
    for seed in range(5):  # |p - 0.5| = 0.4, 0.05, 0.4, 0.02, 0.5, 0.2 -> the two smallest: 3 and 1
        sel = select_round(p_hat, 2, alpha=0.5, tau=1e-3, rng=np.random.default_rng(seed))
        assert sorted(sel.tolist()) == [1, 3]
    sel = select_round(p_hat, 6, 0.5, 1e-3, np.random.default_rng(0))
    assert sorted(sel.tolist()) == list(range(6))  # without replacement


def test_selection_concentrates_near_the_target_difficulty():
    """Three families of look-alike prompts with true success 0.95 / 0.5 / 0.02: from a noisy
    12-prompt reference set, the predictor and the near-greedy draw pick the middle family."""
    fams = [
        ("What is the colour of the sky on a clear day? #", 0.95),
        ("Compute the integral of x^2 sin(x) from 0 to pi, case ", 0.5),
        ("Prove that there are infinitely many twin primes, variant ", 0.02),
    ]
    texts = [f"{t}{i}" for t, _ in fams for i in range(40)]
    truth = np.repeat([p for _, p in fams], 40)
    emb = np.stack([ngram_embedding(t) for t in texts])
    rng = np.random.default_rng(0)
    ref = rng.choice(len(texts), 12, replace=False)
    labels = np.clip(truth[ref] + rng.normal(0, 0.1, size=12), 0, 1)
    sel = select_round(predict(emb, ref, labels, 0.1), 20, 0.5, 1e-3, rng)
    assert np.abs(truth[sel] - 0.5).mean() < 0.05 < np.abs(truth - 0.5).mean()


# ------------------------------------------------------------------ the round schedule


def _reference_step(c, step, k=1):
    """select (reference prompts) -> plan -> next_round with every reference scoring k of n."""
    refs = c.select(RunState(step=step))
    plan = c.plan(refs, RunState(step=step))
    groups = [_group(r.prompt, k, r.n) for r in plan.requests]
    train = c.next_round(groups, RunState(step=step))
    return refs, plan, groups, train


def test_round_schedule_and_selection_sizes():
    # B = 4, G = 2, mu = 2, replay_fraction 0.5, ref_size default B // 2 = 2, ref_rollouts = G
    c = _ctrl(options={"steps_per_round": 2})
    refs, plan, groups, train = _reference_step(c, 0)
    assert len(refs) == 2 and all(is_reference(p) for p in refs) and plan.total == 2 * 2
    # round 0: mu * B = 8 prompts selected; batch 0 (4 prompts, none a reference) planned now
    assert [r.n for r in train.requests] == [2] * 4 and len(c.queue) == 1 and len(c.queue[0]) == 4
    assert not {r.prompt.id for r in train.requests} & {p.id for p in refs}
    assert not any(is_reference(r.prompt) for r in train.requests)
    assert not c.next_round(groups + [_group(r.prompt, 1, 2) for r in train.requests], RunState(step=0))
    step1 = c.select(RunState(step=1))
    assert len(step1) == 4 and c.plan(step1, RunState(step=1)).total == 8 and not c.next_round([], RunState(step=1))
    assert not c.queue
    # round 1: mu * B * (1 - replay_fraction) = 2 * 4 * 0.5 = 4 prompts, 2 per step
    refs, plan, groups, train = _reference_step(c, 2)
    assert len(refs) == 2 and train.total == 2 * 2 and [len(q) for q in c.queue] == [2]
    assert c.rounds == 2


def test_reference_options_and_steps_per_round():
    c = _ctrl(options={"steps_per_round": 3, "ref_size": 5, "ref_rollouts": 3, "replay_fraction": 0.25})
    refs, plan, _, train = _reference_step(c, 0)
    assert len(refs) == 5 and [r.n for r in plan.requests] == [3] * 5
    assert len(train.requests) == 4 and [len(q) for q in c.queue] == [4, 4]  # round 0: 3 batches of B
    for step in (1, 2):
        c.select(RunState(step=step))
    _, _, _, train = _reference_step(c, 3)
    assert len(train.requests) == 3 and [len(q) for q in c.queue] == [3, 3]  # round(4 * 0.75) = 3 per step


def test_reference_prompts_never_join_the_same_steps_batch():
    # 5 prompts, 2 references, mu = 1: a selection of 4 (round 0) or 2 (later) may hold references;
    # they give way to the next non-reference prompts of the draw (only 3 exist)
    c = _ctrl(options={"steps_per_round": 1, "ref_size": 2}, prompts=_prompts(5))
    for step in range(8):
        refs, _, _, train = _reference_step(c, step)
        ids = [r.prompt.id for r in train.requests]
        assert len(ids) == len(set(ids)) == min(c.per_step(), 3) and not set(ids) & {p.id for p in refs}


def test_reference_filter_drops_reference_groups():
    c = _ctrl()
    refs, _, groups, train = _reference_step(c, 0)
    assert all(reference_filter(g).reason == "reference" for g in groups)
    assert all(reference_filter(_group(r.prompt, 1, 2)).keep for r in train.requests)
    cfg = load_config(overrides=['filter.names=["dots_reference"]'])
    ((_, f),) = build_filters(cfg)
    assert not f(groups[0]).keep


def test_budget_covers_reference_and_training_rollouts():
    # refs 2 x 2 = 4 rollouts; budget 10 leaves 6 -> 3 whole groups of 2 in batch 0
    c = _ctrl("control.budget_rollouts=10")
    _, plan, _, train = _reference_step(c, 0)
    assert plan.total + train.total <= 10 and [r.n for r in train.requests] == [2, 2, 2]
    d = _ctrl()
    assert d.budget == 2 * 2 + 4 * 2  # default: never binds
    for step in range(6):
        if not d.queue:
            _, plan, _, train = _reference_step(d, step)
            assert plan.total + train.total <= d.budget
        else:
            assert d.plan(d.select(RunState(step=step)), RunState(step=step)).total <= d.budget


def test_unmeasurable_reference_falls_back_to_a_uniform_draw():
    c = _ctrl()
    refs = c.select(RunState(step=0))
    c.plan(refs, RunState(step=0))
    unverified = [Group(p, (Rollout(p.id, (1,), (2,), (-1.0,), "error", 0, "", Verdict(None)),)) for p in refs]
    assert len(c.next_round(unverified, RunState(step=0)).requests) == 4


def test_state_round_trips_rng_queue_and_history():
    c = _ctrl()
    _, _, groups, train = _reference_step(c, 0, k=1)
    c.observe(groups + [_group(r.prompt, 2, 2) for r in train.requests], RunState(step=0))
    d = DOTS(_prompts(30), c.cfg, c.opts, seed=7)
    d.load_state_dict(c.state_dict())
    assert d.queue == c.queue and d.rounds == c.rounds and d.history.records == c.history.records
    for step in (1, 2, 3):
        a, b = c.select(RunState(step=step)), d.select(RunState(step=step))
        assert [p.id for p in a] == [p.id for p in b]
        if all(is_reference(p) for p in a):
            ga = [_group(p, 1, 2) for p in a]
            ta = c.next_round(ga, RunState(step=step))
            tb = d.next_round([_group(p, 1, 2) for p in b], RunState(step=step))
            assert [r.prompt.id for r in ta.requests] == [r.prompt.id for r in tb.requests]


# ------------------------------------------------------------------ the loop


def _stable(path):
    return [
        {k: v for k, v in json.loads(x).items() if k != "wall_s" and not k.startswith("time/")}
        for x in path.read_text().splitlines()
    ]


def _run(tmp_path, name, steps, resume=False):
    o = tiny_overrides(
        tmp_path,
        name=name,
        steps=steps,
        **{
            "eval.at_start": False,
            "run.threads": 1,
            "control.name": "dots",
            "filter.names": ["dots_reference"],
            "control.options": {"steps_per_round": 2, "ref_size": 2},
            "replay.name": "rollout_replay",
            "replay.options": {"warmup_steps": 2},
            "objective.options": {"tis_level": "token", "tis_cap": 1e9},
        },
    )
    return rollwise.train(load_config(overrides=as_sets(o)), resume=resume, log=lambda m: None)


def test_loop_run_with_rollout_replay_resumes_exactly(tmp_path):
    full = _run(tmp_path, "full", 5)
    lines = _stable(full.run_dir / "metrics.jsonl")
    # B = 4, G = 4, refs 2 x 4: round 0 = steps 0-1 (4 prompts), round 1 = steps 2-3 (2 prompts), ...
    per_step = [b - a for a, b in zip([0] + [m["cost/rollouts"] for m in lines], [m["cost/rollouts"] for m in lines])]
    assert per_step == [8 + 16, 16, 8 + 8, 8, 8 + 8]
    assert [m.get("filter/reference", 0) for m in lines] == [2, 0, 2, 0, 2]
    _run(tmp_path, "resumed", 3)
    _run(tmp_path, "resumed", 5, resume=True)
    assert _stable(tmp_path / "resumed" / "metrics.jsonl") == lines
