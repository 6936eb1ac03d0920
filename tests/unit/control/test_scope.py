"""SCOPE [RECON] (guidance.md §4.4): step-wise rectification of near-miss rollouts with the
reference solution as guide."""

from __future__ import annotations

from rollwise.config import load_config
from rollwise.control.scope import SCOPE, Options, steps_of
from rollwise.types import Group, Prompt, Rollout, Services, Verdict

REF = "7+5+0=12,4+8+1=13,=132"  # 47+85 as the built-in cot trace


class _Tok:
    eos_token_id = 0


class _Codec:  # one character per token, EOS = 0
    tokenizer = _Tok()

    def decode(self, ids):
        return "".join(chr(i) for i in ids if i != 0)

    def encode_text(self, text):
        return [ord(c) for c in text]


class _Task:
    name = "t"

    def target(self, prompt):
        return REF

    def verify(self, prompt, text):
        return Verdict(1.0 if text.rsplit("=", 1)[-1] == prompt.answer else 0.0)


P = Prompt("a", "t", "47+85=", "132")


def _r(text, score):
    ids = tuple(ord(c) for c in text) + (0,)
    return Rollout("a", (1,), ids, tuple(-0.1 for _ in ids), "stop", 5, text, Verdict(score))


def _scope(**opts):
    cfg = load_config(
        overrides=["control.name=scope", "control.prompts_per_step=1", "control.rollouts_per_prompt=3"]
    ).control
    c = SCOPE([P], cfg, Options(**opts), seed=0)
    c.bind(Services(_Task(), _Codec()))
    return c


def test_steps_of():
    assert steps_of(REF) == ["7+5+0=12,", "4+8+1=13,", "=132"]


def test_rectified_rollout_keeps_the_prefix_and_takes_the_guide_suffix():
    c = _scope(kappa=0.3)
    bad = _r("7+5+0=12,4+8+1=14,=142", 0.0)  # first false equation: step 1 (of 3) -> 1/3 >= 0.3
    fixed, why, j = c.rectify(P, bad)
    assert why == "rectified" and j == 9
    assert fixed.completion_ids[:9] == bad.completion_ids[:9]  # exactly the prefix before k*
    assert fixed.text == REF and fixed.reward == 1.0
    assert fixed.logprobs[:9] == bad.logprobs[:9] and set(fixed.logprobs[9:]) == {
        0.0
    }  # prefix: sampler; suffix: guide (p = 1)
    assert fixed.token_versions == (5,) * len(fixed.completion_ids)


def test_first_error_gate_and_successes():
    c = _scope(kappa=0.5)
    assert c.rectify(P, _r("7+5+0=12,4+8+1=14,=142", 0.0))[1] == "gated"  # 1/3 < 0.5
    assert c.rectify(P, _r("7+5+0=11,4+8+1=14,=142", 0.0))[1] == "gated"  # k* = 0 (the first error, not the later one)
    assert c.rectify(P, _r("132", 0.0))[1] == "no_error"
    c1 = _scope(kappa=1.0)  # kappa = 1: never (plain GRPO)
    assert c1.rectify(P, _r("7+5+0=12,4+8+1=13,=142,", 0.0))[1] in ("gated", "no_error")


def test_replace_keeps_group_size_and_append_adds():
    good, bad = _r(REF, 1.0), _r("7+5+0=12,4+8+1=14,=142", 0.0)
    g = Group(P, (good, bad, bad))
    out = _scope(kappa=0.3).finish_batch([g], [g], {})[0]
    assert out.size == 3 and [r.reward for r in out.rollouts] == [1.0, 1.0, 1.0]
    c = _scope(kappa=0.3, mode="append", mask_prefix=True)
    out = c.finish_batch([g], [g], {})[0]
    assert out.size == 5 and c.metrics["control/scope_rectified"] == 2.0
    assert out.rollouts[1].loss_mask[:9] == (0,) * 9 and out.rollouts[3].loss_mask[:9] == (0,) * 9
    assert out.rollouts[0].loss_mask is None


def test_successes_are_untouched():
    g = Group(P, (_r(REF, 1.0),))
    c = _scope(kappa=0.0)
    assert c.finish_batch([g], [g], {})[0] == g and c.metrics["control/scope_candidates"] == 0.0
