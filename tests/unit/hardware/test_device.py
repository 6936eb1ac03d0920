"""model.device: resolution and refusals, the memory arithmetic, the kept-logits budget (no GPU needed)."""

import pytest
import torch

from rollwise.hardware import device as dv
from rollwise.registry import UserError


@pytest.mark.parametrize(
    "setting,count,want",
    [
        ("auto", 0, "cpu"),
        ("auto", 2, "cuda:0"),
        ("cpu", 4, "cpu"),
        ("cuda", 1, "cuda:0"),
        ("cuda:1", 2, "cuda:1"),
    ],
)
def test_resolution(setting, count, want):
    assert dv.resolve_device(setting, cuda_count=count) == torch.device(want)


def test_cuda_request_without_cuda_names_the_key():
    with pytest.raises(UserError, match=r"model.device = 'cuda' but torch sees no CUDA device"):
        dv.resolve_device("cuda", cuda_count=0)


def test_cuda_index_beyond_the_devices_is_refused():
    with pytest.raises(
        UserError, match=r"model.device = 'cuda:2' but this machine has 2 CUDA device\(s\) \(cuda:0 .. cuda:1\)"
    ):
        dv.resolve_device("cuda:2", cuda_count=2)


@pytest.mark.parametrize("bad", ["gpu", "cuda:", "cuda:x", "CPU", "mps"])
def test_bad_setting_is_refused(bad):
    with pytest.raises(UserError, match="model.device must be"):
        dv.resolve_device(bad, cuda_count=1)


def test_config_refuses_a_bad_device_naming_the_key():
    import rollwise

    with pytest.raises(Exception, match="model.device"):
        rollwise.load_config(overrides=["model.device=gpu0"])


def test_auto_on_this_machine_matches_torch():
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert dv.resolve_device("auto").type == want


def test_memory_arithmetic_by_hand():
    # 1,000 weights in bf16 (2 bytes), all trainable: 2,000 weights + 2,000 gradients + 8,000 Adam
    # moments (two fp32 each) + 2,000 reference + 0.3 x 10,000 engine = 17,000 bytes
    plan = dv.training_memory(1000, 1000, 2, reference=True, engine_share=0.3, device_bytes=10_000)
    assert (plan.weights, plan.gradients, plan.optimizer, plan.reference, plan.engine) == (2000, 2000, 8000, 2000, 3000)
    assert plan.total == 17_000
    lora = dv.training_memory(1000, 0, 4, reference=False)  # LoRA: the base weights only
    assert lora.total == 4000


def test_fsdp_memory_arithmetic_by_hand():
    # 1,001 weights in bf16 over 4 FSDP ranks (train.fsdp): ceil(1001 / 4) = 251 per rank, so 502 bytes of
    # weights + 502 of gradients + 2,008 of Adam moments (8 per weight), plus the whole generation copy
    # (2,002) and the whole reference (2,002): 7,016 bytes, against 2,002 + 2,002 + 8,008 + 2,002 = 14,014
    # unsharded
    plan = dv.training_memory(1001, 1001, 2, reference=True, shards=4)
    assert (plan.weights, plan.gradients, plan.optimizer, plan.generation, plan.reference) == (
        502,
        502,
        2008,
        2002,
        2002,
    )
    assert plan.total == 7016
    assert dv.training_memory(1001, 1001, 2, reference=True).total == 14_014
    # 7B in fp32 over 8 ranks: 3.26 + 3.26 + 6.52 per rank + 26.08 generation copy = 39.12 GiB < 72 GiB: fits
    # where one device is refused (test below: 104.31 GiB)
    plan = dv.training_memory(7_000_000_000, 7_000_000_000, 4, reference=False, shards=8)
    assert plan.explain() == (
        "weights (1/8) 3.26 + gradients (1/8) 3.26 + AdamW moments (fp32) (1/8) 6.52 + generation copy 26.08 "
        "= 39.12 GiB"
    )
    dv.check_fits(plan, 80 * dv.GIB, "x")


def test_a_model_that_does_not_fit_is_refused_with_the_arithmetic():
    # 7B in fp32, full fine-tune, no reference: 28 + 28 + 56 = 112 GB > 0.9 x 80 GiB
    plan = dv.training_memory(7_000_000_000, 7_000_000_000, 4, reference=False)
    with pytest.raises(UserError) as e:
        dv.check_fits(plan, 80 * dv.GIB, "cuda:0 (test)")
    msg = str(e.value)
    assert "weights 26.08 + gradients 26.08 + AdamW moments (fp32) 52.15 = 104.31 GiB" in msg
    assert "80.00 GiB x 0.90" in msg and "72.00 GiB" in msg and "model.lora.enabled" in msg
    dv.check_fits(dv.training_memory(500_000_000, 500_000_000, 2, reference=True), 80 * dv.GIB, "x")  # 0.5B fits


