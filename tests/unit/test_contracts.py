"""Every registered strategy satisfies its family's contract (issue #27): controllers and replay
sources inherit the base classes that declare every hook the loop and the session call (so neither
probes), advantages declare only inputs the batch builder knows, objectives and filters are callables
with their options, backends build through the registry, pools answer the pool protocol."""

import inspect
from collections import Counter

import pytest
import torch

from rollwise import backends, control, replay
from rollwise import filter as filters
from rollwise.batches import apply_row_weights
from rollwise.control.uniform import Uniform
from rollwise.filter.chain import apply_filters
from rollwise.objectives import ADVANTAGES, OBJECTIVES
from rollwise.objectives.inputs import _CONTEXT_INPUTS, _INPUTS, advantage_context, advantage_inputs
from rollwise.registry import record
from rollwise.types import (
    AdvantageInputs,
    Backend,
    Controller,
    Decision,
    Group,
    Prompt,
    ReplaySource,
    ReplaySourceProtocol,
    Rollout,
    RunState,
    Verdict,
    WeightReceiver,
)

HOOKS = (
    "select",
    "plan",
    "next_round",
    "finish_batch",
    "observe",
    "bind",
    "advantage_inputs",
    "after_update",
    "state_dict",
    "load_state_dict",
)


def test_the_controller_contract_is_written_once():
    """Issue #41 item 3: the hooks are one class, ``rollwise.types.Controller`` (the ground floor, so the
    asynchronous pool's lock keeps it without importing a controller), not a Protocol beside a base class."""
    import importlib.util

    assert importlib.util.find_spec("rollwise.control.base") is None
    assert not getattr(Controller, "_is_protocol", False)
    public = {n for n, v in vars(Controller).items() if callable(v) and not n.startswith("_")}
    assert public == set(HOOKS)


def _entries(registry):
    return [(name, registry.get(name)) for name in registry.names()]


@pytest.mark.parametrize("name,cls", _entries(control.REGISTRY), ids=control.REGISTRY.names())
def test_every_controller_inherits_the_hook_contract(name, cls):
    assert issubclass(cls, Controller)
    for hook in HOOKS:
        assert callable(getattr(cls, hook)), hook
    assert isinstance(record(cls).keeps_plan_state, bool)
    assert not hasattr(cls, "plans_ahead")  # declared once, in the record (issue #41 item 3)
    for required in (
        "select",
        "plan",
        "state_dict",
        "load_state_dict",
    ):  # no controller falls back on the base's refusal
        assert getattr(cls, required) is not getattr(Controller, required), required


def _prompts(n=4):
    return [Prompt(f"p{i}", "t", "x", "1") for i in range(n)]


def _group(prompt, rewards):
    return Group(
        prompt, tuple(Rollout(prompt.id, (1,), (2, 3), (-0.5, -0.5), "stop", 0, "t", Verdict(r)) for r in rewards)
    )


def test_the_optional_hooks_change_nothing_by_default():
    from rollwise.config import load_config

    cfg = load_config(overrides=["control.prompts_per_step=2", "control.rollouts_per_prompt=2"])
    ctrl = Uniform(_prompts(), cfg.control, None, 0)
    st = RunState()
    groups = [_group(p, [1.0, 0.0]) for p in ctrl.select(st)]
    kept, dropped = groups[:1], Counter({"zero_variance": 1})
    assert not ctrl.next_round(groups, st)
    assert ctrl.finish_batch(groups, kept, dropped) is kept and dropped == Counter({"zero_variance": 1})
    rows = [r for g in groups for r in g.rollouts]
    assert ctrl.advantage_inputs(rows, ("value_prior", "prompt_baseline")) == AdvantageInputs()
    assert advantage_context(ADVANTAGES.get("grpo"), rows, None, ctrl).weights is None
    assert dict(ctrl.metrics) == {}
    assert ctrl.after_update(None, rows, {}, None) is None
    with pytest.raises(ValueError, match="control.name = 'v05'.*got Uniform"):
        advantage_context(ADVANTAGES.get("v05"), rows, None, ctrl)
    with pytest.raises(ValueError, match="control.name = 'mssr'.*got Uniform"):
        advantage_context(ADVANTAGES.get("mssr"), rows, None, ctrl)
    with pytest.raises(TypeError):  # the default metrics are read-only: a controller assigns its own dict
        ctrl.metrics["x"] = 1.0  # type: ignore[index]


