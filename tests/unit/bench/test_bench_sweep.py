"""Sweep files: format, validation before any run, the runs they plan (rollwise.bench.sweep)."""

from pathlib import Path

import pytest

from conftest import skip_without_judge_runs
from rollwise.bench.sweep import flatten, load_sweep, plan
from rollwise.registry import UserError

EXAMPLE = Path(__file__).resolve().parents[3] / "benchmarks" / "example_sweep.toml"

MINIMAL = """
seeds = [0, 1]
budget = { rollouts = 64 }
[base]
"model.name" = "tiny-s"
"train.steps" = 100
[[arms]]
name = "a"
[[arms]]
name = "b"
set = { "filter.names" = ["zero_variance"] }
"""


def _write(tmp_path, text, name="s.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_example_sweep_plans_every_arm_and_seed(tmp_path):
    sweep = load_sweep(EXAMPLE)
    assert sweep.sweep_name() == "example" and sweep.baseline_arm == "grpo"
    specs = plan(sweep, tmp_path / "out")
    # seed-major: a sweep stopped part-way leaves whole seeds, paired across arms
    assert [s.name for s in specs] == ["grpo-s0", "dapo-refill-s0", "grpo-s1", "dapo-refill-s1"]
    for s in specs:
        assert s.dir == tmp_path / "out" / s.name
        assert s.cfg.run.seed == s.seed and s.cfg.train.budget_generated_tokens == 400
        assert s.cfg.train.budget_rollouts is None and s.cfg.model.name == "tiny-s"
    assert specs[1].cfg.filter.names == ["zero_variance"] and specs[1].cfg.control.dynamic_sampling.enabled
    assert specs[0].cfg.filter.names == []


def test_defaults_and_base_file(tmp_path):
    (tmp_path / "cfgs").mkdir()
    (tmp_path / "cfgs" / "base.toml").write_text(
        '[model]\nname = "tiny-s"\n[train]\nsteps = 7\nbudget_rollouts = 5\n[run]\nname = "ignored"\nseed = 9\n'
    )
    p = _write(tmp_path, 'base = "cfgs/base.toml"\nbudget = { generated_tokens = 100 }\n[[arms]]\nname = "only"\n')
    sweep = load_sweep(p, ["train.lr=0.001"])  # a --set joins the sweep's set
    assert sweep.default_out_dir() == Path("runs/compare/s") and sweep.seeds == [0] and sweep.baseline_arm == "only"
    (spec,) = plan(sweep)
    cfg = spec.cfg
    assert cfg.train.steps == 7 and cfg.train.lr == 0.001
    # the base file's run name/seed and budget are replaced by the sweep's
    assert cfg.run.name == "only-s0" and cfg.run.seed == 0 and cfg.run.dir == "runs/compare/s"
    assert cfg.train.budget_generated_tokens == 100 and cfg.train.budget_rollouts is None


def test_flatten_keeps_options_tables_whole():
    table = {"control": {"name": "uniform", "options": {"k": {"a": 1}}}, "filter.names": ["x"], "train": {"lr": 1.0}}
    assert flatten(table) == {
        "control.name": "uniform",
        "control.options": {"k": {"a": 1}},
        "filter.names": ["x"],
        "train.lr": 1.0,
    }


BAD_FILES = [
    ("unknown top-level key", MINIMAL.replace("seeds =", "seedz ="), "seedz"),
    ("unknown arm key", MINIMAL.replace('name = "b"\nset', 'name = "b"\nsett'), "arms.1.sett"),
    ("two budgets", MINIMAL.replace("{ rollouts = 64 }", "{ rollouts = 64, generated_tokens = 9 }"), "exactly one"),
    ("no budget", MINIMAL.replace("budget = { rollouts = 64 }\n", ""), "budget"),
    ("unknown budget unit", MINIMAL.replace("rollouts = 64", "steps = 64"), "budget.steps"),
    ("baseline not an arm", "baseline = 'zz'\n" + MINIMAL, "baseline 'zz'"),
    ("repeated arm", MINIMAL.replace('name = "b"', 'name = "a"'), "repeated"),
    ("bad arm name", MINIMAL.replace('name = "b"', 'name = "b/c"'), "arms.1.name"),
    ("repeated seed", MINIMAL.replace("[0, 1]", "[1, 1]"), "seeds"),
    ("not TOML", "arms = [", "not valid TOML"),
    ("target above 1", "target = 1.5\n" + MINIMAL, "target: Value error, an absolute target is a held-out pass@1"),
    ("gain fraction above 1", "target = 'gain:1.5'\n" + MINIMAL, "target: Value error, 'gain:F' takes a fraction"),
    ("gain fraction not a number", "target = 'gain:most'\n" + MINIMAL, "target: Value error, 'gain:F'"),
    ("target neither form", "target = 'final'\n" + MINIMAL, "target: Value error, target must be"),
]


@pytest.mark.parametrize(
    "line, rule", [("", "gain:0.75"), ("target = 'gain:0.50'\n", "gain:0.5"), ("target = 0.4\n", 0.4)]
)
def test_the_target_rule_is_read_at_load_with_gain_0_75_by_default(tmp_path, line, rule):
    assert load_sweep(_write(tmp_path, line + MINIMAL)).target == rule


@pytest.mark.parametrize("label, text, needle", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_sweep_files_fail_naming_the_key(tmp_path, label, text, needle):
    with pytest.raises(UserError) as e:
        load_sweep(_write(tmp_path, text))
    assert needle in str(e.value)


BAD_PLANS = [
    (
        "unknown config key in an arm",
        MINIMAL.replace('"filter.names" = ["zero_variance"]', '"train.stepz" = 3'),
        ["arm 'b'", "train.stepz"],
    ),
    (
        "unknown strategy in an arm",
        MINIMAL.replace('"filter.names" = ["zero_variance"]', '"control.name" = "nope"'),
        ["arm 'b'", "nope"],
    ),
    ("bad value in the base", MINIMAL.replace('"train.steps" = 100', '"train.steps" = -1'), ["train.steps"]),
    (
        "runner-owned key",
        MINIMAL.replace('"filter.names" = ["zero_variance"]', '"run.seed" = 3'),
        ["run.seed", "set by rollwise compare"],
    ),
    (
        "budget in an arm",
        MINIMAL.replace('"filter.names" = ["zero_variance"]', '"train.budget_rollouts" = 3'),
        ["train.budget_rollouts"],
    ),
    (
        "arms evaluated differently",
        MINIMAL.replace('"filter.names" = ["zero_variance"]', '"eval.samples" = 8'),
        ["eval.samples"],
    ),
    (
        "no eval at step 0",
        MINIMAL.replace('"train.steps" = 100', '"train.steps" = 100\n"eval.at_start" = false'),
        ["eval.at_start"],
    ),
    (
        "arms with different warm starts (their seeds would not be paired)",
        MINIMAL.replace('"filter.names" = ["zero_variance"]', '"model.warm_start.steps" = 10'),
        ["arms 'a' and 'b' differ in model.warm_start.steps", "share its warm start"],
    ),
    (
        "arms with different models",
        MINIMAL.replace('"filter.names" = ["zero_variance"]', '"model.name" = "tiny-m"'),
        ["differ in model.name"],
    ),
    (
        "missing base file",
        'base = "nope.toml"\n' + MINIMAL.replace('[base]\n"model.name" = "tiny-s"\n"train.steps" = 100\n', ""),
        ["nope.toml"],
    ),
]


@pytest.mark.parametrize("label, text, needles", BAD_PLANS, ids=[b[0] for b in BAD_PLANS])
def test_bad_arms_fail_before_any_run(tmp_path, monkeypatch, label, text, needles):
    from rollwise import components

    monkeypatch.setattr(components, "build_policy", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(UserError) as e:
        plan(load_sweep(_write(tmp_path, text)), tmp_path / "out")
    for needle in needles:
        assert needle in str(e.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).resolve().parents[3] / "benchmarks").glob("*.toml")), ids=lambda p: p.stem
)
def test_every_shipped_sweep_validates(path):
    # every arm x seed config of the committed presets loads (names, options, refused combinations)
    skip_without_judge_runs(path)
    sweep = load_sweep(path)
    assert len(plan(sweep)) == len(sweep.arms) * len(sweep.seeds)


