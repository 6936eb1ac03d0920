"""ADHint's consistency-based gradient modulation (CGM; guidance.md §7b step 8, formula [RECON]):
hand-worked weights, the per-token advantages it gives, the entropy forward only when it is on, and
its refusal at load."""

from __future__ import annotations

import math

import pytest
import torch

from rollwise.config import load_config
from rollwise.objectives.adhint import AdhintOptions, adhint, cgm_weights
from rollwise.objectives.inputs import advantage_context, declared_inputs
from rollwise.registry import UserError
from rollwise.types import Rollout, Services, Verdict

T = torch.tensor


def test_cgm_weights_hand_worked():
    # row 0: hint of 3 tokens, entropies [1, 2, 0.5]; continuation [1.5, 0.5] (mean 1) -> [1, e^-1, e^-0.5, 1, 1]
    # row 1: a naive row (no hint): every weight 1, whatever its entropies
    ent = T([[1.0, 2.0, 0.5, 1.5, 0.5], [3.0, 0.1, 0.0, 0.0, 0.0]])
    g = cgm_weights(ent, T([3, 0]), T([5, 2]))
    assert g[0].tolist() == pytest.approx([1.0, math.exp(-1.0), math.exp(-0.5), 1.0, 1.0])
    assert g[1].tolist() == [1.0] * 5


def test_cgm_weights_edge_rows():
    # a hint that is the whole completion has no continuation mean: weights 1; a zero-entropy continuation
    # keeps only zero-entropy hint tokens (0/0 consistent, x/0 fully inconsistent)
    ent = T([[0.7, 0.2, 0.0], [0.0, 0.4, 0.0]])
    g = cgm_weights(ent, T([3, 2]), T([3, 3]))
    assert g[0].tolist() == [1.0, 1.0, 1.0]
    assert g[1].tolist() == [1.0, 0.0, 1.0]


def test_adhint_cgm_scales_hint_token_advantages_only():
    # one prompt: naive rows 0-1 (rewards 1, 0), hinted rows 2-3 (rewards 1, 0), hint 2 tokens, completions 4
    rewards, gidx = T([1.0, 0.0, 1.0, 0.0]), T([0, 0, 0, 0])
    hints, lengths = T([0, 0, 2, 2]), T([4.0, 4.0, 4.0, 4.0])
    ent = T([[5.0, 5.0, 5.0, 5.0], [5.0, 5.0, 5.0, 5.0], [1.0, 3.0, 2.0, 2.0], [2.0, 2.0, 2.0, 2.0]])
    plain = adhint(rewards, gidx, AdhintOptions(), hint_tokens=hints, completion_lengths=lengths)
    out = adhint(
        rewards, gidx, AdhintOptions(cgm=True), hint_tokens=hints, completion_lengths=lengths, policy_entropy=ent
    )
    assert torch.equal(out.values, plain.values) and torch.equal(out.token_include, plain.token_include)
    a = out.values.tolist()
    half = math.exp(-0.5)  # |1 - 2| / 2 and |3 - 2| / 2
    assert out.token_values[2].tolist() == pytest.approx([a[2] * half, a[2] * half, a[2], a[2]])
    for row in (0, 1, 3):  # naive rows, and a hinted row whose hint entropies equal its continuation's
        assert out.token_values[row].tolist() == pytest.approx([a[row]] * 4)
    assert not out.token_include[3, :2].any()  # the failed hinted row's hint stays masked (selective masking)


def test_adhint_cgm_without_entropies_is_refused():
    with pytest.raises(ValueError, match="policy_entropy"):
        adhint(T([1.0, 0.0]), T([0, 0]), AdhintOptions(cgm=True), hint_tokens=T([0, 1]), completion_lengths=T([2, 2]))


class _Trainer:
    """Records which rows the entropy forward sees; entropy = the token id / 10."""

    def __init__(self):
        self.calls = []

    def token_entropy(self, batch):
        self.calls.append(batch.input_ids.shape[0])
        return batch.input_ids.float() / 10


class _Codec:
    pad_id = 0


def _row(completion, hint):
    details = {"hint_tokens": hint} if hint else {}
    return Rollout("p", (9,), tuple(completion), (0.0,) * len(completion), "stop", 0, "", Verdict(1.0, details=details))


def test_entropy_forward_only_with_cgm_and_only_hinted_rows():
    rows = [_row((1, 2, 3), 0), _row((4, 5), 1)]
    trainer = _Trainer()
    services = Services(codec=_Codec(), trainer=trainer)
    off = advantage_context(adhint, rows, services, options=AdhintOptions())
    assert off.policy_entropy is None and trainer.calls == [] and "policy_entropy" not in declared_inputs(adhint)
    on = advantage_context(adhint, rows, services, options=AdhintOptions(cgm=True))
    assert trainer.calls == [1]  # the hinted row alone
    assert torch.allclose(on.policy_entropy, T([[0.0, 0.0, 0.0], [0.4, 0.5, 0.0]]))


def test_cgm_refused_at_load_when_hint_tokens_are_masked():
    base = ["control.name=adhint", "advantage.name=adhint"]
    assert load_config(overrides=[*base, "advantage.options.cgm=true"]).advantage.options["cgm"] is True
    with pytest.raises(UserError, match="train_hint_tokens"):
        load_config(overrides=[*base, "advantage.options.cgm=true", "advantage.options.train_hint_tokens=false"])