def test_keep_logits_budget_follows_the_device():
    assert dv.keep_logits_bytes(torch.device("cpu")) == 512 * 2**20
    assert dv.keep_logits_bytes(torch.device("cuda:0"), free_bytes=8 * dv.GIB) == 2 * dv.GIB  # a quarter of free
    assert dv.keep_logits_bytes(torch.device("cuda:0"), free_bytes=100 * dv.GIB) == 8 * dv.GIB  # capped


def test_cpu_run_records_the_device_in_the_ledger(tmp_path):
    import json

    import rollwise
    from conftest import as_sets, tiny_overrides

    cfg = rollwise.load_config(
        overrides=as_sets(tiny_overrides(tmp_path, steps=1, **{"model.warm_start.steps": 0, "model.device": "cpu"}))
    )
    logs = []
    rollwise.train(cfg, log=logs.append)
    line = json.loads((tmp_path / "t" / "metrics.jsonl").read_text().splitlines()[0])
    assert line["device/type"] == "cpu" and line["device/name"]
    assert "device/peak_memory_gib" not in line  # CUDA only
    assert any(m.startswith("device: cpu") for m in logs)


def test_the_models_attend_with_sdpa():
    from rollwise.trainer.tiny import build_tiny

    assert build_tiny("tiny-s")[0].config._attn_implementation == "sdpa"


def test_activation_arithmetic_by_hand():
    # hidden 4, 2 layers, 3 rows x 5 tokens, fp32: 15 tokens x 2 layers x 28 x 4 values x 4 bytes
    assert dv.activation_bytes(4, 2, 3, 5, 4, checkpointing=False) == 15 * 2 * 112 * 4 == 13_440
    # checkpointing: each layer's input (2 x 4 values) + one layer's 112, a token
    assert dv.activation_bytes(4, 2, 3, 5, 4, checkpointing=True) == 15 * (8 + 112) * 4 == 7_200
    # SmolLM2-135M (30 layers x 576), one 560-token fp32 row: 1.08 GB (0.77-1.02 GB measured)
    assert round(dv.activation_bytes(576, 30, 1, 560, 4, False) / 1e9, 2) == 1.08


def test_a_training_pass_past_the_host_memory_is_refused_naming_the_keys():
    from rollwise.trainer.tiny import build_tiny

    model = build_tiny("tiny-s")[0]  # 2 layers x 128 hidden: 28,672 bytes a token in fp32
    cpu = torch.device("cpu")
    need = dv.activation_bytes(128, 2, 8, 100, 4, False)
    assert need == 8 * 100 * 28_672
    dv.check_activations(model, cpu, 8, 100, 4, False, available=need * 2)  # fits: no error
    with pytest.raises(UserError, match=r"8 rows x 100 tokens .* lower train.micro_batch, or set train.activation_"):
        dv.check_activations(model, cpu, 8, 100, 4, False, available=need)  # over 90% of it
    with pytest.raises(UserError) as e:
        dv.check_activations(model, cpu, 8, 100, 4, True, available=need // 20)
    assert "activation_checkpointing" not in str(e.value)  # already on: only the micro-batch is left
    dv.check_activations(model, torch.device("cuda:0"), 8, 100, 4, False, available=1)  # CUDA raises its own
    dv.check_activations(model, cpu, 8, 100, 4, False, available=None)  # no MemAvailable: not checked
    assert dv.available_bytes() > 0  # Linux: /proc/meminfo


def test_the_trainer_checks_each_pass_before_its_forward():
    from rollwise.collate import collate
    from rollwise.config import load_config
    from rollwise.objectives import OBJECTIVES
    from rollwise.trainer.tiny import build_tiny
    from rollwise.trainer.trainer import Trainer
    from rollwise.types import Advantages, Rollout

    model = build_tiny("tiny-s")[0]
    rows = [Rollout(f"p{i}", (5, 6), (7, 8, 9), (-1.0, -1.0, -1.0), "stop", 0) for i in range(4)]
    batch = collate(
        rows,
        torch.zeros(4),
        torch.arange(4) // 2,
        Advantages(torch.tensor([1.0, -1, 1, -1]), torch.ones(4, dtype=torch.bool)),
        pad_id=0,
    )
    grpo = OBJECTIVES.get("grpo")
    tr = Trainer(model, grpo, grpo.Options(), load_config(overrides=["train.micro_batch=2"]).train, temperature=1.0)
    before = [p.detach().clone() for p in model.parameters()]
    tr._host_available = dv.activation_bytes(128, 2, 2, 5, 4, False)  # 2 rows x 5 tokens: over 90% of it
    with pytest.raises(UserError, match=r"2 rows x 5 tokens"):
        tr.optimize(batch)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # refused before any update
    tr._host_available = 100 * dv.activation_bytes(128, 2, 2, 5, 4, False)
    tr.optimize(batch)  # room enough: it trains
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