def test_arms_may_differ_in_the_task_keys_that_shape_training_episodes_only(tmp_path):
    """task.cleaner, task.semi_online and task.turn_budget change the training episodes, never the prompts
    or the evaluation, so arms may differ in them (benchmarks/episodes_repair.toml); other task keys not."""
    base = MINIMAL.replace('"model.name" = "tiny-s"', '"model.name" = "tiny-s"\n"task.name" = "calculator"')
    for key in ("task.cleaner.enabled", "task.semi_online.enabled", "task.turn_budget.enabled"):
        text = base.replace('"filter.names" = ["zero_variance"]', f'"{key}" = true')
        assert len(plan(load_sweep(_write(tmp_path, text)), tmp_path / "out")) == 4
    # DART's keys (benchmarks/episodes_dart.toml): when episodes run and which turns train, not what is verified
    dart = '"task.env_slots" = 4, "task.episode_schedule" = "rollout_wise", "task.high_entropy_turns" = 0.5'
    text = base.replace('"filter.names" = ["zero_variance"]', dart)
    assert len(plan(load_sweep(_write(tmp_path, text)), tmp_path / "out")) == 4
    text = base.replace('"filter.names" = ["zero_variance"]', '"task.max_turns" = 2')
    with pytest.raises(UserError, match=r"differ in task\.max_turns"):
        plan(load_sweep(_write(tmp_path, text)), tmp_path / "out")
