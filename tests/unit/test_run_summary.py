"""The run's closing line says when its held-out change is within the evaluation's noise (issue #32)."""

from pathlib import Path

from rollwise.session import RunResult, within_noise


def test_within_noise_by_hand():
    # 0.5 -> 0.6 on 100 prompts: 2 * sqrt((0.25 + 0.24) / 100) = 2 * 0.07 = 0.14 > 0.10: within noise
    assert within_noise(0.5, 0.6, 100) == "; no measured change: within ±14.0 pts, 2 standard errors over 100 prompts"
    # 0.5 -> 0.7: 2 * sqrt((0.25 + 0.21) / 100) = 0.1356 < 0.20: a measured change, nothing added
    assert within_noise(0.5, 0.7, 100) == ""
    assert within_noise(0.5, 0.6, None) == ""  # prompt count unknown: no claim either way
    # 0 -> 0 on 64 prompts: each rate taken as 1/128; 2 * sqrt(2 * (1/128)(127/128) / 64) = 0.0311
    assert within_noise(0.0, 0.0, 64) == "; no measured change: within ±3.1 pts, 2 standard errors over 64 prompts"
    assert within_noise(1.0, 1.0, 16)  # 1 -> 1 likewise (1 - 1/32 each: ±12.3 pts)
    assert within_noise(0.0, 0.25, 64) == ""  # 2 * sqrt((0.0078 + 0.1875) / 64) = 0.110 < 0.25: a change


def test_summary_carries_the_note():
    r = RunResult(
        Path("x"),
        3,
        {"eval/pass@1": 0.140625, "eval/n_prompts": 16.0},
        {"eval/pass@1": 0.171875, "eval/n_prompts": 16.0},
        {"generated_tokens": 6194, "rollouts": 96},
    )
    assert r.summary() == (
        "3 steps, held-out pass@1 0.141 -> 0.172 (+3.1 pts; no measured change: within ±25.7 pts, 2 standard errors "
        "over 16 prompts), 6,194 generated tokens, 96 rollouts"
    )
    assert "no held-out gain" in r.noise_hint() and "eval.n_prompts" in r.noise_hint()
    measured = RunResult(
        Path("x"), 3, {"eval/pass@1": 0.5, "eval/n_prompts": 100.0}, {"eval/pass@1": 0.7, "eval/n_prompts": 100.0}
    )
    assert "(+20.0 pts)" in measured.summary() and measured.noise_hint() == ""
