"""GDRO, MSSR, GDPO and TTRL (with ETTRL / ECHO) through the real loop: a scripted backend fixes
every rollout's answer, the tiny model trains (issue #15)."""

import json

import pytest

import rollwise
from conftest import as_sets, scripted_arithmetic, tiny_overrides
from rollwise.config import load_config


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def run(tmp_path, name, schedule=lambda i: i % 2 == 0, **extra):
    o = tiny_overrides(tmp_path, name=name, **{"eval.at_start": False, **extra})
    cfg = load_config(overrides=as_sets(o))
    res = rollwise.train(cfg, backend=scripted_arithmetic(schedule), log=lambda m: None)
    return lines(res.run_dir / "metrics.jsonl")


SMALL = {"n_train": 8, "n_heldout": 8}  # 4 prompts per step: every prompt is revisited from step 2 on


def test_gdro_prompt_and_rollout_resume_exactly(tmp_path):
    opts = {
        "task.options": SMALL,
        "control.name": "gdro",
        "run.checkpoint_every": 2,
        "control.options": {
            "rollout_gdro": True,
            "allocation": "soft",
            "n_min": 2,
            "n_max": 6,
            "edges": [0.5],
            "hysteresis": 0.0,
        },
    }
    full = run(tmp_path, "full", steps=4, **opts)
    assert all(
        2 * 4 <= m["cost/rollouts"] - (full[i - 1]["cost/rollouts"] if i else 0) <= 6 * 4 for i, m in enumerate(full)
    )
    assert all("control/gdro_mu" in m and "control/gdro_loss_mean" in m for m in full)
    assert full[-1]["control/gdro_bins"] >= 1
    run(tmp_path, "part", steps=2, **opts)
    resumed = rollwise.train(
        load_config(
            tmp_path / "part" / "config.resolved.toml", [f"run.dir={tmp_path}", "run.name=part", "train.steps=4"]
        ),
        resume=True,
        backend=scripted_arithmetic(lambda i: i % 2 == 0),
        log=lambda m: None,
    )
    again = lines(resumed.run_dir / "metrics.jsonl")
    keys = ("cost/rollouts", "control/gdro_mu", "control/gdro_n_mean")
    assert [[m[k] for k in keys] for m in again] == [[m[k] for k in keys] for m in full]


def test_gdro_refuses_d3s():
    from rollwise.registry import UserError

    with pytest.raises(UserError, match="d3s"):
        load_config(overrides=["control.name=gdro", "batch.d3s.enabled=true"])


def test_mssr_single_rollout_steps_log_rho_from_the_kl(tmp_path):
    m = run(
        tmp_path,
        "mssr",
        steps=2,
        **{
            "control.name": "mssr",
            "advantage.name": "mssr",
            "control.rollouts_per_prompt": 1,
            "control.prompts_per_step": 8,
            "objective.options": {"kl_coef": 0.01},
        },
    )
    assert [x["cost/rollouts"] for x in m] == [8, 16]
    assert m[0]["control/mssr_rho"] == pytest.approx((0.875 + 0.96) / 2)  # no KL recorded before step 0
    assert "train/kl" in m[0] and m[1]["control/mssr_kl"] == pytest.approx(m[0]["train/kl"])


def test_mssr_needs_its_advantage():
    from rollwise.registry import UserError

    with pytest.raises(UserError, match="advantage.name = 'mssr'"):
        load_config(overrides=["control.name=mssr"])


def test_gdpo_logs_each_named_reward(tmp_path):
    m = run(
        tmp_path, "gdpo", steps=1, **{"task.options": {**SMALL, "second_reward": "format"}, "advantage.name": "gdpo"}
    )
    assert all(
        x["reward/correct"] == pytest.approx(0.5) and x["reward/format"] == 1.0 for x in m
    )  # wrong answers are well formed
    assert all(x["reward/mean"] == pytest.approx(0.5) for x in m)  # the score stays correctness


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"advantage.name": "ettrl", "advantage.options": {"entropy": "surprisal"}},
        {"advantage.name": "echo", "objective.name": "echo", "advantage.options": {"entropy": "surprisal"}},
    ],
)
def test_ttrl_trains_on_the_majority_answer(tmp_path, extra):
    # one right answer in four: the majority (3 of 4) is the wrong answer sum + 1
    m = run(tmp_path, "ttrl", schedule=lambda i: i % 4 == 0, steps=1, **{"reward.ttrl.enabled": True, **extra})
    assert all(x["ttrl/label_acc"] == 0.0 and x["ttrl/majority_ratio"] == 0.75 for x in m)
    assert all(x["reward/mean"] == pytest.approx(0.75) for x in m)  # agreement with the (wrong) majority
    assert all(x["ttrl/reward_acc"] == 0.0 and x["ttrl/gt_ratio"] == 0.25 for x in m)
