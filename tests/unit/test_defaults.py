"""Defaults that follow the model and the task (rollwise.defaults, issue #32)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise import defaults
from rollwise.config import load_config, to_toml
from rollwise.registry import UserError


def _jsonl(tmp_path, n, solution=None):
    p = tmp_path / "d.jsonl"
    rows = [
        {"question": f"What is {i} + 1?", "answer": str(i + 1), **({"solution": solution} if solution else {})}
        for i in range(n)
    ]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_embedded_default_is_unchanged():
    cfg = load_config()
    assert defaults.resolve(cfg, log=lambda m: None) is cfg
    assert (cfg.sampling.max_new_tokens, cfg.model.warm_start.steps, cfg.model.warm_start.batch_size) == (8, 1150, 64)
    assert (cfg.control.prompts_per_step, cfg.control.rollouts_per_prompt, cfg.train.steps) == (32, 8, 600)
    assert not defaults.is_set(cfg, "sampling.max_new_tokens")


def test_presets_and_test_overrides_are_unchanged(tmp_path):
    cfg = load_config(overrides=as_sets(tiny_overrides(tmp_path)))
    assert defaults.resolve(cfg, log=lambda m: None) is cfg


def test_chat_model_on_jsonl_gets_profile_and_token_room(tmp_path):
    p = _jsonl(tmp_path, 40)
    logs = []
    cfg = defaults.resolve(
        load_config(overrides=[f'task.name="jsonl:{p}"', "model.name=smollm2-135m"]), log=logs.append
    )
    assert cfg.sampling.max_new_tokens == 256  # short answers: the profile's floor, room for reasoning
    assert cfg.sampling.temperature == 0.7  # the pretrained profile: SmolLM2 rambles at 1.0 (rollwise.defaults)
    assert (cfg.control.prompts_per_step, cfg.control.rollouts_per_prompt, cfg.train.steps) == (4, 8, 40)
    # training passes of 4 rows, not the schema's 128: a whole step in one pass ran out of 24 GB
    assert cfg.train.micro_batch == 4
    assert (
        defaults.resolve(
            load_config(overrides=[f'task.name="jsonl:{p}"', "model.name=smollm2-135m", "train.micro_batch=16"]),
            log=lambda m: None,
        ).train.micro_batch
        == 16
    )
    assert cfg.model.warm_start.steps == 1150  # not warm-started (pretrained = false): left as it is
    assert cfg.model.lora.enabled and cfg.train.lr == 2e-4  # LoRA (peft is installed here; without it: refused)
    [line] = logs
    assert (
        "sampling.max_new_tokens = 256" in line and "sampling.temperature = 0.7" in line and "train.steps = 40" in line
    )
    text = to_toml(cfg)
    assert "# derived: sampling.max_new_tokens = 256 from" in text
    assert tomllib.loads(text)["sampling"]["max_new_tokens"] == 256


def test_long_references_raise_max_new_tokens(tmp_path):
    p = _jsonl(tmp_path, 20, solution="x" * 300)
    cfg = load_config(
        overrides=[f'task.name="jsonl:{p}"', "model.name=smollm2-135m", "task.options.solution_field=solution"]
    )
    out = defaults.resolve(cfg, log=lambda m: None)
    assert out.sampling.max_new_tokens == 8 * -(-((100 + 1) * 2 + 64) // 8)  # 300 chars / 3 = 100 tokens + end, x2 + 64
    tiny = defaults.resolve(
        load_config(overrides=[f'task.name="jsonl:{p}"', "task.options.solution_field=solution"]), log=lambda m: None
    )
    assert tiny.sampling.max_new_tokens == 8 * -(-(301 * 1.25) // 8)  # characters are the tiny model's tokens


def test_reasoning_gym_on_tiny_fits_answer_tags():
    pytest.importorskip("reasoning_gym")
    cfg = load_config(
        overrides=['task.name="reasoning_gym:chain_sum"', "task.options.size=50", "task.options.heldout_size=10"]
    )
    out = defaults.resolve(cfg, log=lambda m: None)
    from rollwise import components

    longest = max(len(t) for t in defaults.references(components.build_task(cfg), episodes=False))
    assert out.sampling.max_new_tokens >= longest + 1 > 8


def test_explicit_settings_win(tmp_path):
    p = _jsonl(tmp_path, 16)
    sets = [
        f'task.name="jsonl:{p}"',
        "model.name=smollm2-135m",
        "sampling.max_new_tokens=8",
        "sampling.temperature=1.0",
        "train.steps=600",
        "control.prompts_per_step=32",
        "eval.n_prompts=200",
        "eval.every=50",
        "train.lr=2e-4",
        "train.micro_batch=128",
    ]
    cfg = load_config(overrides=sets)
    assert defaults.resolve(cfg, log=lambda m: None) is cfg
    cfg = load_config(
        overrides=[f'task.name="jsonl:{p}"', "model.warm_start.steps=1150", "model.warm_start.batch_size=64"]
    )
    out = defaults.resolve(cfg, log=lambda m: None)
    assert (out.model.warm_start.steps, out.model.warm_start.batch_size) == (1150, 64)


def test_warm_start_sized_to_a_16_row_file(tmp_path):
    p = _jsonl(tmp_path, 20)  # heldout_fraction 0.1 -> 18 train rows
    cfg = load_config(overrides=[f'task.name="jsonl:{p}"'])
    out = defaults.resolve(cfg, log=lambda m: None)
    from rollwise import components

    rows = len(components.build_task(cfg).train_prompts())
    assert out.model.warm_start.batch_size == rows
    assert out.model.warm_start.steps == defaults.WARM_EPOCHS  # 16 passes over the rows, one batch each


def test_resolved_config_reloads_as_set(tmp_path):
    p = _jsonl(tmp_path, 20)
    out = defaults.resolve(
        load_config(overrides=[f'task.name="jsonl:{p}"', "model.name=smollm2-135m"]), log=lambda m: None
    )
    f = tmp_path / "config.resolved.toml"
    f.write_text(to_toml(out))
    again = load_config(f)
    assert defaults.resolve(again, log=lambda m: None) is again  # a resume reads the derived values pinned


class _Run:
    def __init__(self, model="smollm2-135m", force=False, steps=40, evals=()):
        self.cfg = load_config(
            overrides=[f"model.name={model}", f"run.force={str(force).lower()}", f"train.steps={steps}"]
        )
        self.logs, self.evals = [], list(evals)
        self.log = self.logs.append
        self.state = type("S", (), {"step": 0})()


def test_probe_stops_on_truncation_unless_forced():
    line = {"length/truncated_frac": 0.75, "reward/mean": 0.0}
    with pytest.raises(UserError, match="sampling.max_new_tokens") as e:
        defaults.probe(_Run(), line, 1.0)
    assert "run.force=true" in str(e.value)
    run = _Run(force=True)
    defaults.probe(run, line, 1.0)
    assert any("sampling.max_new_tokens" in m for m in run.logs)
    tiny = _Run(model="tiny")  # the tiny profile only warns (its untrained weights ramble to the limit)
    defaults.probe(tiny, line, 1.0)
    assert tiny.logs and tiny.logs[0].startswith("warning:")
    defaults.probe(_Run(), {"length/truncated_frac": 0.4}, 1.0)


def test_probe_stops_on_a_budget_past_a_day():
    with pytest.raises(UserError, match="train.steps"):
        defaults.probe(_Run(model="tiny", steps=600), {"length/truncated_frac": 0.0}, 251.0)
    defaults.probe(_Run(model="tiny", steps=600, force=True), {"length/truncated_frac": 0.0}, 251.0)
    defaults.probe(_Run(model="tiny", steps=40), {"length/truncated_frac": 0.0}, 251.0)


def test_probe_warns_on_memorisation():
    run = _Run(model="tiny", evals=[{"step": 0, "eval/pass@1": 0.0}])
    defaults.probe(run, {"length/truncated_frac": 0.0, "reward/mean": 0.93}, 1.0)
    assert any("memorised" in m and "model.warm_start.steps" in m for m in run.logs)


def test_truncation_stop_in_a_run(tmp_path, monkeypatch):
    """A full run stops after step 0 when the profile stops on truncation (tiny model patched to the chat profile)."""
    import rollwise

    monkeypatch.setitem(defaults.PROFILES, "tiny", defaults.Profile("tiny", truncation_stop=True))
    o = tiny_overrides(tmp_path, **{"sampling.max_new_tokens": 1, "model.warm_start.steps": 0})
    with pytest.raises(UserError, match="sampling.max_new_tokens = 1"):
        rollwise.train(load_config(overrides=as_sets(o)), log=lambda m: None)
    o = tiny_overrides(
        tmp_path, name="f", steps=1, **{"sampling.max_new_tokens": 1, "model.warm_start.steps": 0, "run.force": True}
    )
    assert rollwise.train(load_config(overrides=as_sets(o)), log=lambda m: None).steps == 1


def test_shipped_sweeps_keep_their_values():
    """benchmarks/*.toml rely on the schema's defaults for keys they leave unset: none is derived."""
    from pathlib import Path

    from rollwise import components
    from rollwise.bench.sweep import load_sweep, plan

    for f in ("benchmarks/reuse.toml", "benchmarks/regime_smollm2.toml", "benchmarks/arith_quick.toml"):
        spec = plan(load_sweep(Path(__file__).parents[2] / f))[0]
        if spec.cfg.task.name.startswith("reasoning_gym"):
            pytest.importorskip("reasoning_gym")
        assert defaults.derive(spec.cfg, components.build_task(spec.cfg)) == {}, f


def test_arithmetic_with_few_rows_keeps_the_warm_start():
    cfg = load_config(overrides=["task.options.n_train=200"])
    assert defaults.resolve(cfg, log=lambda m: None) is cfg


def test_pretrained_full_fine_tune_gets_a_small_lr(tmp_path):
    p = _jsonl(tmp_path, 20)
    out = defaults.resolve(
        load_config(overrides=[f'task.name="jsonl:{p}"', "model.name=smollm2-135m", "model.lora.enabled=false"]),
        log=lambda m: None,
    )
    assert (out.model.lora.enabled, out.train.lr) == (False, defaults.PRETRAINED_FULL_LR)


NO_PEFT = """
import sys
sys.modules["peft"] = None  # peft unimportable, as where it is not installed: `import peft` raises ImportError
import rollwise
from rollwise import defaults
from rollwise.config import load_config
from rollwise.registry import UserError
try:
    out = defaults.resolve(load_config(overrides=sys.argv[1:]), log=lambda m: None)
except UserError as e:
    print("refused:", e)
else:
    print("trains:", out.model.lora.enabled, out.train.lr)
"""


def _without_peft(overrides) -> str:
    """What ``defaults.resolve`` makes of ``overrides`` in a fresh interpreter where peft cannot be imported."""
    src = str(Path(rollwise.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", NO_PEFT, *overrides], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_pretrained_model_without_peft_is_refused_not_fully_fine_tuned(tmp_path):
    """Issue #40: the same TOML trained LoRA at 2e-4 where peft was installed and silently a full
    fine-tune at 1e-6 where it was not; now the second machine refuses, naming the key and the fix."""
    overrides = [f'task.name="jsonl:{_jsonl(tmp_path, 20)}"', "model.name=smollm2-135m"]
    with_peft = defaults.resolve(load_config(overrides=overrides), log=lambda m: None)
    assert (with_peft.model.lora.enabled, with_peft.train.lr) == (True, 2e-4)
    out = _without_peft(overrides)
    assert out.startswith("refused:") and "model.lora.enabled" in out, out
    assert "pip install 'rollwise[hf]'" in out and "model.lora.enabled = false" in out
    # an explicit full fine-tune needs no peft, and is the same run on either machine
    assert _without_peft([*overrides, "model.lora.enabled=false"]) == f"trains: False {defaults.PRETRAINED_FULL_LR}"


def test_an_environment_task_derives_from_its_demonstrated_actions():
    """calculator: the references are the demonstrated turns (a '<calc>...</calc>' call, then the number),
    not a single completion: max_new_tokens bounds a turn (rollwise.envs.base)."""
    from rollwise import tasks
    from rollwise.types import reference_completions

    cfg = load_config(overrides=['task.name="calculator"', "task.options={n_train=40, n_heldout=4}"])
    refs, what = reference_completions(tasks.build(cfg), 8, episodes=True)
    assert what == "demonstrated actions" and len(refs) == 16  # 8 demonstrations x (call, answer)
    assert all(r.startswith("<calc>") for r in refs[::2]) and all(r.lstrip("-").isdigit() for r in refs[1::2])
    out = defaults.resolve(cfg, log=lambda m: None)
    assert out.sampling.max_new_tokens >= max(len(r) for r in defaults.references(tasks.build(cfg), episodes=True)) + 1
