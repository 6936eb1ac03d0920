"""Asynchrony is correct for every controller (issue #27, item 4). With ``train.async.max_staleness``
= η >= 1 the async pool draws plans k+1 .. k+η before step k's rounds, filters and ``observe`` run.

- A controller that keeps per-plan state between them (``Compat(keeps_plan_state=True)``) is refused at
  config load, naming ``train.async.max_staleness`` and the controller; so is dynamic sampling's
  ``replace``.
- The others are driven through the real :class:`AsyncPool` and the loop's order of calls at η = 0
  and η = 1: for the plan each step trains, the top-up rounds, the groups the filters keep (after
  ``finish_batch``), the prompts ``observe`` books, what the advantage reads from the controller
  (MSSR's baselines, V0.5's priors, which V0.5 now keeps per plan) and the rollouts charged are
  the same. Where η = 1 legitimately changes the prompts (dynamic sampling's refill draws from the
  stream the plans ahead also use; V0.5's history prior lags), the per-step invariants are checked.
- The same harness shows what the refused ones do at η = 1 (the defects of the issue), so the
  refusal is needed and the harness can tell.
- Stale rollouts with an objective that has no off-policy correction are refused unless
  ``train.async.allow_uncorrected = true``.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from rollwise.components import build_strategies
from rollwise.config import load_config
from rollwise.control import REGISTRY
from rollwise.distributed.async_pool import AsyncPool
from rollwise.filter.chain import apply_filters
from rollwise.generate.common import StepCost
from rollwise.registry import UserError, record
from rollwise.types import Prompt, Rollout, RunState, Services, Verdict

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
STALE = ["train.async.max_staleness=1", "train.async.allow_uncorrected=true"]  # isolates the controller check

# ---------------------------------------------------------------- refusals at config load

REFUSED = [  # (shipped config, control.name): every controller with per-plan state between plan and after_update
    ("gdro.toml", "gdro"),
    ("gdro_rollout.toml", "gdro"),
    ("speed.toml", "speed"),
    ("wise.toml", "wise"),
    ("dars.toml", "dars"),
    ("dars_b.toml", "dars_b"),
    ("xrpo.toml", "xrpo"),
    ("cures.toml", "cures"),
    ("greso.toml", "greso"),
    ("dots_rr.toml", "dots"),
    ("ar3po.toml", "ar3po"),
    ("cog_rethinker.toml", "cog_rethinker"),
]
ACCEPTED = [
    "uniform",
    "vcrl",
    "vade",
    "brorl",
    "drive",
    "adhint",
    "r3l",
    "scope",
    "mssr",
    "v05",
    "roc",
    "wise3",
]  # v05: priors kept per plan; roc: its draw is keyed by the group, not the plan; wise3: its skip and
# top-ups read the history up to the last observed step (plans ahead choose from older statistics)
NEEDS_VALUE = ["wise2"]  # reads the pass-rate predictor, which refuses asynchrony (value.enabled, compat.check_value)


@pytest.mark.parametrize("config, name", REFUSED)
def test_a_controller_with_per_plan_state_is_refused_at_eta_one(config, name):
    load_config(CONFIGS / config)  # synchronous: fine
    load_config(
        CONFIGS / config, ["train.async.enabled=true", "train.async.max_staleness=0"]
    )  # eta = 0 through the pool: fine
    with pytest.raises(UserError) as e:
        load_config(CONFIGS / config, STALE)
    msg = str(e.value)
    assert "train.async.max_staleness = 1" in msg and f"control.name = {name!r}" in msg


def test_both_gdro_configs_are_covered():
    prompt_only = load_config(CONFIGS / "gdro.toml").control.options
    rollout = load_config(CONFIGS / "gdro_rollout.toml").control.options
    assert prompt_only.get("rollout_gdro", False) is False and prompt_only.get("prompt_gdro", True) is not False
    assert rollout["rollout_gdro"] is True


def test_every_registered_controller_is_classified():
    """A new controller must be looked at: either refused above or accepted (and driven below)."""
    refused = {name for _, name in REFUSED}
    assert refused | set(ACCEPTED) | set(NEEDS_VALUE) == set(REGISTRY.names())
    for name in REGISTRY.names():
        assert record(REGISTRY.resolve(name).obj).keeps_plan_state is (name in refused), name


@pytest.mark.parametrize("name", NEEDS_VALUE)
def test_a_controller_that_reads_the_predictor_is_refused_with_asynchrony(name):
    with pytest.raises(UserError, match="value.enabled reads prompt states .* does not run with train.async"):
        load_config(overrides=[f"control.name={name!r}".replace("'", '"'), "value.enabled=true", *STALE])


@pytest.mark.parametrize("name", ACCEPTED)
def test_a_controller_that_plans_ahead_is_accepted_at_eta_one(name):
    extra = {"adhint": ["advantage.name=adhint"], "mssr": ["advantage.name=mssr"], "v05": ["advantage.name=v05"]}.get(
        name, []
    )
    assert load_config(overrides=[f"control.name={name}", *extra, *STALE]).train.async_.max_staleness == 1


def test_dynamic_sampling_replace_is_refused_and_refill_accepted():
    with pytest.raises(UserError, match=re.escape("control.dynamic_sampling.type = 'replace'")) as e:
        load_config(CONFIGS / "replace.toml", STALE)
    assert "train.async.max_staleness = 1" in str(e.value)
    load_config(CONFIGS / "dapo.toml", STALE)  # refill


def test_dynamic_sampling_does_not_hide_a_refused_controller():
    with pytest.raises(UserError) as e:
        load_config(
            CONFIGS / "dars.toml", [*STALE, "control.dynamic_sampling.enabled=true", "filter.names=['zero_variance']"]
        )
    assert "control.name = 'dars'" in str(e.value)


def test_the_refusal_comes_before_any_model_or_run_directory(tmp_path, monkeypatch, capsys):
    from rollwise import cli, session

    def no_run(*a, **k):
        raise AssertionError("a run was started")

    monkeypatch.setattr(session.Run, "__init__", no_run)
    with pytest.raises(SystemExit) as e:
        cli.main(
            [
                "train",
                "--config",
                str(CONFIGS / "speed.toml"),
                "--set",
                "train.async.max_staleness=1",
                "--set",
                "objective.name=decoupled_ppo",
                "--set",
                f"run.dir={tmp_path}",
            ]
        )
    assert e.value.code != 0
    out = capsys.readouterr()
    assert "train.async.max_staleness" in out.err + out.out and "control.name = 'speed'" in out.err + out.out
    assert not any(tmp_path.iterdir())  # no run directory, so no model either


# ---------------------------------------------------------------- off-policy correction


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["objective.name=gspo"],
        ["objective.name=dapo"],
        ["objective.name=grpo", "objective.options={clip_eps = 0.1}"],
    ],
)
def test_stale_rollouts_without_a_correction_are_refused_naming_the_keys(overrides):
    with pytest.raises(UserError) as e:
        load_config(overrides=["train.async.max_staleness=2", *overrides])
    msg = str(e.value)
    for key in (
        "train.async.max_staleness = 2",
        "objective.name",
        "objective.options.tis_level",
        "train.async.allow_uncorrected = true",
    ):
        assert key in msg


@pytest.mark.parametrize(
    "overrides",
    [
        ["objective.name=decoupled_ppo"],
        ["objective.options={tis_level = 'token'}"],
        ["objective.name=gspo", "objective.options={tis_level = 'sequence'}"],
        ["train.async.allow_uncorrected=true"],
        ["train.async.enabled=true", "train.async.max_staleness=0"],  # eta = 0: nothing stale
        ["train.async.enabled=false", "train.async.max_staleness=2"],  # off: the synchronous loop
        ["train.async.periodic=true"],  # strictly on-policy
    ],
)
def test_corrected_allowed_or_fresh_rollouts_are_accepted(overrides):
    staleness = (
        [] if any("max_staleness" in o or "periodic" in o for o in overrides) else ["train.async.max_staleness=2"]
    )
    load_config(overrides=[*staleness, *overrides])


def test_a_sampler_other_than_the_trainer_counts_its_default_behaviour_weight():
    from rollwise.compat import corrects_off_policy
    from rollwise.components import objective_options

    cfg = load_config(overrides=["train.async.max_staleness=1", "objective.name=decoupled_ppo"])
    vllm = cfg.model_copy(
        update={
            "model": cfg.model.model_copy(update={"backend": "vllm"}),
            "objective": cfg.objective.model_copy(update={"name": "grpo"}),
        }
    )
    assert objective_options(vllm).tis_level == "token" and corrects_off_policy(vllm)
    hf = cfg.model_copy(update={"objective": cfg.objective.model_copy(update={"name": "grpo"})})
    assert not corrects_off_policy(hf)


# ---------------------------------------------------------------- the loop's order through the real pool


class Task:
    name = "t"

    def __init__(self, n):  # value_prior (V0.5's metadata prior): 0, .25, .5, .75, 1, 0, ...
        self.prompts = [Prompt(f"p{i}", "t", f"q{i}", "0", metadata={"value_prior": (i % 5) / 4}) for i in range(n)]

    def train_prompts(self):
        return self.prompts

    def target(self, prompt):
        return "abcdef"


class Codec:
    def encode_text(self, text):
        return tuple(ord(c) for c in text)

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


class Engine:
    """Rewards depend only on (prompt id, rollout index, prefix), never on the version, so the
    same plan gets the same groups at η = 0 and η = 1."""

    def __init__(self):
        self.cost = StepCost()
        self.seen: dict[tuple, int] = {}

    def rollouts(self, plan, version, sampling=None, generator=None, charge=True):
        out = []
        for req in plan.requests:
            prefix = tuple(req.prefix or ())
            for _ in range(req.n):
                key = (req.prompt.id, prefix)
                i = self.seen[key] = self.seen.get(key, -1) + 1
                score = float(zlib.crc32(f"{req.prompt.id}:{i}:{len(prefix)}".encode()) % 3 == 0)
                ids = prefix + (7,)
                out.append(
                    (
                        req.prompt,
                        Rollout(
                            req.prompt.id,
                            (1,),
                            ids,
                            (-0.5,) * len(ids),
                            "stop",
                            version,
                            "x",
                            Verdict(score),
                            token_versions=(version,) * len(ids),
                        ),
                    )
                )
        self.cost.charge(len(out), len(out), [r.verdict for _, r in out], 0.0, 0.0)
        return out

    def take_cost(self):
        cost, self.cost = self.cost, StepCost()
        return cost


def drive(overrides: list[str], eta: int, steps: int = 6, prompts: int = 12, hook=None):
    """The loop's calls (select, plan, generate, next_round, filters + finish_batch, observe) on the
    real async pool. Per step: the groups trained, the top-up rounds, the kept groups, the prompts
    ``observe`` booked in the history, the rollouts charged, and ``hook(ctrl, groups)`` (what the
    advantage would read from the controller after ``observe``)."""
    cfg = load_config(overrides=["control.prompts_per_step=4", "control.rollouts_per_prompt=4", *overrides])
    task = Task(prompts)
    parts = build_strategies(cfg, task)
    ctrl = parts.controller
    ctrl.bind(Services(task, Codec()))
    st = RunState()
    pool = AsyncPool(
        Engine(),
        lambda v, w: None,
        SimpleNamespace(max_staleness=eta, on_new_weights="finish"),
        lambda: ctrl.plan(ctrl.select(st), st),
    )
    pool.load_weights(0, {})
    trace = []
    try:
        for _ in range(steps):
            plan = ctrl.plan(ctrl.select(st), st)
            groups, tops = [], []
            while plan:
                if groups:
                    tops.append(sorted((r.prompt.id, r.n, len(r.prefix or ())) for r in plan.requests))
                groups = pool.generate(plan, groups, st.policy_version)
                plan = ctrl.next_round(groups, st)
            kept, _ = apply_filters(parts.filters, groups, parts.keep_at_most, ctrl)
            ctrl.observe(groups, st)
            history = getattr(ctrl, "history", None)
            booked = (
                sorted(pid for pid, recs in history.records.items() if recs and recs[-1].step == st.step)
                if history
                else None
            )
            trace.append(
                {
                    "trained": sorted((g.prompt.id, g.size) for g in groups),
                    "top_ups": tops,
                    "kept": sorted(
                        (g.prompt.id, g.size, tuple(r.verdict.details.get("hint_tokens", 0) for r in g.rollouts))
                        for g in kept
                    ),
                    "booked": booked,
                    "rollouts": pool.take_cost().rollouts,
                    "hook": hook(ctrl, groups) if hook is not None else None,
                }
            )
            st.step += 1
            st.policy_version += 1
            pool.load_weights(st.policy_version, {})
    finally:
        pool.close()
    return trace


PLANS_AHEAD = {  # controllers whose plans come from the stream alone, so plan k is the same at eta 0 and 1
    "uniform": [],
    "vcrl": ["control.name=vcrl"],
    "adhint": ["control.name=adhint", "advantage.name=adhint"],
    "mssr": ["control.name=mssr", "advantage.name=mssr"],  # + its baselines (advantage_inputs)
    "v05": [
        "control.name=v05",
        "advantage.name=v05",
        "control.options={prior = 'metadata'}",
    ],  # + its priors (advantage_inputs)
}


@pytest.mark.parametrize("name", sorted(PLANS_AHEAD))
def rows(groups):
    return [r for g in groups for r in g.rollouts]


def mssr_baselines(ctrl, groups):
    return ctrl.advantage_inputs(rows(groups), ("prompt_baseline",)).baselines.tolist()


def v05_priors(ctrl, groups):
    """What the v05 advantage reads after observe: each trained prompt's prior."""
    return dict(
        zip((r.prompt_id for r in rows(groups)), ctrl.advantage_inputs(rows(groups), ("value_prior",)).priors.tolist())
    )


