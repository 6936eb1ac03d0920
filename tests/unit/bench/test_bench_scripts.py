"""The pure helpers of benchmarks/vs_trl.py, benchmarks/gen_throughput.py and
benchmarks/benchinfo.py, on hand-worked numbers (the benchmarks themselves are not tests)."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCH))

import benchinfo  # noqa: E402
import gen_throughput as gt  # noqa: E402
import vs_trl  # noqa: E402

HAS_TRL = importlib.util.find_spec("trl") is not None

# ---------------------------------------------------------------- machine info

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_vnni amx_bf16 amx_tile
processor\t: 1
model name\t: something else
flags\t\t: fpu
"""


def test_cpu_model_and_features_come_from_the_first_processor():
    assert benchinfo.cpu_model(CPUINFO) == "Intel(R) Xeon(R) Platinum 8480+"
    assert benchinfo.cpu_features(CPUINFO) == {
        "avx2": True,
        "fma": True,
        "avx512f": True,
        "avx512_bf16": False,
        "avx512_vnni": True,
        "amx": True,
    }


def test_cpu_info_without_the_lines():
    assert benchinfo.cpu_model("") is None
    assert not any(benchinfo.cpu_features("flags : sse2 avx").values())


def test_machine_records_versions_and_threads():
    m = benchinfo.machine()
    assert m["cores"] >= 1 and m["torch_threads"] >= 1
    assert m["versions"]["torch"] and "trl" in m["versions"]


def test_median_mean():
    assert benchinfo.median([3.0, 1.0, 2.0]) == 2.0 and benchinfo.mean([1.0, 2.0, 6.0]) == 3.0
    assert benchinfo.median([]) is None and benchinfo.mean([]) is None


# ---------------------------------------------------------------- gen_throughput arithmetic


def test_matmul_flops():
    # (2, 3) x (3, 4): 8 outputs, each 3 multiply-adds = 6 FLOPs -> 48
    assert gt.matmul_flops(2, 3, 4) == 48
    assert gt.matmul_flops(1024, 1024, 1024) == 2 * 1024**3


def test_generation_flops_by_hand():
    # P_body 1000, P_head 100, 2 layers, hidden 8, prompt 3, 2 new tokens, batch 4:
    # positions run = 3 + 2 - 1 = 4; weights 4 * 2 * 1000 + 2 * 2 * 100 = 8400;
    # attention 4 * 2 * 8 * (1 + 2 + 3 + 4) = 64 * 10 = 640; per sequence 9040; x 4 = 36160
    assert gt.generation_flops(1000, 100, 2, 8, 3, 2, 4) == 36160
    assert gt.generation_flops(1000, 100, 2, 8, 3, 2) == 9040


def test_generation_flops_one_token_is_one_prompt_pass():
    # 1 new token after 5 prompt tokens: 5 positions of body, 1 of head, attention 1+..+5 = 15
    assert gt.generation_flops(10, 7, 1, 2, 5, 1) == 5 * 2 * 10 + 2 * 7 + 4 * 1 * 2 * 15


def test_fraction_and_tokens_per_s():
    # 36160 FLOPs in 0.5 s = 72320 FLOP/s against a 1e6 FLOP/s bound -> 0.07232
    assert gt.fraction_of_bound(36160, 0.5, 1e6) == pytest.approx(0.07232)
    # batch 8 x 32 tokens in 2 s = 128 tok/s
    assert gt.tokens_per_s(8, 32, 2.0) == 128.0


def test_linear_params_of_tiny_s():
    from rollwise.trainer.tiny import build_tiny

    model, tok = build_tiny("tiny-s")
    # tiny-s: hidden 128, 2 layers, ffn 512, 4 heads = 4 KV heads, vocab 99
    # per layer q, k, v, o 4 * 128 * 128 = 65536 + gate, up, down 3 * 128 * 512 = 196608 -> 262144; x 2 = 524288
    # head 128 * 99 = 12672 (tied with the embedding, counted as a matmul)
    assert gt.linear_params(model) == (524288, 12672)


def test_time_matmul_reports_a_rate():
    r = gt.time_matmul(32, 32, 32, repeats=2, target_s=0.01)
    assert r["shape"] == [32, 32, 32] and 0 < r["tflops_median"] <= r["tflops_best"]


# ---------------------------------------------------------------- vs_trl summaries


