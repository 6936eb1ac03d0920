"""The compatibility table (rollwise/compat.py): every part's record and the refusals derived from
it at config load, before any model is loaded; and the three combinations that used to fail late
(sampler entropies with an engine that records none, periodic asynchrony with batch statistics,
a prompt longer than vLLM's max_model_len)."""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from rollwise import compat
from rollwise.config import load_config
from rollwise.registry import NEUTRAL, Compat, UserError

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs"


def refused(overrides, path=None) -> str:
    with pytest.raises(UserError) as e:
        load_config(path, overrides)
    return str(e.value)


# ---------------------------------------------------------------- the records


def test_every_backend_pool_and_wrapper_declares_a_frozen_record():
    from rollwise import backends

    parts = [backends.REGISTRY.get(n) for n in ("hf", "vllm", "scripted")]
    parts += [compat.POOLS.get(n) for n in ("local", "ray", "data_parallel", "async", "periodic")]
    parts += [compat.WRAPPERS.get(n) for n in ("sampling.arrol", "sampling.latr", "sampling.sol_rl")]
    for part in parts:
        rec = compat.record(part)
        assert isinstance(rec, Compat) and rec is not NEUTRAL, part
        with pytest.raises(dataclasses.FrozenInstanceError):
            rec.decode_hooks = not rec.decode_hooks  # frozen


def test_every_registered_strategy_has_a_record_and_batch_statistics_name_real_options():
    for section, reg in compat._registries().items():
        for name in reg.names():
            if name.endswith(":<arg>"):
                continue
            obj = reg.get(name)
            rec = compat.record(obj)
            assert isinstance(rec, Compat), (section, name)
            for option in (rec.entropy_option, rec.batch_statistics):
                if isinstance(option, str):
                    assert option in obj.Options.model_fields, (section, name, option)


def test_what_the_records_say():
    from rollwise import backends

    hf, vllm = (compat.record(backends.REGISTRY.get(n)) for n in ("hf", "vllm"))
    assert (hf.decode_hooks, hf.sampler_entropy, hf.per_rank) == (True, True, True)
    assert (vllm.decode_hooks, vllm.sampler_entropy, vllm.per_rank) == (False, False, False)
    ray = compat.record(compat.POOLS.get("ray"))
    assert (ray.decode_hooks, ray.sampler_entropy, ray.per_rank) == (False, False, False)
    tree, arrol = (compat.record(compat.WRAPPERS.get(k)) for k in ("sampling.latr", "sampling.arrol"))
    assert tree.needs_decode_hooks and tree.owns_generation and not tree.sampler_entropy
    assert arrol.needs_decode_hooks and arrol.owns_generation and arrol.sampler_entropy
    sol_rl = compat.record(compat.WRAPPERS.get("sampling.sol_rl"))  # scores with the trainer's module; its
    assert sol_rl.needs_decode_hooks and sol_rl.owns_generation and sol_rl.sampler_entropy  # rows: the pool's


def test_in_process_strategies_are_read_from_the_records():
    cfg = load_config(overrides=["sampling.arrol.enabled=true", "sampling.max_new_tokens=16"])
    assert compat.in_process_strategies(cfg) == ["sampling.arrol.enabled"]
    assert compat.in_process_strategies(load_config(CONFIGS / "april.toml")) == ["replay.name = 'april'"]
    assert compat.in_process_strategies(load_config()) == []


# ---------------------------------------------------------------- refusals derived from them


@pytest.mark.parametrize(
    "overrides, keys",
    [
        (
            ["sampling.arrol.enabled=true", "sampling.latr.enabled=true", "sampling.max_new_tokens=16"],
            ["sampling.arrol.enabled", "sampling.latr.enabled"],
        ),
        (["sampling.latr.enabled=true", "replay.name=april"], ["sampling.latr.enabled", "replay 'april'"]),
        (
            ["sampling.arrol.enabled=true", "replay.name=spec_rl", "sampling.max_new_tokens=16"],
            ["sampling.arrol.enabled", "replay 'spec_rl'"],
        ),
    ],
)
def test_only_one_part_makes_the_training_rollouts(overrides, keys):
    msg = refused(overrides)
    assert all(k in msg for k in keys), msg


