"""Scale-out set-up without the engines: bad input for model.backend = "vllm" and
distributed.* (each a UserError naming the key and the fix, raised before a model loads), the
sampler/trainer mismatch metrics, TIS on by default for non-hf samplers, and published weights
(LoRA merged). None of these needs vLLM or Ray installed: ``importlib.util.find_spec`` is
patched where a test needs one present or absent."""

import importlib.util
import os

import pytest
import torch

from conftest import as_sets, tiny_overrides
from rollwise import components
from rollwise.config import load_config
from rollwise.registry import UserError


@pytest.fixture
def extras(monkeypatch):
    """extras(vllm=bool, ray=bool): pretend the extra is installed (True) or not (False)."""
    real = importlib.util.find_spec

    def set_(**present):
        def find_spec(name, *a, **k):
            if name in present:
                return object() if present[name] else None
            return real(name, *a, **k)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)

    return set_


@pytest.fixture
def no_model(monkeypatch):
    """Loading the model fails the test: the errors must come before it."""

    def build_policy(*a, **k):
        raise AssertionError("the model was loaded before the bad input was refused")

    monkeypatch.setattr(components, "build_policy", build_policy)


def _cfg(tmp_path, **extra):
    return load_config(overrides=as_sets(tiny_overrides(tmp_path, **extra)))


def test_vllm_backend_without_the_extra(tmp_path, extras):
    extras(vllm=False)
    with pytest.raises(UserError, match=r"model.backend = 'vllm' needs vLLM.*pip install 'rollwise\[vllm\]'"):
        _cfg(tmp_path, **{"model.backend": "vllm"})


def test_workers_without_the_extra(tmp_path, extras):
    extras(ray=False)
    with pytest.raises(UserError, match=r"distributed.workers = 2 needs Ray.*pip install 'rollwise\[ray\]'"):
        _cfg(tmp_path, **{"distributed.workers": 2})


def test_vllm_with_an_hf_only_rollout_strategy(tmp_path, extras):
    extras(vllm=True)
    with pytest.raises(UserError, match=r"sampling.arrol.enabled needs the hf backend.*model.backend = 'hf'"):
        _cfg(tmp_path, **{"model.backend": "vllm", "sampling.arrol.enabled": True})


def test_more_workers_than_cpus_before_the_model_loads(tmp_path, extras, no_model):
    from rollwise.session import Run

    extras(ray=True)
    n = (os.cpu_count() or 1) + 1
    cfg = _cfg(tmp_path, **{"distributed.workers": n})
    with pytest.raises(
        UserError,
        match=rf"distributed.workers = {n} x distributed.cpus_per_worker = 1 needs {n} CPUs.*"
        "lower distributed.workers",
    ):
        Run(cfg, log=lambda *a: None)


def test_more_gpu_workers_than_gpus_before_the_model_loads(tmp_path, extras, no_model):
    import torch

    from rollwise.session import Run

    extras(ray=True)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cfg = _cfg(tmp_path, **{"distributed.workers": 1, "distributed.gpus_per_worker": gpus + 1})
    with pytest.raises(
        UserError,
        match=rf"distributed.workers = 1 x distributed.gpus_per_worker = {gpus + 1} needs {gpus + 1} GPUs; this "
        rf"machine has {gpus}: lower distributed.gpus_per_worker",
    ):
        Run(cfg, log=lambda *a: None)


def test_unreachable_address_before_the_model_loads(tmp_path, extras, no_model):
    from rollwise.session import Run

    extras(ray=True)
    cfg = _cfg(tmp_path, **{"distributed.workers": 1, "distributed.address": "127.0.0.1:9"})  # nothing listens on 9
    with pytest.raises(UserError, match=r"distributed.address = '127.0.0.1:9' is unreachable.*ray start --head"):
        Run(cfg, log=lambda *a: None)


def test_address_forms(tmp_path, extras):
    extras(ray=True)
    with pytest.raises(UserError, match=r"distributed.address = 'nowhere' is not 'host:port'"):
        _cfg(tmp_path, **{"distributed.workers": 1, "distributed.address": "nowhere"})
    with pytest.raises(UserError, match=r"distributed.address is set but distributed.workers = 0"):
        _cfg(tmp_path, **{"distributed.address": "10.0.0.1:6379"})
    assert (
        _cfg(tmp_path, **{"distributed.workers": 1, "distributed.address": "ray://10.0.0.1:10001"}).distributed.workers
        == 1
    )


# ---------------------------------------------------------------- mismatch and TIS


def test_mismatch_metrics_by_hand():
    from rollwise.trainer.mismatch import MismatchMeter

    # two micro-batches; d = trainer - sampler on loss tokens only:
    #   mb1: d = (-1.5) - (-1.0) = -0.5 and 0; the third position is masked out (its d = 9 is ignored)
    #   mb2: d = (-0.7) - (-1.0) = +0.3
    # mean |d| = (0.5 + 0 + 0.3) / 3 = 0.266667, max |d| = 0.5
    # k3 = e^d - 1 - d: e^-0.5 - 0.5 = 0.106531, 0, e^0.3 - 1.3 = 0.049859; mean = 0.156390 / 3 = 0.052130
    m = MismatchMeter()
    m.add(torch.tensor([[-1.5, -2.0, 7.0]]), torch.tensor([[-1.0, -2.0, -2.0]]), torch.tensor([[1.0, 1.0, 0.0]]))
    m.add(torch.tensor([[-0.7]]), torch.tensor([[-1.0]]), torch.tensor([[1.0]]))
    got = m.metrics()
    assert got["mismatch/abs_mean"] == pytest.approx(0.8 / 3)
    assert got["mismatch/abs_max"] == pytest.approx(0.5)
    assert got["mismatch/k3_kl"] == pytest.approx(0.0521300, abs=1e-6)
    assert MismatchMeter().metrics() == {}  # no loss tokens: nothing logged


def test_tis_is_on_by_default_for_vllm_only(tmp_path):
    from rollwise.compat import engine_kind, objective_options

    cfg = _cfg(tmp_path)
    assert engine_kind(cfg) == "trainer" and objective_options(cfg).tis_level == "off"  # hf: runs stay bit-identical
    cfg.model.backend = "vllm"  # assignment is validated but skips the install check of load_config
    assert engine_kind(cfg) == "vllm"  # the backend's compatibility record declares its engine
    assert objective_options(cfg).tis_level == "token" and objective_options(cfg).tis_cap == 2.0
    cfg.objective.options = {"tis_level": "off"}  # an explicit choice is kept
    assert objective_options(cfg).tis_level == "off"


def test_policy_weights_merge_lora_and_leave_the_trainer_alone():
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from rollwise.distributed.weights import plain_config, policy_weights
    from rollwise.trainer.hf_models import apply_lora
    from rollwise.trainer.tiny import build_tiny

    model, tok = build_tiny("tiny-s", seed=3)
    lora = apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2, generator=torch.Generator().manual_seed(len(n)))
    before = {k: v.clone() for k, v in lora.state_dict().items()}
    w = policy_weights(lora)
    assert not any("lora_" in k or "base_layer" in k for k in w)
    plain = AutoModelForCausalLM.from_config(plain_config(lora)).eval()
    plain.load_state_dict(w)
    ids = torch.tensor([[1] + tok.encode("12+34=", add_special_tokens=False)])
    lora.eval()
    with torch.no_grad():
        assert torch.allclose(plain(ids).logits, lora(ids).logits, atol=1e-5)
    assert all(torch.equal(before[k], v) for k, v in lora.state_dict().items())  # nothing merged in place