def test_step_times_are_differences_of_end_times():
    assert vs_trl.step_times([1.0, 1.5, 3.0], start=0.5) == [0.5, 0.5, 1.5]


STEPS = [
    {"step_s": 9.0, "generate_s": 5.0, "tokens": 7, "rollouts": 1, "reward": 0.9},  # warm-up, dropped
    {"step_s": 1.0, "generate_s": 0.5, "tokens": 30, "rollouts": 10, "reward": 1.0},
    {"step_s": 2.0, "generate_s": 0.5, "tokens": 30, "rollouts": 10, "reward": 0.5},
    {"step_s": 6.0, "generate_s": 1.0, "tokens": 60, "rollouts": 10, "reward": 0.0},
]


def test_summarise_by_hand():
    s = vs_trl.summarise(STEPS, warmup=1)
    assert s["steps_timed"] == 3
    assert s["s_per_step_median"] == 2.0 and s["s_per_step_mean"] == 3.0
    assert s["generate_s_median"] == 0.5
    assert s["non_generate_s_median"] == 1.5  # of 0.5, 1.5, 5.0
    assert s["generated_tokens_per_step_mean"] == 40.0  # 120 / 3
    assert s["mean_completion_length"] == 4.0  # 120 tokens / 30 rollouts
    assert s["tokens_per_s"] == pytest.approx(120 / 9)  # over 1 + 2 + 6 s of steps
    assert s["generate_tokens_per_s"] == 60.0  # over 0.5 + 0.5 + 1.0 s of generation
    assert s["reward_mean"] == 0.5
    assert "train_s_median" not in s


def test_summarise_needs_a_timed_step():
    with pytest.raises(ValueError):
        vs_trl.summarise(STEPS[:1], warmup=1)


def test_ratios_are_oriented_so_above_one_favours_rollwise():
    rw = {
        "s_per_step_median": 2.0,
        "generate_s_median": 1.0,
        "non_generate_s_median": 1.0,
        "tokens_per_s": 60.0,
        "generate_tokens_per_s": None,
        "peak_rss_mb": 400.0,
    }
    trl = {
        "s_per_step_median": 3.0,
        "generate_s_median": 1.0,
        "non_generate_s_median": 2.0,
        "tokens_per_s": 40.0,
        "generate_tokens_per_s": 10.0,
        "peak_rss_mb": 600.0,
    }
    r = vs_trl.ratios(rw, trl)
    assert r["s_per_step_trl_over_rollwise"] == 1.5 and r["tokens_per_s_rollwise_over_trl"] == 1.5
    assert r["generate_s_trl_over_rollwise"] == 1.0 and r["non_generate_s_trl_over_rollwise"] == 2.0
    assert r["peak_rss_trl_over_rollwise"] == 1.5
    assert r["generate_tokens_per_s_rollwise_over_trl"] is None


SPEC = {
    "model": "tiny-s",
    "warm_start_steps": 0,
    "prompts": 4,
    "group": 3,
    "max_new_tokens": 5,
    "steps": 6,
    "warmup": 2,
    "lr": 1e-4,
    "seed": 0,
    "threads": 1,
    "mode": "forced",
}


def test_rollwise_config_is_valid_and_matches_the_spec(tmp_path):
    from rollwise.config import load_config

    cfg = load_config(data=vs_trl.rollwise_config_data(SPEC, str(tmp_path / "run")))
    assert cfg.run_dir() == tmp_path / "run"
    assert (cfg.control.prompts_per_step, cfg.control.rollouts_per_prompt, cfg.sampling.max_new_tokens) == (4, 3, 5)
    assert cfg.train.steps == 8 and cfg.train.micro_batch == 12 and cfg.train.lr == 1e-4
    assert cfg.sampling.temperature == 1.0 and cfg.sampling.top_p == 1.0
    assert not cfg.eval.at_start and cfg.eval.every == 0 and cfg.model.warm_start.steps == 0


def test_weights_digest_follows_the_weights():
    from rollwise.trainer.tiny import build_tiny

    a, b, c = build_tiny("tiny-s", seed=0)[0], build_tiny("tiny-s", seed=0)[0], build_tiny("tiny-s", seed=1)[0]
    assert vs_trl.weights_digest(a) == vs_trl.weights_digest(b) != vs_trl.weights_digest(c)


