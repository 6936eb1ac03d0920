"""Multi-turn episodes end to end (issue #30, docs/architecture.md §11): guess_number on the tiny
model with checkpoint and resume, the ledger's episodes/* fields, request seeds, and single-turn
runs untouched by the episode pool."""

import json

import pytest

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.config import load_config
from rollwise.registry import UserError

TIMINGS = ("wall_s", "time/", "episodes/tool_s", "episodes/env_s", "episodes/waiting_s")


def guess(tmp_path, **extra):
    return tiny_overrides(
        tmp_path,
        steps=4,
        **{
            "task.name": "guess_number",
            "task.options": {"n_train": 64, "n_heldout": 8},
            "task.max_turns": 5,
            "sampling.max_new_tokens": 4,
            "control.prompts_per_step": 2,
            "eval.n_prompts": 4,
            "eval.every": 2,
            "run.checkpoint_every": 2,
            "model.warm_start.steps": 30,
            **extra,
        },
    )


def stable(path):
    return [
        {k: v for k, v in json.loads(x).items() if not k.startswith(TIMINGS)} for x in path.read_text().splitlines()
    ]


def test_guess_number_trains_and_resume_matches_uninterrupted(tmp_path, trained):
    base = guess(tmp_path)
    full = trained(base)  # the uninterrupted run, shared with the asynchronous test's synchronous one
    part = dict(base, **{"run.name": "part", "train.steps": 2})
    rollwise.train(load_config(overrides=as_sets(part)), log=lambda m: None)
    resumed = rollwise.train(
        load_config(overrides=as_sets(dict(part, **{"train.steps": 4}))), resume=True, log=lambda m: None
    )
    a, b = stable(full / "metrics.jsonl"), stable(resumed.run_dir / "metrics.jsonl")
    assert len(a) == 4 and a == b
    assert stable(full / "eval.jsonl") == stable(resumed.run_dir / "eval.jsonl")
    assert (full / "checkpoints" / "step-4" / "model.safetensors").exists()
    for m in a:  # 2 prompts x 4 episodes a step, 1..5 turns each; observations never count as generated
        assert m["episodes/count"] == 8 and 8 <= m["episodes/turns"] <= 40
        assert m["episodes/observation_tokens"] > 0 and m["episodes/tool_calls"] == 0
        assert sum(v for k, v in m.items() if k.startswith("episodes/end_")) == 8
        assert 0.0 <= m["reward/mean"] <= 1.0
    line = json.loads((full / "metrics.jsonl").read_text().splitlines()[0])
    assert {"episodes/tool_s", "episodes/waiting_s", "episodes/env_s"} <= set(line)
    assert a[-1]["cost/generated_tokens"] == a[-1]["cost/trained_tokens"]  # every policy token trained, no observation


def test_guess_number_with_request_seeds(tmp_path):
    o = guess(
        tmp_path, **{"distributed.request_seeds": True, "train.steps": 1, "eval.every": 0, "eval.at_start": False}
    )
    res = rollwise.train(load_config(overrides=as_sets(o)), log=lambda m: None)
    [m] = stable(res.run_dir / "metrics.jsonl")
    assert m["episodes/count"] == 8


def test_single_turn_runs_keep_the_local_pool_and_their_ledger_lines(tmp_path, monkeypatch):
    """The default arithmetic task: LocalPool, rollouts without episodes or masks, no episodes/* keys.
    (Bit-identity with the code before the episode pool was checked once against commit b2d2414:
    identical metrics, evaluations and step-3 checkpoint hash; see the ep-core branch's report.)"""
    from rollwise import components
    from rollwise.distributed.local import LocalPool

    pools, real = [], components.build_pool

    def spy(*a, **k):
        pools.append(real(*a, **k))
        return pools[-1]

    monkeypatch.setattr(components, "build_pool", spy)
    cfg = load_config(overrides=as_sets(tiny_overrides(tmp_path, steps=1, **{"eval.at_start": False})))
    res = rollwise.train(cfg, log=lambda m: None)
    assert type(pools[0]) is LocalPool
    [m] = stable(res.run_dir / "metrics.jsonl")
    assert not any(k.startswith("episodes/") for k in m)


def test_episode_keys_on_a_single_turn_task_are_refused(tmp_path):
    cfg = load_config(overrides=as_sets(tiny_overrides(tmp_path, steps=1, **{"task.max_turns": 3})))
    with pytest.raises(UserError, match="task.max_turns applies to environment tasks"):
        rollwise.train(cfg, log=lambda m: None)
    assert not (tmp_path / "t").exists()  # refused before anything is written


