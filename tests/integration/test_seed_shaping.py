"""FAPO, ACE, uniqueness, MinPRO, R3L, ADHint, SCOPE and V0.5 through the real loop (issue #15,
items 5-6): a scripted backend writes every completion (answers or chain-of-thought traces, some
flawed, some wrong), the tiny model trains, and each method's metrics show it acted."""

import json

import pytest

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.config import load_config
from rollwise.tasks.arithmetic import trace


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def _expr(text):
    """'12+34=' -> (12, '+', 34)."""
    left = text.split("=", 1)[0]
    op = "-" if "-" in left else "+"
    a, b = left.split(op)
    return (int(a), op, int(b))


def scripted(cot, kinds):
    """Call i writes ``kinds(i)``: 'right', 'flawed' (a false first step, right answer), 'late' (true first
    step, false second step, wrong answer) or 'wrong'; it continues any prefix (hint, retry) it is given."""
    from rollwise.backends.scripted import ScriptedBackend
    from rollwise.trainer.tiny import char_tokenizer

    tok = char_tokenizer()

    def respond(seq, i):
        text = tok.decode(seq, skip_special_tokens=True)
        prompt, _, done = text.partition("=")
        e = _expr(prompt + "=")
        ans = e[0] + e[2] if e[1] == "+" else e[0] - e[2]
        kind = kinds(i)
        if not cot:
            out = str(ans if kind == "right" else ans + 1)
        else:
            steps = trace(e).split(",")
            if kind == "flawed":
                steps[0] = steps[0].split("=")[0] + "=99"
            elif kind == "late" and len(steps) > 2:
                steps[1] = steps[1].split("=")[0] + "=99"
                steps[-1] = f"={ans + 1}"
            elif kind != "right":
                steps[-1] = f"={ans + 1}"
            out = ",".join(steps)
        rest = out[len(done) :] if out.startswith(done) else out
        return tok.encode(rest)

    return ScriptedBackend(respond, tok.eos_token_id)


def run(tmp_path, name, backend, steps=2, **extra):
    o = tiny_overrides(tmp_path, name=name, steps=steps, **{"eval.at_start": False, **extra})
    res = rollwise.train(load_config(overrides=as_sets(o)), backend=backend, log=lambda m: None)
    return lines(res.run_dir / "metrics.jsonl")


COT = {"task.options": {"n_train": 200, "n_heldout": 20, "cot": True}, "sampling.max_new_tokens": 40}
CYCLE = ["right", "flawed", "late", "wrong"]


def test_fapo_penalises_flawed_positives_in_the_loop(tmp_path):
    m = run(tmp_path, "fapo", scripted(True, lambda i: CYCLE[i % 4]), **COT, **{"reward.fapo.enabled": True})
    # every other correct rollout is flawed: half the checked rows; a quarter of all rows lose 0.5
    assert all(x["fapo/flawed_frac"] == pytest.approx(0.5) for x in m)
    assert all(x["reward/shaped_mean"] == pytest.approx(x["reward/mean"] - 0.125) for x in m)


@pytest.mark.parametrize("adv", ["ace", "uniqueness", "r3l"])
def test_shaped_advantages_train(tmp_path, adv):
    extra = {"objective.name": "opmd"} if adv == "r3l" else {}
    m = run(tmp_path, adv, scripted(True, lambda i: CYCLE[i % 4]), **COT, **{"advantage.name": adv, **extra})
    assert len(m) == 2 and all(x["train/grad_norm"] > 0 for x in m)


def test_minpro_second_epoch_damps(tmp_path):
    m = run(
        tmp_path,
        "minpro",
        scripted(False, lambda i: "right" if i % 2 else "wrong"),
        **{"objective.name": "minpro", "train.epochs": 2},
    )
    assert all("train/minpro_damped_frac" in x for x in m)


def test_r3l_retries_from_the_pivot(tmp_path):
    # base rollouts alternate right / late (false second step); every retry continues and is right
    m = run(
        tmp_path,
        "r3l",
        scripted(True, lambda i: "late" if i % 2 else "right"),
        **COT,
        **{"control.name": "r3l", "advantage.name": "r3l", "objective.name": "opmd"},
    )
    assert all(x["control/r3l_retries"] > 0 and x["control/r3l_pivot_mean"] == 1.0 for x in m)
    assert all(x["control/rounds"] == 2 for x in m)