@pytest.mark.parametrize(
    "wrapper",
    [
        ["sampling.latr.enabled=true"],
        ["replay.name=april"],
        ["sampling.arrol.enabled=true", "sampling.max_new_tokens=16"],
    ],
)
def test_a_wrapper_that_drives_the_hf_backend_is_refused_by_engines_without_decode_hooks(wrapper):
    msg = refused([*wrapper, "model.backend=vllm"])
    assert "model.backend = 'vllm'" in msg and "decode hooks" in msg
    msg = refused([*wrapper, "distributed.workers=1"])
    assert "distributed.workers > 0" in msg


def test_asynchrony_refuses_a_wrapper_that_drives_the_trainers_backend():
    msg = refused(["sampling.latr.enabled=true", "train.async.max_staleness=1", "objective.name=decoupled_ppo"])
    assert "sampling.latr.enabled" in msg and "train.async" in msg


def test_interrupting_generation_needs_the_in_process_hf_engine():
    msg = refused(
        [
            "train.async.max_staleness=1",
            "objective.name=decoupled_ppo",
            "train.async.on_new_weights=interrupt",
            "model.backend=vllm",
        ]
    )
    assert "train.async.on_new_weights = 'interrupt'" in msg
    load_config(
        overrides=[
            "train.async.max_staleness=1",
            "objective.name=decoupled_ppo",
            "train.async.on_new_weights=interrupt",
        ]
    )


def test_dynamic_sampling_needs_its_filter():
    msg = refused(["control.dynamic_sampling.enabled=true"])
    assert "control.dynamic_sampling.enabled" in msg and "zero_variance" in msg


def test_data_parallel_refuses_parts_that_are_not_per_rank(monkeypatch):
    for k, v in {
        "WORLD_SIZE": "2",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "localhost",
        "MASTER_PORT": "29500",
    }.items():
        monkeypatch.setenv(k, v)
    assert "train.async" in refused(["train.async.max_staleness=1", "objective.name=decoupled_ppo"])
    assert "train.async" in refused(["train.async.periodic=true"])
    assert "model.backend = 'vllm'" in refused(["model.backend=vllm"])


@pytest.mark.parametrize(
    "overrides, keys",
    [
        (["control.name=adhint"], ["control.name = 'adhint' needs advantage.name = 'adhint' (got 'grpo')"]),
        (["control.name=mssr"], ["control.name = 'mssr' needs advantage.name = 'mssr'"]),
        (["advantage.name=v05"], ["advantage.name = 'v05' needs control.name = 'v05' (got 'uniform')"]),
        (
            ["replay.name=april", "control.name=greso"],
            ["replay.name = 'april' needs control.name = 'uniform' (got 'greso')"],
        ),
        (["control.name=speed"], ["control.name = 'speed' needs 'speed_complete' in filter.names (got [])"]),
        (
            ["control.name=scope", "control.dynamic_sampling.enabled=true", "filter.names=['zero_variance']"],
            ["control.name = 'scope' does not run with control.dynamic_sampling.enabled"],
        ),
        (
            [
                "control.name=greso",
                "control.dynamic_sampling.enabled=true",
                "control.dynamic_sampling.type=replace",
                "filter.names=['zero_variance']",
            ],
            ["control.name = 'greso' does not run with control.dynamic_sampling.type = 'replace' (only 'refill')"],
        ),
        (
            ["control.name=r3l", "advantage.name=r3l", "sampling.latr.enabled=true"],
            ["control.name = 'r3l' continues its own prefixes; it does not combine with sampling.latr.enabled"],
        ),
    ],
)
def test_what_a_strategy_needs_of_the_other_sections(overrides, keys):
    msg = refused(overrides)
    assert all(k in msg for k in keys), msg


