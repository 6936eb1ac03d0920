"""The predictor as the run's service (rollwise.value.model): states cached per policy version and
charged once, groups observed as pass rates of their verified rewards, held-out scoring."""

import pytest

from rollwise.backends.hf import HFBackend
from rollwise.tokens import Codec
from rollwise.trainer.tiny import build_tiny
from rollwise.types import Group, Prompt, Rollout, Verdict
from rollwise.value.model import ValueModel


def make(**kw):
    model, tok = build_tiny("tiny-s", seed=0)
    be = HFBackend(model, [tok.eos_token_id], tok.pad_token_id, max_batch=8, seed=0)
    return ValueModel(be, Codec(tok, use_chat=False), model.config.hidden_size, seed=0, **kw)


def group(prompt, rewards):
    rolls = tuple(Rollout(prompt.id, (1,), (1,), (0.0,), "stop", 0, "x", Verdict(r)) for r in rewards)
    return Group(prompt, rolls)


def test_states_cached_per_version_and_charged_once():
    vm = make()
    ps = [Prompt("a", "arithmetic", "1+2=", "3"), Prompt("b", "arithmetic", "33+4=", "37")]
    vm.predict(ps, version=0)
    vm.predict(ps + ps, version=0)  # cached: no new forward
    cost = vm.take_cost()
    assert cost["value/forward_tokens"] == len(vm.codec.encode_prompt(ps[0])) + len(vm.codec.encode_prompt(ps[1]))
    vm.predict(ps[:1], version=1)  # a new policy: computed again
    assert vm.take_cost()["value/forward_tokens"] == len(vm.codec.encode_prompt(ps[0]))


def test_observe_uses_verified_rewards_only_and_evaluate_scores_heldout():
    vm = make(min_fit=2)
    a, b = Prompt("a", "arithmetic", "1+2=", "3"), Prompt("b", "arithmetic", "33+4=", "37")
    vm.observe([group(a, [1.0, 1.0, None, 0.0]), group(b, [None, None])], version=0)
    assert vm.predictor.ids == ["a"] and vm.predictor.rates.tolist() == pytest.approx([2 / 3])
    out = vm.evaluate([a, b], {"a": [True, False], "b": [True, True]}, version=0, label="step 0")
    assert out["value/heldout_prompts"] == 2 and 0.0 <= out["value/heldout_brier"] <= 1.0
    assert out["value/heldout_auc_degenerate"] is not None and "step 0" in vm.curves
    assert vm.take_cost()["value/forward_tokens"] > 0  # the training-side forwards only