def test_apply_filters_keeps_then_lets_the_controller_finish_the_batch():
    class Halve(Controller):
        def finish_batch(self, groups, kept, dropped):
            dropped["halved"] += len(kept) - len(kept) // 2
            return kept[: len(kept) // 2]

    groups = [_group(p, r) for p, r in zip(_prompts(), ([1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0]))]
    same = [("zero_variance", lambda g: Decision(len({r.verdict.score for r in g.rollouts}) > 1, "zero_variance"))]
    kept, dropped = apply_filters(same, groups, keep_at_most=2, controller=Halve())
    assert kept == groups[:1] and dropped == Counter({"zero_variance": 1, "surplus": 1, "halved": 1})
    assert apply_filters(same, groups, None, Controller()) == apply_filters(same, groups)


@pytest.mark.parametrize("name,cls", _entries(replay.REGISTRY), ids=replay.REGISTRY.names())
def test_every_replay_source_inherits_the_replay_contract(name, cls):
    assert issubclass(cls, ReplaySource)
    for method in ("add", "mix", "state_dict", "load_state_dict", "bind"):
        assert getattr(cls, method) is not getattr(ReplaySource, method) or method == "bind", method
    assert isinstance(cls.schedules_generation, bool)
    assert callable(getattr(cls, "wrap_pool", None)) == cls.schedules_generation


def test_a_replay_source_instance_satisfies_the_protocol():
    from rollwise.replay.on_policy import OnPolicy

    src = OnPolicy(None, None, 0)
    assert isinstance(src, ReplaySourceProtocol) and dict(src.metrics) == {} and src.bind(None) is None


KNOWN_INPUTS = set(_INPUTS) | set(_CONTEXT_INPUTS)


@pytest.mark.parametrize("name,fn", _entries(ADVANTAGES), ids=ADVANTAGES.names())
def test_every_advantage_declares_known_inputs_and_options(name, fn):
    assert callable(fn) and inspect.isclass(fn.Options)
    assert set(getattr(fn, "inputs", ())) <= KNOWN_INPUTS


def test_advantages_are_a_function_of_rewards_group_ids_and_the_context():
    """grpo of rewards (1, 0 | 1, 1): A = (0.7071, -0.7071 | 0, 0); row weights (2, 1, 1, 3) multiply them."""
    fn = ADVANTAGES.get("grpo")

    class Weights(Controller):
        def advantage_inputs(self, rows, needs=()):
            return AdvantageInputs(weights=torch.tensor([2.0, 1.0, 1.0, 3.0], dtype=torch.float64))

    context = advantage_context(fn, [], None, Weights())
    advs = fn(
        torch.tensor([1.0, 0.0, 1.0, 1.0]),
        torch.tensor([0, 0, 1, 1]),
        fn.Options(),
        **advantage_inputs(fn, [], context),
    )
    out = apply_row_weights(advs, context.weights)
    assert out.values.tolist() == pytest.approx([1.4142, -0.7071, 0.0, 0.0], abs=1e-4)
    assert apply_row_weights(advs, None) is advs


def test_a_controller_gives_the_advantage_stage_one_record():
    """Issue #41 item 3: weights, priors and baselines come from one hook, ``advantage_inputs(rows,
    needs)``, asked once per batch with the estimator's declared inputs. mssr of rewards (1, 0 | 1, 1)
    minus the given baselines (0.5, 0.5 | 1, 1) is (0.5, -0.5 | 0, 0): mean 0, population variance
    0.5 / 4 = 0.125, so A = (0.5, -0.5 | 0, 0) / 0.3536 = (1.4142, -1.4142 | 0, 0); the weights (2, 1, 1, 3)
    pass through to the context unchanged."""
    asked = []

    class Gives(Controller):
        def advantage_inputs(self, rows, needs=()):
            asked.append(tuple(needs))
            return AdvantageInputs(
                weights=torch.tensor([2.0, 1.0, 1.0, 3.0]),
                priors=torch.tensor([0.25, 0.25, 0.75, 0.75]),
                baselines=torch.tensor([0.5, 0.5, 1.0, 1.0]),
            )

    fn = ADVANTAGES.get("mssr")
    rows = [
        r
        for g in (_group(Prompt("a", "t", "x", "1"), [1.0, 0.0]), _group(Prompt("b", "t", "x", "1"), [1.0, 1.0]))
        for r in g.rollouts
    ]
    context = advantage_context(fn, rows, None, Gives())
    assert asked == [tuple(fn.inputs)]
    assert context.prompt_baseline.tolist() == [0.5, 0.5, 1.0, 1.0] and context.value_prior is None
    assert context.weights.tolist() == [2.0, 1.0, 1.0, 3.0]
    advs = fn(
        torch.tensor([1.0, 0.0, 1.0, 1.0]),
        torch.tensor([0, 0, 1, 1]),
        fn.Options(),
        **advantage_inputs(fn, rows, context),
    )
    assert advs.values.tolist() == pytest.approx([1.4142, -1.4142, 0.0, 0.0], abs=1e-4)
    prior = advantage_context(ADVANTAGES.get("v05"), rows, None, Gives())
    assert prior.value_prior.tolist() == [0.25, 0.25, 0.75, 0.75] and prior.prompt_baseline is None


@pytest.mark.parametrize("name,fn", _entries(OBJECTIVES), ids=OBJECTIVES.names())
def test_every_objective_is_a_loss_with_options(name, fn):
    assert callable(fn) and inspect.isclass(fn.Options)


@pytest.mark.parametrize("name,fn", _entries(filters.REGISTRY), ids=filters.REGISTRY.names())
def test_every_filter_decides_on_a_group(name, fn):
    from rollwise.registry import validate_options

    opts = validate_options("filter", name, fn, {})
    d = fn(_group(_prompts(1)[0], [1.0, 0.0]), opts) if opts is not None else fn(_group(_prompts(1)[0], [1.0, 0.0]))
    assert isinstance(d, Decision)


@pytest.mark.parametrize("name,cls", _entries(backends.REGISTRY), ids=backends.REGISTRY.names())
def test_every_backend_generates_and_builds_through_the_registry(name, cls):
    assert isinstance(cls, Backend) and callable(cls.for_run)


def test_the_backend_is_built_through_the_registry():
    from rollwise.config import load_config
    from rollwise.tokens import Codec
    from rollwise.trainer import tiny

    cfg = load_config(overrides=["model.compute_dtype=float32"])
    model, tok = tiny.build_tiny(cfg.model.name, seed=0)
    b = backends.build(cfg, Codec(tok, use_chat=False), model=model)
    assert type(b) is backends.REGISTRY.get(cfg.model.backend) and b.model is model
    assert not isinstance(b, WeightReceiver)  # the hf sampler shares the trainer's module: nothing to publish to


POOLS = [
    "rollwise.distributed.local:LocalPool",
    "rollwise.distributed.ray_pool:RayPool",
    "rollwise.distributed.ray_pool:SeededPool",
    "rollwise.distributed.data_parallel:DataParallelPool",
    "rollwise.distributed.async_pool:AsyncPool",
    "rollwise.generate.arrol:ArrolPool",
    "rollwise.generate.april:AprilPool",
    "rollwise.generate.spec_rl:SpeculativePool",
    "rollwise.reward.ttrl:TtrlPool",
]


@pytest.mark.parametrize("path", POOLS)
def test_every_pool_answers_the_pool_protocol(path):
    from rollwise.registry import load_attr

    cls = load_attr(path)
    assert callable(cls.generate)
    forwards = "__getattr__" in vars(cls)  # a wrapper: what it does not define is the wrapped pool's
    assert forwards or (callable(getattr(cls, "take_cost", None)) and callable(getattr(cls, "close", None)))


def test_a_local_pool_satisfies_the_pool_protocol():
    from rollwise.backends.scripted import ScriptedBackend
    from rollwise.distributed.local import LocalPool
    from rollwise.distributed.ray_pool import SeededPool
    from rollwise.types import Pool, Sampling

    class Codec:
        eos_ids, pad_id = (2,), 0

    pool = LocalPool(
        ScriptedBackend(lambda seq, i: [5], eos_id=2), Codec(), lambda p, c: Verdict(1.0), Sampling(1.0, 1.0, 4)
    )
    assert isinstance(pool, Pool) and isinstance(SeededPool(pool, 0), Pool) and pool.close() is None