def test_what_a_strategy_needs_is_accepted_when_present():
    load_config(
        overrides=["control.name=greso", "control.dynamic_sampling.enabled=true", "filter.names=['zero_variance']"]
    )
    load_config(overrides=["control.name=speed", "filter.names=['speed_complete']"])
    load_config(overrides=["control.name=v05", "advantage.name=v05"])


# ---------------------------------------------------------------- late failure 1: sampler entropies


@pytest.mark.parametrize(
    "engine, key",
    [
        (["model.backend=vllm"], "model.backend = 'vllm'"),
        (["distributed.workers=2"], "distributed.workers = 2"),
        (["sampling.latr.enabled=true"], "sampling.latr.enabled"),
    ],
)
def test_sampler_entropy_is_refused_where_no_engine_records_it(engine, key):
    msg = refused(engine, CONFIGS / "ettrl.toml")  # advantage.options.entropy = "sampler"
    assert "advantage.options.entropy = 'sampler'" in msg and key in msg and "advantage.name = 'ettrl'" in msg


@pytest.mark.parametrize("advantage", ["ettrl", "echo"])
def test_the_default_entropy_of_ettrl_and_echo_is_refused_with_vllm(advantage):
    extra = ["objective.name=echo"] if advantage == "echo" else []
    msg = refused([f"advantage.name={advantage}", *extra, "model.backend=vllm"])
    assert "advantage.options.entropy = 'sampler'" in msg and "'surprisal'" in msg


def test_a_proxy_entropy_or_the_hf_engine_is_accepted():
    load_config(CONFIGS / "ettrl.toml", ["model.backend=vllm", "advantage.options.entropy='surprisal'"])
    load_config(CONFIGS / "ettrl.toml")  # hf records them
    load_config(CONFIGS / "mssr.toml", ["model.backend=vllm"])  # MSSR's default is 'sampled_term'
    msg = refused(["model.backend=vllm", "advantage.options.entropy='sampler'"], CONFIGS / "mssr.toml")
    assert "advantage.name = 'mssr'" in msg


def test_d3s_keeps_its_documented_fallback_to_the_trainer():
    load_config(
        CONFIGS / "d3s.toml", ["model.backend=vllm"]
    )  # batch.d3s.entropy = 'sampler': a trainer forward where missing


# ---------------------------------------------------------------- late failure 2: periodic asynchrony


@pytest.mark.parametrize(
    "config, key",
    [
        ("gdpo.toml", "advantage.name = 'gdpo' with advantage.options.batch_norm = true"),
        ("mssr.toml", "advantage.name = 'mssr'"),
        ("echo.toml", "advantage.name = 'echo'"),
        ("gdro.toml", "control.name = 'gdro'"),
        ("adhint.toml", "control.name = 'adhint'"),
        ("r3l_retry.toml", "control.name = 'r3l'"),
        ("scope.toml", "control.name = 'scope'"),
    ],
)
def test_periodic_asynchrony_refuses_parts_that_read_the_whole_batch(config, key):
    msg = refused(["train.async.periodic=true"], CONFIGS / config)
    assert msg.startswith("train.async.periodic = true cannot stream with") and key in msg, msg
    assert "computed twice" in msg


def test_periodic_asynchrony_accepts_gdpo_without_batch_normalisation():
    load_config(CONFIGS / "gdpo.toml", ["train.async.periodic=true", "advantage.options.batch_norm=false"])
    load_config(overrides=["train.async.periodic=true"])


# ---------------------------------------------------------------- late failure 3: vLLM's max_model_len


class Codec:
    def encode_prompt(self, p):
        return [0] * len(p.text)  # one token per character


def task(train_lengths, heldout_lengths=(4,)):
    def prompts(tag, lengths):
        return [SimpleNamespace(id=f"{tag}{i}", text="x" * n) for i, n in enumerate(lengths)]

    return SimpleNamespace(
        train_prompts=lambda: prompts("t", train_lengths), heldout_prompts=lambda: prompts("h", heldout_lengths)
    )