@pytest.mark.parametrize("name", sorted(PLANS_AHEAD))
def test_at_eta_one_the_bookkeeping_is_that_of_the_trained_plan(name):
    hook = {"mssr": mssr_baselines, "v05": v05_priors}.get(name)
    sync, ahead = drive(PLANS_AHEAD[name], 0, hook=hook), drive(PLANS_AHEAD[name], 1, hook=hook)
    assert ahead == sync
    for line in ahead:  # observe booked exactly the prompts trained
        assert line["booked"] == sorted(pid for pid, _ in line["trained"])
    if name in ("vcrl", "adhint", "v05"):  # the rounds under test did run
        assert any(line["top_ups"] for line in ahead)
    if name == "adhint":
        assert any(any(h for _, _, hints in line["kept"] for h in hints) for line in ahead)


def test_dynamic_sampling_refill_at_eta_one_refills_the_trained_plan():
    """Refill draws its fresh prompts from the stream that also feeds the plans drawn ahead, so its
    prompts differ from η = 0 (plan k + 1 is drawn before step k refills). What must hold: step 0's
    first round is the same plan, refills add prompts to the trained plan, each step keeps the
    target (4) unless max_rounds (4) ran out, and observe books exactly the groups trained."""
    refill = ["control.dynamic_sampling.enabled=true", "filter.names=['zero_variance']"]
    sync, ahead = drive(refill, 0, prompts=100), drive(refill, 1, prompts=100)  # no epoch wrap: no refill skipped
    first = lambda line: {p for p, _ in line["trained"]} - {p for t in line["top_ups"] for p, _, _ in t}  # noqa: E731
    assert first(ahead[0]) == first(sync[0]) and len(first(sync[0])) == 4
    assert any(line["top_ups"] for line in ahead)
    for line in ahead:
        refilled = {p for t in line["top_ups"] for p, _, _ in t}
        assert refilled <= {p for p, _ in line["trained"]} and len(refilled) < len(line["trained"])
        assert line["booked"] == sorted(p for p, _ in line["trained"])
        assert len(line["kept"]) == 4 or len(line["top_ups"]) == 3