def test_scope_rectifies_late_errors(tmp_path):
    m = run(
        tmp_path,
        "scope",
        scripted(True, lambda i: "late" if i % 2 else "right"),
        **COT,
        **{"control.name": "scope", "control.options": {"kappa": 0.3}},
    )
    assert all(x["control/scope_rectified"] > 0 for x in m)
    # replaced failures: the trained rewards are higher than the generated ones would be
    assert all(x["cost/rollouts"] - (m[i - 1]["cost/rollouts"] if i else 0) == 16 for i, x in enumerate(m))


def test_adhint_hints_hard_prompts(tmp_path):
    m = run(
        tmp_path,
        "adhint",
        scripted(False, lambda i: "wrong" if i % 4 else "right"),
        **{"control.name": "adhint", "advantage.name": "adhint"},
    )
    assert all(x["control/adhint_diff_naive_mean"] > 0.4 and x["control/adhint_hint_ratio_mean"] > 0.3 for x in m)
    assert all(x["control/rounds"] == 2 for x in m)


def test_v05_escalates_when_the_prior_is_off(tmp_path):
    # prior 0.5 at step 0 (no history); all-right groups reject it (z = 2 at n = 4) and get 4 more
    m = run(
        tmp_path,
        "v05",
        scripted(False, lambda i: "right"),
        **{"control.name": "v05", "advantage.name": "v05", "control.options": {"cap": 8}},
    )
    assert m[0]["control/v05_rejected_frac"] == 1.0 and m[0]["control/v05_extra_rollouts"] == 16
    assert m[0]["cost/rollouts"] == 32


def test_adhint_cgm_preset_trains_and_modulates(tmp_path):
    # the preset (configs/adhint_cgm.toml) for two steps; the same scripted completions without CGM give
    # another loss, so the per-token weights reached the objective
    from pathlib import Path

    preset = Path(__file__).parents[2] / "configs" / "adhint_cgm.toml"

    def go(name, cgm):
        extra = {"eval.at_start": False, "advantage.options": {"cgm": cgm}, **COT}
        cfg = load_config(preset, overrides=as_sets(tiny_overrides(tmp_path, name=name, steps=2, **extra)))
        # every group half right: hints of ~40% of the reference trace, and hinted rows that succeed (trained hints)
        backend = scripted(True, lambda i: "wrong" if i % 2 else "right")
        res = rollwise.train(cfg, backend=backend, log=lambda m: None)
        return lines(res.run_dir / "metrics.jsonl")

    on, off = go("cgm", True), go("plain", False)
    assert len(on) == 2 and all(x["train/grad_norm"] > 0 and x["control/adhint_hint_tokens_mean"] > 0 for x in on)
    assert on[0]["train/loss"] != pytest.approx(off[0]["train/loss"], rel=1e-4)


def test_vcpo_preset_trains_with_the_off_policy_baseline(tmp_path):
    # the preset (configs/vcpo.toml: OPOB + ESS learning-rate scaling) for two steps; the same scripted
    # completions under GRPO's mean baseline give another first loss (b* weights rows by w^2 ||g||^2)
    from pathlib import Path

    preset = Path(__file__).parents[2] / "configs" / "vcpo.toml"

    def go(name, adv):
        extra = {"eval.at_start": False, "advantage.name": adv}
        cfg = load_config(preset, overrides=as_sets(tiny_overrides(tmp_path, name=name, steps=2, **extra)))
        res = rollwise.train(cfg, backend=scripted(False, lambda i: CYCLE[i % 3]), log=lambda m: None)
        return lines(res.run_dir / "metrics.jsonl")

    on, off = go("opob", "opob"), go("grpo", "grpo")
    assert len(on) == 2 and all(x["train/grad_norm"] > 0 and 0 < x["train/lr_scale"] <= 1 for x in on)
    assert on[0]["train/loss"] != pytest.approx(off[0]["train/loss"], rel=1e-4)