def test_a_prompt_longer_than_the_engine_is_refused_before_the_engine_starts():
    cfg = load_config(overrides=["model.backend=vllm", "model.vllm.max_model_len=32", "sampling.max_new_tokens=8"])
    with pytest.raises(UserError) as e:
        compat.check_engine_length(cfg, task([10, 30, 20]), Codec(), 64)  # 30 + 8 = 38 > 32
    msg = str(e.value)
    assert "prompt 't1' has 30 tokens" in msg and "sampling.max_new_tokens = 8" in msg
    assert "max_model_len = 32 (model.vllm.max_model_len)" in msg and "to 38 or more" in msg
    compat.check_engine_length(cfg, task([10, 24, 20]), Codec(), 64)  # 24 + 8 = 32: fits


def test_the_default_engine_length_is_the_models_positions_capped_at_4096():
    cfg = load_config(overrides=["model.backend=vllm", "sampling.max_new_tokens=8", "eval.n_prompts=1"])
    with pytest.raises(UserError, match=r"max_model_len = 36 .*model's 36 positions"):
        compat.check_engine_length(
            cfg, task([10], [29, 100]), Codec(), 36
        )  # the evaluated held-out prompt: 29 + 8 > 36
    compat.check_engine_length(cfg, task([4090 - 8]), Codec(), 10_000)  # capped at 4096
    with pytest.raises(UserError, match="max_model_len = 4096"):
        compat.check_engine_length(cfg, task([4089]), Codec(), 10_000)


def test_the_hf_backend_has_no_engine_length():
    compat.check_engine_length(load_config(overrides=["sampling.max_new_tokens=8"]), task([10_000]), Codec(), 16)


# ---------------------------------------------------------------- config.py is the schema only


