import torch

from rollwise.trainer import checkpoint
from rollwise.trainer.tiny import build_tiny


def test_save_load_latest_and_keep(tmp_path):
    model, _ = build_tiny("tiny-s", seed=0)
    for step in (2, 4, 6):
        checkpoint.save(tmp_path, step, model, {"controller": {"pos": step}}, keep=2)
    assert checkpoint.list_steps(tmp_path) == [4, 6]
    assert checkpoint.latest(tmp_path).name == "step-6"
    other, _ = build_tiny("tiny-s", seed=1)
    torch.manual_seed(123)
    expected = torch.rand(3)
    state = checkpoint.load(checkpoint.latest(tmp_path), other)  # restores RNG saved at step 6
    assert state["controller"] == {"pos": 6} and state["step"] == 6
    for a, b in zip(model.state_dict().values(), other.state_dict().values()):
        assert torch.equal(a, b)
    assert not torch.equal(torch.rand(3), expected)  # RNG rewound to the save point, not the seed-123 stream


def test_half_written_checkpoint_is_ignored(tmp_path):
    (tmp_path / "checkpoints" / ".tmp-step-9").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-8").mkdir()  # no state.pt: incomplete
    assert checkpoint.latest(tmp_path) is None


def test_extra_models_roundtrip(tmp_path):
    model, _ = build_tiny("tiny-s", seed=0)
    ref, _ = build_tiny("tiny-s", seed=5)
    checkpoint.save(tmp_path, 1, model, {}, keep=1, extra_models={"reference": ref})
    m2, _ = build_tiny("tiny-s", seed=1)
    r2, _ = build_tiny("tiny-s", seed=2)
    checkpoint.load(checkpoint.latest(tmp_path), m2, {"reference": r2})
    assert all(torch.equal(a, b) for a, b in zip(ref.state_dict().values(), r2.state_dict().values()))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), m2.state_dict().values()))