KILL_CHILD = r"""
import os, signal, sys
from pathlib import Path
metrics, calls = Path(os.environ["ROLLWISE_TEST_RUN"]) / "metrics.jsonl", [0]
from rollwise.envs.guess import GuessEnv
real = GuessEnv.step
def step(self, action):
    if os.environ.get("ROLLWISE_TEST_KILL") and metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
        calls[0] += 1
        if calls[0] == 5:  # mid-episode-batch: step 2's episodes, some stepped, others not yet
            os.kill(os.getpid(), signal.SIGKILL)
    return real(self, action)
GuessEnv.step = step
from rollwise.cli import main
main(sys.argv[1:])
"""


def test_a_run_killed_mid_episode_batch_resumes_to_the_uninterrupted_result(tmp_path):
    """SIGKILL inside an environment step of training step 2's episodes (a real kill of a child
    process), then ``--resume``: the run ends with the uninterrupted run's metrics and evaluations
    (step 2's episodes are generated again from the step-1 checkpoint's state)."""
    import os
    import signal
    import subprocess
    import sys

    base = guess(tmp_path, **{"run.checkpoint_every": 1, "eval.every": 4})  # evaluations at steps 0 and 4 only
    sets = lambda o: sum((["--set", s] for s in as_sets(o)), [])  # noqa: E731

    def launch(args, name, kill):
        env = dict(os.environ, ROLLWISE_TEST_RUN=str(tmp_path / name), ROLLWISE_TEST_KILL="1" if kill else "")
        return subprocess.run([sys.executable, "-c", KILL_CHILD, *args], env=env, capture_output=True, timeout=600)

    full = launch(["train", *sets(dict(base, **{"run.name": "full"}))], "full", False)
    assert full.returncode == 0, full.stderr.decode()[-3000:]
    killed = launch(["train", *sets(dict(base, **{"run.name": "killed"}))], "killed", True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-3000:]
    assert len((tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()) == 2  # steps 0 and 1 only
    resumed = launch(["train", "--resume", str(tmp_path / "killed")], "killed", False)
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    assert stable(tmp_path / "killed" / "metrics.jsonl") == stable(tmp_path / "full" / "metrics.jsonl")
    assert stable(tmp_path / "killed" / "eval.jsonl") == stable(tmp_path / "full" / "eval.jsonl")


def test_async_episodes_at_eta_zero_equal_the_synchronous_run_and_run_ahead_at_eta_one(tmp_path, trained):
    """train.async's generator runs the episode pool over its own weights: at max_staleness 0 the run is
    the synchronous one (the generator's utilisation lines aside); at 1, with decoupled PPO, plans of
    episodes run one version ahead. Stopping plans mid-generation is refused for episodes."""
    sync = trained(guess(tmp_path))  # the synchronous run, shared with the resume test's uninterrupted one
    eta0 = guess(tmp_path, **{"run.name": "eta0", "train.async.enabled": True, "train.async.max_staleness": 0})
    eta0 = rollwise.train(load_config(overrides=as_sets(eta0)), log=lambda m: None)
    skip = lambda lines: [{k: v for k, v in m.items() if not k.startswith(("util/", "async/"))} for m in lines]  # noqa: E731
    assert skip(stable(eta0.run_dir / "metrics.jsonl")) == skip(stable(sync / "metrics.jsonl"))
    eta1 = guess(
        tmp_path,
        **{
            "run.name": "eta1",
            "train.async.enabled": True,
            "train.async.max_staleness": 1,
            "objective.name": "decoupled_ppo",
        },
    )
    lines = stable(rollwise.train(load_config(overrides=as_sets(eta1)), log=lambda m: None).run_dir / "metrics.jsonl")
    assert len(lines) == 4 and all(m["episodes/count"] == 8 for m in lines)
    assert any(m.get("async/staleness_1", 0) > 0 for m in lines[1:])  # episodes of the version before trained
    with pytest.raises(UserError, match="on_new_weights"):
        load_config(overrides=as_sets(dict(eta1, **{"train.async.on_new_weights": "interrupt"})))


# Controllers that need more than a control.name to run: the option (or sections) that let them.
NEEDS = {
    "wise2": {"value.enabled": True},
    "mssr": {"advantage.name": "mssr"},
    "cog_rethinker": {"advantage.name": "cog_rethinker"},
    "speed": {"filter.names": ["speed_complete"], "control.rollouts_per_prompt": 8},
    "wise": {"filter.names": ["speed_complete"], "control.rollouts_per_prompt": 8},
}
# Controllers refused for what the environment task lacks, not for episodes as such (message fragment).
LACKS = {"scope": "needs reference solutions"}


@pytest.mark.parametrize("name", __import__("rollwise.control", fromlist=["REGISTRY"]).REGISTRY.names())
def test_every_controller_runs_on_episodes_or_is_refused_at_load(tmp_path, name):
    """A group is the episodes of one prompt: every registered controller trains 2 steps of guess_number
    (its per-prompt statistics, rounds and budget on episode rewards), or is refused when the config
    loads, naming the episodes (those that continue prefixes of single completions)."""
    o = guess(
        tmp_path,
        **{
            "run.name": name,
            "train.steps": 2,
            "control.name": name,
            "model.warm_start.steps": 10,
            "eval.every": 0,
            "run.checkpoint_every": 0,
            **NEEDS.get(name, {}),
        },
    )
    try:
        cfg = load_config(overrides=as_sets(o))
    except UserError as e:
        assert "multi-turn episodes" in str(e) and name in str(e)
        return
    if name in LACKS:
        with pytest.raises(UserError, match=LACKS[name]):
            rollwise.train(cfg, log=lambda m: None)
        return
    res = rollwise.train(cfg, log=lambda m: None)
    lines = stable(res.run_dir / "metrics.jsonl")
    assert len(lines) == 2 and all(m["episodes/count"] >= 1 for m in lines)


ENV_TASKS = {
    "calculator": {"task.options": {"n_train": 32, "n_heldout": 4}, "sampling.max_new_tokens": 24},
    "python_math": {"task.options": {"n_train": 16, "n_heldout": 4}, "sampling.max_new_tokens": 48},
    "frozenlake": {"task.options": {"n_train": 16, "n_heldout": 4}, "sampling.max_new_tokens": 4},
    "multi_attempt": {
        "task.options": {"max_attempts": 3},
        "task.options.inner_options": {"n_train": 32, "n_heldout": 4},
    },
}


@pytest.mark.parametrize("name", sorted(ENV_TASKS))
def test_each_built_in_environment_trains_in_the_loop(tmp_path, name):
    """Each built-in environment task (rollwise.envs) warm-starts on its demonstrations and trains
    2 steps of episodes on the tiny model, with the episode ledger fields (5 warm-start steps teach no
    format: whether tools get called is measured in benchmarks/episodes_*.toml, not here)."""
    if name == "frozenlake":
        pytest.importorskip("gymnasium")
    o = guess(
        tmp_path,
        **{
            "run.name": name,
            "task.name": name,
            "task.max_turns": 3,
            "train.steps": 2,
            "model.warm_start.steps": 5,
            "model.warm_start.batch_size": 4,
            "eval.every": 0,
            "run.checkpoint_every": 0,
            **ENV_TASKS[name],
        },
    )
    res = rollwise.train(load_config(overrides=as_sets(o)), log=lambda m: None)
    lines = stable(res.run_dir / "metrics.jsonl")
    assert len(lines) == 2 and all(m["episodes/count"] == 8 and m["episodes/turns"] >= 8 for m in lines)
    assert all(sum(v for k, v in m.items() if k.startswith("episodes/end_")) == 8 for m in lines)


def test_a_textarena_game_trains_in_the_loop(tmp_path):
    """textarena:<env_id> (rollwise.envs.textarena_env) trains 2 steps of episodes on the tiny model; the warm start
    the tiny model asks for is skipped, said so (the adapter has no demonstrations: the README's line crashed on an
    empty example list); short instructions fit the tiny model's context."""
    pytest.importorskip("textarena")
    o = guess(
        tmp_path,
        **{
            "run.name": "textarena",
            "task.name": "textarena:GuessTheNumber-v0",
            "task.options": {"n_train": 8, "n_heldout": 2, "instructions": "guess 1-20 [n]:"},
            "task.max_turns": 3,
            "train.steps": 2,
            "model.warm_start.steps": 5,
            "eval.every": 0,
            "run.checkpoint_every": 0,
        },
    )
    logs = []
    res = rollwise.train(load_config(overrides=as_sets(o)), log=logs.append)
    assert "warm start: skipped" in logs and any("no reference completions or demonstrations" in m for m in logs)
    lines = stable(res.run_dir / "metrics.jsonl")
    assert len(lines) == 2 and all(m["episodes/count"] == 8 and m["episodes/turns"] >= 8 for m in lines)
    assert all(sum(v for k, v in m.items() if k.startswith("episodes/end_")) == 8 for m in lines)