def test_config_imports_no_strategy_module():
    """``config.py`` and its sections (``rollwise/sections/``) are the schema: they import the registry and each
    other, never a strategy module; importing them loads nothing else."""
    files = [ROOT / "src/rollwise/config.py", *sorted((ROOT / "src/rollwise/sections").glob("*.py"))]
    imported = set()
    for path in files:
        tree = ast.parse(path.read_text())
        imported |= {
            n.module
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("rollwise.")
        }
        imported |= {
            f"rollwise.{a.name}"
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module == "rollwise"
            for a in n.names
        }
    assert {m for m in imported if not m.startswith("rollwise.sections")} <= {"rollwise.registry", "rollwise.compat"}, (
        imported
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, rollwise.config; print(sorted(m for m in sys.modules if m.startswith('rollwise.')))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    loaded = {
        m for m in re.findall(r"'([\w.]+)'", out) if m != "rollwise.sections" and not m.startswith("rollwise.sections.")
    }
    assert loaded <= {"rollwise.config", "rollwise.registry", "rollwise.train"}, out  # train: the
    # empty package rollwise/__init__.py makes callable
    assert "rollwise.sections.train" in out  # the sections are what config assembles


def test_strategy_modules_take_their_option_schemas_from_config():
    from rollwise import config
    from rollwise.batch import d3s
    from rollwise.generate import arrol
    from rollwise.objectives import ess, otr
    from rollwise.reward import ttrl

    assert (d3s.Options, arrol.Options, ess.Options, otr.OtrOptions, ttrl.Options) == (
        config.D3SOptions,
        config.ArrolOptions,
        config.EssOptions,
        config.OtrOptions,
        config.TtrlOptions,
    )
    assert issubclass(config.D3SConfig, d3s.Options) and issubclass(config.ArrolConfig, arrol.Options)


def test_train_async_is_an_ordinary_field_written_train_async():
    from rollwise.config import to_toml

    cfg = load_config(overrides=["train.async.max_staleness=1", "objective.name=decoupled_ppo"])
    assert cfg.train.async_.max_staleness == 1 and "async_" in type(cfg.train).model_fields
    assert "[train.async]" in to_toml(cfg) and "async" in cfg.model_dump(mode="json")["train"]
    assert load_config(data=cfg.model_dump(mode="json")).train.async_.max_staleness == 1  # round trip
    msg = refused(["train.async_.max_staleness=1"])
    assert "train.async_: unknown key; did you mean train.async?" in msg


def test_build_policy_refuses_the_long_prompt_before_the_warm_start():
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("model.backend = 'vllm' is refused at load without vLLM")
    from rollwise import components

    cfg = load_config(
        overrides=[
            "model.backend=vllm",
            "model.vllm.max_model_len=16",
            "sampling.max_new_tokens=15",
            "model.warm_start.steps=5",
            "model.warm_start.cache=false",
            "model.device=cpu",
        ]
    )
    logged = []
    with pytest.raises(UserError, match=r"model\.vllm\.max_model_len"):
        components.build_policy(cfg, components.build_task(cfg), log=logged.append)
    assert not any(m.startswith("warm start") for m in logged)


EPISODE_TASKS = ("guess_number", "calculator", "python_math", "frozenlake", "gym", "textarena", "gem", "multi_attempt")


def test_a_task_declares_episodes_in_its_compatibility_record():
    """Issue #41 item 3: the episodes switch is one field of the task factory's record, read by
    ``declares_episodes`` (the config alone: nothing is built or probed); single-turn tasks keep the
    default."""
    from rollwise import tasks

    for name in tasks.REGISTRY.names():
        assert compat.record(tasks.REGISTRY.get(name)).episodes == (name.split(":")[0] in EPISODE_TASKS), name
    assert compat.declares_episodes(load_config(overrides=["task.name=calculator"]))
    assert not compat.declares_episodes(load_config(overrides=["task.name=arithmetic"]))


def test_planning_ahead_and_state_anchors_are_declared_in_the_records():
    """Issue #41 item 3: whether a pool plans ahead (the asynchronous pool: ``Compat.plans_ahead``), whether a
    controller keeps per-plan state (``Compat.keeps_plan_state``) and whether a task's turns carry state
    anchors (``Compat.state_anchors``) are fields of the parts' records, read by ``compat`` where each is
    decided, not attributes probed with a default."""
    from rollwise import control, tasks

    assert [k for k in compat.POOLS.names() if compat.record(compat.POOLS.get(k)).plans_ahead] == ["async"]
    keeps = sorted(n for n in control.REGISTRY.names() if compat.record(control.REGISTRY.get(n)).keeps_plan_state)
    assert keeps == [
        "ar3po",
        "cog_rethinker",
        "cures",
        "dars",
        "dars_b",
        "dots",
        "gdro",
        "greso",
        "speed",
        "wise",
        "xrpo",
    ]
    assert not any(hasattr(control.REGISTRY.get(n), "plans_ahead") for n in control.REGISTRY.names())
    python_math = tasks.REGISTRY.get("python_math")
    assert compat.record(python_math).state_anchors is False and not hasattr(python_math, "state_anchors")
    assert compat.record(tasks.REGISTRY.get("calculator")).state_anchors is True


def test_compat_reads_the_records_it_declares_without_probing():
    """The three mode switches above, and the controller hooks every controller inherits
    (``rollwise.types.Controller``), are read from ``compat.py`` without ``getattr(..., default)``."""
    tree = ast.parse((ROOT / "src" / "rollwise" / "compat.py").read_text())
    probes = [
        ast.unparse(n)
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr" and len(n.args) == 3
    ]
    named = [p for p in probes if any(k in p for k in ("plans_ahead", "state_anchors", "needs_prox", "ctrl, h"))]
    assert named == []


def test_the_static_sampler_loads_under_asynchrony():
    """The static path decodes on a generation copy whose attention is its own (backends/generation_copy.py),
    so train.async (a generator thread beside the trainer's forwards) no longer refuses it, nor turns
    'auto' into the eager path (tests/invariants/test_async.py runs it)."""
    for extra in (["train.async.periodic=true"], ["train.async.max_staleness=1", "objective.name=decoupled_ppo"]):
        assert load_config(overrides=["model.sampler=static", *extra]).model.sampler == "static"