@pytest.mark.skipif(not HAS_TRL, reason="trl is not installed (pip install 'trl==1.16.0')")
@pytest.mark.parametrize("mode", ["forced", "natural"])
def test_trl_config_matches_the_rollwise_side(tmp_path, mode):
    from trl import GRPOConfig

    args = GRPOConfig(**vs_trl.trl_config_kwargs({**SPEC, "mode": mode}, str(tmp_path)))
    assert args.per_device_train_batch_size == 12 and args.gradient_accumulation_steps == 1
    assert args.num_generations == 3 and args.max_completion_length == 5 and args.max_steps == 8
    assert args.loss_type == "dapo" and args.beta == 0.0 and args.num_iterations == 1
    assert args.lr_scheduler_type == "constant" and args.adam_beta2 == 0.99 and args.learning_rate == 1e-4
    assert getattr(args, vs_trl.checkpointing_arg()) is False and args.use_cpu
    assert args.generation_batch_size == 12  # one generation call per step
    assert (args.generation_kwargs or {}).get("min_new_tokens") == (5 if mode == "forced" else None)


# ---------------------------------------------------------------- scale_out


def test_scale_out_stage_summary_first_step_apart_median_of_the_rest():
    import scale_out

    lines = [
        {"time/generate_s": 9.0, "time/train_s": 4.0},  # first step: warm-up, reported apart
        {"time/generate_s": 2.0, "time/weight_sync_s": 0.5, "time/verify_s": 0.1, "time/train_s": 3.0},
        {"time/generate_s": 4.0, "time/weight_sync_s": 0.3, "time/verify_s": 0.1, "time/train_s": 1.0},
        {"time/generate_s": 3.0, "time/weight_sync_s": 0.4, "time/verify_s": 0.1, "time/train_s": 2.0},
    ]
    s = scale_out.stage_summary(lines)
    assert s["n_steps"] == 4
    assert s["first_step"] == {"generate_s": 9.0, "weight_sync_s": 0.0, "verify_s": 0.0, "train_s": 4.0}
    # medians per stage over steps 2-4: generate 3, sync 0.4, verify 0.1, train 2; step = their sum 5.5
    assert s["median_later_steps"] == {
        "generate_s": 3.0,
        "weight_sync_s": 0.4,
        "verify_s": 0.1,
        "train_s": 2.0,
        "step_s": 5.5,
    }
    assert scale_out.stage_summary(lines[:1])["median_later_steps"] is None


def test_train_profile_step_flops_by_hand():
    import train_profile as tp

    # decoder 6 * 10 params * 4 positions = 240; head 6 (kept) or 8 (rebuilt) * 3 params * 2 positions
    assert tp.step_flops(10, 3, 4, 2, kept=True) == 240 + 36
    assert tp.step_flops(10, 3, 4, 2, kept=False) == 240 + 48


def test_train_profile_batch_shapes():
    import train_profile as tp

    b = tp.make_batch(4, 3, 6, natural=True, vocab=50, seed=1)
    lens = b.loss_mask.sum(1).tolist()
    assert all(2 <= n <= 6 for n in lens) and b.input_ids.shape == (4, 3 + int(max(lens)))
    assert b.num_loss_tokens == int(sum(lens)) and bool((b.loss_mask[:, :3] == 0).all())
    forced = tp.make_batch(4, 3, 6, natural=False, vocab=50)
    assert forced.loss_mask.sum().item() == 24 and bool(forced.attention_mask.all())


# ---------------------------------------------------------------- compute_dtype_auto (issue #33)


@pytest.mark.skipif(not HAS_TRL, reason="trl is not installed (pip install 'trl==1.16.0')")
def test_trl_best_setting_uses_bf16_exactly_when_rollwise_auto_picks_it(tmp_path):
    from trl import GRPOConfig

    def bf16(settings, auto_bf16):
        return GRPOConfig(
            **vs_trl.trl_config_kwargs({**SPEC, "settings": settings, "auto_bf16": auto_bf16}, str(tmp_path))
        ).bf16

    assert bf16("best", True) and not bf16("best", False) and not bf16("same", True)


def test_compute_dtype_arms_are_valid_configs_without_evaluation_during_training(tmp_path):
    import compute_dtype_auto as cda

    from rollwise.config import load_config

    cfg = load_config(overrides=cda.arm_overrides("bfloat16", 60, tmp_path, "bf", threads=2))
    assert cfg.model.compute_dtype == "bfloat16" and cfg.train.steps == 60 and cfg.run.threads == 2
    assert not cfg.eval.at_start and cfg.eval.every == 0 and cfg.run.checkpoint_every == 0
    assert cfg.run_dir() == tmp_path / "bf"


