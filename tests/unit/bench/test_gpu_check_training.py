"""benchmarks/gpu_check.py's ``training_packing`` part (issue #42 item 4), run small on the CPU: it
times the step with ``train.packing`` off and on and counts real tokens, not padding."""

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpu_check  # noqa: E402
from train_profile import make_batch  # noqa: E402

SMALL = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    tie_word_embeddings=True,
)


def test_training_packing_times_both_settings_on_real_tokens():
    out = gpu_check.training_packing(1.0, rows=6, prompt_len=4, completion_len=12, steps=1, device="cpu", arch=SMALL)
    batch = make_batch(6, 4, 12, natural=True, vocab=128, seed=0)  # the rows it trained on
    real = int(batch.attention_mask.sum())
    assert out["real_tokens_per_step"] == real < out["padded_positions"] == batch.input_ids.numel()
    for mode in ("off", "on"):
        r = out[mode]
        assert r["seconds_per_step"] > 0
        assert abs(r["tokens_per_s"] * r["seconds_per_step"] / real - 1) < 1e-2  # real tokens, not positions
        assert r["useful_percent_of_bf16_matmul"] > 0
    assert out["speedup_on_over_off"] == out["off"]["seconds_per_step"] / out["on"]["seconds_per_step"]