def test_v05_with_the_history_prior_tests_and_fuses_the_trained_plan_at_eta_one():
    """The history prior of plan k + 1 is computed before step k is observed, so the priors differ
    from η = 0 (escalations are checked with the metadata prior above); what must hold: no step
    lacks a prior (the issue's crash at step 0), the advantage gets exactly the trained prompts'
    priors, and plans 0 and 1, both drawn before any data, have the uninformed prior."""
    v05 = ["control.name=v05", "advantage.name=v05", "control.options={prior = 'history'}"]
    ahead = drive(v05, 1, hook=v05_priors, prompts=40)
    for line in ahead:
        trained = {p for p, _ in line["trained"]}
        assert set(line["hook"]) == trained == set(line["booked"])
        assert {p for t in line["top_ups"] for p, _, _ in t} <= trained
    assert set(ahead[0]["hook"].values()) == set(ahead[1]["hook"].values()) == {0.5}  # plans 0 and 1: no data yet
    assert set(drive(v05, 0, hook=v05_priors, prompts=40, steps=2)[1]["hook"].values()) != {
        0.5
    }  # η = 0: plan 1 knows step 0


def test_the_harness_sees_the_defects_the_refusal_prevents():
    """Driven anyway at η = 1 (bypassing the config check), the refused controllers misbehave as
    the issue describes; at η = 0 the same harness trains them as the synchronous loop does. (V0.5,
    which crashed here before its priors were kept per plan, is in the test above.)"""
    speed = ["control.name=speed", "filter.names=['speed_complete']", "control.options={n_init = 2}"]
    wise = ["control.name=wise", "filter.names=['speed_complete']", "control.options={n_init = 2}"]
    for overrides in (speed, wise):  # more rollouts a step, pre-generated screens wasted
        sync, ahead = drive(overrides, 0), drive(overrides, 1)
        assert sum(x["rollouts"] for x in ahead) > sum(x["rollouts"] for x in sync)
    dars_sync, dars_ahead = drive(["control.name=dars"], 0, prompts=40), drive(["control.name=dars"], 1, prompts=40)
    assert any(x["top_ups"] for x in dars_sync) and not any(x["top_ups"] for x in dars_ahead)  # top-ups lost