def test_compute_dtype_run_summary_sums_phases_and_keeps_the_precision():
    import compute_dtype_auto as cda

    lines = [
        {
            "wall_s": 1.0,
            "time/generate_s": 0.25,
            "time/train_s": 0.5,
            "cost/generated_tokens": 10,
            "precision/compute_dtype": "float32",
            "precision/bf16_speedup": 0.5,
            "precision/reason": "measured",
        },
        {
            "wall_s": 2.5,
            "time/generate_s": 0.5,
            "time/train_s": 0.75,
            "cost/generated_tokens": 30,
            "precision/compute_dtype": "float32",
            "precision/bf16_speedup": 0.5,
            "precision/reason": "measured",
        },
    ]
    s = cda.summarise_run(lines)
    assert (s["steps"], s["train_loop_wall_s"], s["generate_s"], s["train_s"], s["generated_tokens"]) == (
        2,
        2.5,
        0.75,
        1.25,
        30,
    )
    assert s["precision"] == {
        "precision/compute_dtype": "float32",
        "precision/bf16_speedup": 0.5,
        "precision/reason": "measured",
    }


# ---------------------------------------------------------------- regime.py: warm-start examples


def test_regime_example_stats_by_hand():
    import regime

    from rollwise.tasks import REGISTRY

    task = REGISTRY.get("arithmetic")(None, {"levels": [2, 3], "cot": True, "n_train": 50, "n_heldout": 10})
    p2 = next(p for p in task.train_prompts() if p.metadata["level"] == 2)
    p3 = next(p for p in task.train_prompts() if p.metadata["level"] == 3)
    # three examples: two right (a trace, a bare answer) and one ramble, which never verifies
    examples = [(p2, task.target(p2)), (p3, p3.answer), (p3, "1+2+0=3?1+2+0=4?")]
    out = regime.example_stats(examples, task, max_new_tokens=10)
    lengths = sorted(len(t) + 1 for _, t in examples)
    assert out["n"] == 3 and out["wrong_frac"] == round(1 / 3, 4)
    assert out["wrong_frac_by_level"] == {"2": 0.0, "3": 0.5}
    assert 17 in lengths and out["lengths"]["max"] == lengths[-1] and out["lengths"]["p50"] == lengths[1]  # 16 + end
    assert out["lengths"]["truncated_frac"] == round(sum(n > 10 for n in lengths) / 3, 4)


def test_regime_token_shares_of_degenerate_groups_by_hand():
    import regime

    from rollwise.types import Group, Prompt, Rollout, Verdict

    def group(pid, lengths_scores):
        return Group(
            Prompt(pid, "arithmetic", "q", "a"),
            tuple(
                Rollout(pid, (1,), (7,) * n, (0.0,) * n, "stop", 0, verdict=Verdict(score))
                for n, score in lengths_scores
            ),
        )

    # all wrong (10 + 30 tokens), all correct (5 + 5), mixed (20 + 30): 100 tokens in all
    groups = [group("w", [(10, 0.0), (30, 0.0)]), group("c", [(5, 1.0), (5, 1.0)]), group("m", [(20, 1.0), (30, 0.0)])]
    out = regime.group_stats(groups, 2)
    assert out["token_share_all_wrong"] == 0.4 and out["token_share_all_correct"] == 0.1
    assert out["all_wrong_frac"] == round(1 / 3, 4) and out["pass_rate_hist_k_of_2"] == [1, 1, 1]


def test_regime_levers_of_a_run_by_hand():
    import regime

    # two steps: degenerate shares 0.5 and 0.25 (mean 0.375), 3 + 1 prompts skipped, 16 + 0 tokens pruned
    lines = [
        {"groups/degenerate_frac": 0.5, "control/wise3_skipped": 3.0, "arrol/pruned_tokens": 16},
        {"groups/degenerate_frac": 0.25, "control/wise3_skipped": 1.0},
    ]
    assert regime.levers(lines) == {
        "steps": 2,
        "degenerate_frac_mean": 0.375,
        "skipped_prompts": 4.0,
        "arrol_pruned_tokens": 16,
    }
