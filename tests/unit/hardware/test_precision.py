"""model.compute_dtype (issue #33): "auto" picks bf16 on a CPU only when measured timings of the
model's matrix products say it is faster, the timings are cached per machine (only when measured
on a quiet CPU and not near the threshold, issue #40), on CUDA bf16 only from compute capability
8.0, an explicit dtype always wins, and the run logs the decision and writes it to metrics.jsonl.
Nothing here is timed: every measurement is a fake that returns chosen seconds, and the CPU load
is a chosen number."""

import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, LlamaConfig

import rollwise
from rollwise.config import load_config
from rollwise.hardware import precision
from rollwise.hardware.precision import (
    BF16_MIN_SPEEDUP,
    MatmulShapes,
    choose,
    cuda_choice,
    decide_compute_dtype,
    measured_cpu_decision,
    trust,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from conftest import as_sets, tiny_overrides  # noqa: E402

LLAMA = LlamaConfig(
    vocab_size=1000,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=3,
    num_attention_heads=8,
    num_key_value_heads=2,
)
SHAPES = MatmulShapes.of(LLAMA)


class FakeMeasure:
    """Returns fixed (fp32_s, bf16_s) and counts its calls."""

    def __init__(self, fp32_s, bf16_s):
        self.result, self.calls = (fp32_s, bf16_s), []

    def __call__(self, shapes):
        self.calls.append(shapes)
        return self.result


class Measurements:
    """Returns the given (fp32_s, bf16_s) in turn, one per call, and counts its calls."""

    def __init__(self, *results):
        self.results, self.calls = list(results), []

    def __call__(self, shapes):
        self.calls.append(shapes)
        return self.results[len(self.calls) - 1]


def quiet():
    return 0.1  # the 1-minute load average per core of an idle machine


def measured(shapes, **kw):
    """``measured_cpu_decision`` on a quiet machine (the load is not what these tests are about)."""
    return measured_cpu_decision(shapes, load=quiet, **kw)


def never(shapes):
    raise AssertionError("nothing should be measured here")


def key(**kw):
    return precision.machine_key(
        SHAPES, **{"cpu": "Test CPU", "flags": frozenset({"avx2"}), "torch_version": "2.13.0", "threads": 2, **kw}
    )


# ----------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    "fp32_s, bf16_s, want",
    [
        (1.0, 2.0, torch.float32),  # bf16 twice as slow (emulated, or avx512_bf16 without AMX)
        (1.0, 1.0, torch.float32),  # a tie keeps fp32
        (1.05, 1.0, torch.float32),  # 5% faster is not enough
        (1.1, 1.0, torch.bfloat16),  # the threshold itself
        (3.0, 1.0, torch.bfloat16),  # AMX-like
    ],
)
def test_choose_takes_bf16_only_when_clearly_faster(fp32_s, bf16_s, want):
    dtype, speedup = choose(fp32_s, bf16_s)
    assert dtype == want and speedup == pytest.approx(fp32_s / bf16_s)
    assert BF16_MIN_SPEEDUP == pytest.approx(1.1)


@pytest.mark.parametrize("bad", [(0.0, 1.0), (1.0, 0.0), (-1.0, 1.0), (float("nan"), 1.0)])
def test_choose_rejects_timings_that_are_not_positive(bad):
    with pytest.raises(ValueError, match="positive"):
        choose(*bad)


# ----------------------------------------------------------------------------- shapes from the config


def test_shapes_come_from_the_model_config_with_grouped_query_attention():
    assert SHAPES == MatmulShapes(hidden=64, intermediate=160, kv=16, vocab=1000, layers=3)
    assert sorted(SHAPES.products()) == sorted([(64, 64, 6), (64, 16, 6), (64, 160, 6), (160, 64, 3), (64, 1000, 1)])


def test_shapes_of_a_gpt2_config_and_equal_widths_are_merged():
    s = MatmulShapes.of(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=50))
    assert s == MatmulShapes(hidden=32, intermediate=128, kv=32, vocab=50, layers=2)
    assert sorted(s.products()) == sorted([(32, 32, 8), (32, 128, 4), (128, 32, 2), (32, 50, 1)])


def test_a_config_without_sizes_is_a_clear_error():
    with pytest.raises(ValueError, match="hidden_size.*float32 or bfloat16"):
        MatmulShapes.of(object())


def test_measurement_weights_each_product_by_its_count():
    # a clock that advances 1 s per reading: every timed product "takes" 1 s in either dtype,
    # so a pass is the sum of the counts (no real timing is asserted)
    ticks = iter(range(10**6))
    fp32_s, bf16_s = precision.measure_pass_seconds(SHAPES, rows=4, clock=lambda: float(next(ticks)))
    assert fp32_s == bf16_s == sum(c for _, _, c in SHAPES.products()) == 22


# ----------------------------------------------------------------------------- the cache


def test_first_run_measures_and_caches_then_the_cache_answers(tmp_path):
    path = tmp_path / "compute_dtype.json"
    slow_bf16 = FakeMeasure(0.010, 0.025)
    first = measured(SHAPES, cache_path=path, measure=slow_bf16, key=key())
    assert (
        first.dtype == torch.float32 and first.reason == "measured" and not first.cached and len(slow_bf16.calls) == 1
    )
    assert first.bf16_speedup == pytest.approx(0.4) and (first.fp32_s, first.bf16_s) == (0.010, 0.025)
    entry = next(iter(json.loads(path.read_text())["entries"].values()))
    assert (
        entry["key"]["cpu"] == "Test CPU"
        and entry["key"]["torch"] == "2.13.0"
        and entry["key"]["shapes"]["vocab"] == 1000
    )
    assert (entry["fp32_s"], entry["bf16_s"]) == (0.010, 0.025)

    again = measured(SHAPES, cache_path=path, measure=never, key=key())
    assert (
        again.dtype == torch.float32
        and again.cached
        and "cached in" in again.detail
        and "measured now" not in again.detail
    )
    assert again.ledger_fields() == first.ledger_fields()  # the ledger reads the same either way


@pytest.mark.parametrize(
    "changed",
    [{"cpu": "Other CPU"}, {"flags": frozenset({"avx512_bf16"})}, {"torch_version": "2.14.0"}, {"threads": 16}],
)
def test_another_cpu_flags_torch_or_thread_count_is_measured_again(tmp_path, changed):
    path = tmp_path / "compute_dtype.json"
    measured(SHAPES, cache_path=path, measure=FakeMeasure(1.0, 2.0), key=key())
    fast_bf16 = FakeMeasure(3.0, 1.0)
    p = measured(SHAPES, cache_path=path, measure=fast_bf16, key=key(**changed))
    assert p.dtype == torch.bfloat16 and not p.cached and len(fast_bf16.calls) == 1
    assert len(json.loads(path.read_text())["entries"]) == 2  # both machines' entries kept


def test_another_model_shape_is_measured_again(tmp_path):
    path = tmp_path / "compute_dtype.json"
    measured(SHAPES, cache_path=path, measure=FakeMeasure(1.0, 2.0), key=key())
    other = MatmulShapes(hidden=128, intermediate=256, kv=128, vocab=99, layers=2)
    m = FakeMeasure(1.0, 2.0)
    measured(
        other,
        cache_path=path,
        measure=m,
        key=precision.machine_key(other, cpu="Test CPU", flags=frozenset({"avx2"}), torch_version="2.13.0", threads=2),
    )
    assert m.calls == [other]


def test_a_corrupt_cache_is_measured_over(tmp_path):
    path = tmp_path / "compute_dtype.json"
    path.write_text("{not json")
    m = FakeMeasure(2.0, 1.0)
    assert measured(SHAPES, cache_path=path, measure=m, key=key()).dtype == torch.bfloat16
    assert len(m.calls) == 1 and len(json.loads(path.read_text())["entries"]) == 1


def test_an_unwritable_cache_is_reported_and_the_decision_still_made(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    logs = []
    p = measured(
        SHAPES, cache_path=blocker / "compute_dtype.json", measure=FakeMeasure(1.0, 2.0), key=key(), log=logs.append
    )
    assert p.dtype == torch.float32
    assert len(logs) == 1 and "could not cache" in logs[0]


def test_the_default_cache_is_under_rollwise_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLWISE_CACHE", str(tmp_path / "rw"))
    p = decide_compute_dtype("auto", "cpu", LLAMA, measure=FakeMeasure(1.0, 1.5), load=quiet)
    assert p.dtype == torch.float32
    entries = json.loads((tmp_path / "rw" / "compute_dtype.json").read_text())["entries"]
    assert [e["key"]["shapes"] for e in entries.values()] == [
        {"hidden": 64, "intermediate": 160, "kv": 16, "vocab": 1000, "layers": 3}
    ]


# ----------------------------------------------------------------------------- load and the threshold (issue #40)


@pytest.mark.parametrize(
    "speedup, load, doubt",
    [
        (0.4, 0.1, None),  # clearly slower bf16 on a quiet CPU: cache it
        (3.0, 0.75, None),  # the load limit itself is still quiet
        (0.4, 1.0, "loaded (1.00 per core"),  # the same ratio measured with a core's worth of other work per core
        (0.61, 2.5, "loaded"),
        (0.4, None, None),  # no load average on this platform: the ratio alone decides
        (0.88, 0.1, None),  # 1.1 / 1.25 = 0.88: the margin's lower edge is outside it
        (0.9, 0.1, "within 0.88x-1.38x"),  # fp32 by 0.2 below the threshold: a disturbed measurement flips it
        (1.2, 0.1, "within"),
        (1.375, 0.1, None),  # 1.1 x 1.25: the upper edge
    ],
)
def test_trust_refuses_a_loaded_cpu_or_a_ratio_near_the_threshold(speedup, load, doubt):
    got = trust(speedup, load)
    assert got is None if doubt is None else doubt in got


def test_a_measurement_under_load_is_measured_again_before_it_is_cached(tmp_path):
    path = tmp_path / "compute_dtype.json"
    loads = iter([2.0, 0.2])  # the first measurement starts on a loaded CPU, the second on a quiet one
    m = Measurements((0.9, 3.0), (1.0, 2.0))
    p = measured_cpu_decision(SHAPES, cache_path=path, measure=m, key=key(), load=lambda: next(loads))
    assert len(m.calls) == 2 and not p.cached
    # each dtype's fastest: fp32 0.9 s (first), bf16 2.0 s (second): speed-up 0.45
    assert (p.fp32_s, p.bf16_s, p.dtype) == (0.9, 2.0, torch.float32) and p.bf16_speedup == pytest.approx(0.45)
    [entry] = json.loads(path.read_text())["entries"].values()
    assert (entry["fp32_s"], entry["bf16_s"], entry["load_per_core"]) == (0.9, 2.0, 0.2)
    again = measured_cpu_decision(SHAPES, cache_path=path, measure=never, key=key(), load=lambda: 3.0)
    assert again.cached and again.load_per_core == 0.2  # a quiet measurement is not redone under today's load


def test_a_measurement_made_only_under_load_is_cached_then_redone_once_on_a_quiet_cpu(tmp_path):
    path = tmp_path / "compute_dtype.json"
    logs = []
    m = Measurements((3.0, 1.0), (3.3, 1.1))
    p = measured_cpu_decision(SHAPES, cache_path=path, measure=m, key=key(), load=lambda: 1.5, log=logs.append)
    assert p.dtype == torch.bfloat16 and p.bf16_speedup == pytest.approx(3.0) and len(m.calls) == 2
    assert "doubtful: the CPU was loaded (1.50 per core" in p.detail
    assert len(logs) == 1 and "a run that finds the CPU quieter measures again" in logs[0]
    # still loaded: the cached decision stands, so runs on this machine record the same ratio
    same = measured_cpu_decision(SHAPES, cache_path=path, measure=never, key=key(), load=lambda: 1.2)
    assert same.cached and same.bf16_speedup == pytest.approx(3.0)
    quiet_now = Measurements((1.0, 2.5))  # the quiet CPU says bf16 is slower: the loaded ratio was wrong
    redone = measured(SHAPES, cache_path=path, measure=quiet_now, key=key())
    assert not redone.cached and redone.dtype == torch.float32 and len(quiet_now.calls) == 1
    [entry] = json.loads(path.read_text())["entries"].values()
    assert (entry["fp32_s"], entry["bf16_s"], entry["load_per_core"]) == (1.0, 2.5, 0.1)
    assert measured(SHAPES, cache_path=path, measure=never, key=key()).cached  # and that one is kept


def test_a_loaded_measurement_far_from_the_threshold_is_kept_on_a_quiet_cpu(tmp_path):
    """0.1x under load: no load skew (LOAD_SKEW = 3) brings it near 1.1x, so the decision and the
    ratio stay cached and every later run writes the same ledger facts."""
    path = tmp_path / "compute_dtype.json"
    m = Measurements((1.0, 10.0), (1.0, 10.0))
    first = measured_cpu_decision(SHAPES, cache_path=path, measure=m, key=key(), load=lambda: 1.5)
    assert first.dtype == torch.float32 and first.bf16_speedup == pytest.approx(0.1) and len(m.calls) == 2
    again = measured(SHAPES, cache_path=path, measure=never, key=key())
    assert again.cached and again.bf16_speedup == pytest.approx(0.1)


def test_a_ratio_near_the_threshold_is_measured_again_before_it_is_cached(tmp_path):
    path = tmp_path / "compute_dtype.json"
    m = Measurements((1.2, 1.0), (1.15, 1.05))  # 1.2x, then fastest of each 1.15 / 1.0 = 1.15x: bf16, but close
    p = measured(SHAPES, cache_path=path, measure=m, key=key())
    assert p.dtype == torch.bfloat16 and p.bf16_speedup == pytest.approx(1.15) and len(m.calls) == 2
    assert "doubtful: the speed-up 1.15x is within 0.88x-1.38x of the 1.10x threshold" in p.detail
    [entry] = json.loads(path.read_text())["entries"].values()
    assert (entry["fp32_s"], entry["bf16_s"]) == (1.15, 1.0)
    assert measured(SHAPES, cache_path=path, measure=never, key=key()).cached  # measured on a quiet CPU: kept


# ----------------------------------------------------------------------------- the override and the other devices


@pytest.mark.parametrize("setting, want", [("float32", torch.float32), ("bfloat16", torch.bfloat16)])
def test_an_explicit_dtype_always_wins_and_measures_nothing(setting, want):
    for device in ("cpu", "meta"):
        p = decide_compute_dtype(setting, device, LLAMA, measure=never)
        assert p.dtype == want and p.reason == "configured" and p.bf16_speedup is None
    assert decide_compute_dtype(setting, "cpu", None, weights_dtype=torch.bfloat16, measure=never).dtype == want


def test_auto_with_bf16_weights_is_bf16_without_measuring():
    p = decide_compute_dtype("auto", "cpu", LLAMA, weights_dtype=torch.bfloat16, measure=never)
    assert p.dtype == torch.bfloat16 and p.reason == "bf16 weights"


@pytest.mark.parametrize(
    "capability, supported, want",
    [
        ((8, 0), True, torch.bfloat16),  # A100: bf16 tensor cores
        ((9, 0), True, torch.bfloat16),  # H100
        ((8, 0), False, torch.float32),  # torch says no (an old CUDA build): trust it
        ((7, 5), True, torch.float32),  # T4: is_bf16_supported() true by emulation, slower than fp32
        ((7, 0), True, torch.float32),  # V100
        ((6, 1), False, torch.float32),
    ],
)
def test_auto_on_cuda_is_bf16_only_from_compute_capability_8(capability, supported, want):
    dtype, why = cuda_choice(capability, supported)
    assert dtype == want and f"{capability[0]}.{capability[1]}" in why
    if capability < (8, 0):
        assert "no bf16 tensor cores" in why


def test_auto_elsewhere_is_fp32_and_bad_settings_are_errors():
    assert decide_compute_dtype("auto", "meta", LLAMA, measure=never).dtype == torch.float32
    with pytest.raises(ValueError, match="'auto', 'float32' or 'bfloat16'"):
        decide_compute_dtype("fp16", "cpu", LLAMA)
    with pytest.raises(ValueError, match="pass its config"):
        decide_compute_dtype("auto", "cpu", None, measure=never)


def test_ledger_fields_and_log_line_carry_the_decision_and_ratio(tmp_path):
    p = measured(SHAPES, cache_path=tmp_path / "c.json", measure=FakeMeasure(0.012, 0.030), key=key())
    assert p.ledger_fields() == {
        "precision/compute_dtype": "float32",
        "precision/bf16_speedup": 0.4,
        "precision/reason": "measured",
    }
    line = p.describe()
    assert line.startswith("compute dtype: float32 (model.compute_dtype = 'auto'; measured:")
    assert "12.00 ms in fp32" in line and "30.00 ms under bf16" in line and "0.40x" in line and "Test CPU" in line


# ----------------------------------------------------------------------------- a run


def _run(tmp_path, name, **extra):
    logs = []
    o = tiny_overrides(
        tmp_path,
        name=name,
        steps=2,
        **{
            "eval.at_start": False,
            "model.warm_start.steps": 0,
            "eval.n_prompts": 2,
            "sampling.max_new_tokens": 4,
            **extra,
        },
    )
    result = rollwise.train(load_config(overrides=as_sets(o)), log=logs.append)
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    return logs, lines


def test_a_run_logs_the_measured_choice_once_and_writes_it_on_every_line(tmp_path, monkeypatch):
    from rollwise.backends.hf import HFBackend
    from rollwise.trainer.trainer import Trainer

    fake = FakeMeasure(0.02, 0.01)  # bf16 "twice as fast": the run must train and generate under bf16
    monkeypatch.setattr(precision, "measure_pass_seconds", fake)
    monkeypatch.setattr(precision, "load_per_core", quiet)  # measured once and cached, whatever this machine's load
    monkeypatch.setenv("ROLLWISE_CACHE", str(tmp_path / "cache"))
    seen = {}
    real_init, real_trainer = HFBackend.__init__, Trainer.__init__

    def backend_init(self, *a, **k):
        real_init(self, *a, **k)
        seen["backend"] = self.compute_dtype

    def trainer_init(self, *a, **k):
        real_trainer(self, *a, **k)
        seen["trainer"] = self.compute_dtype

    monkeypatch.setattr(HFBackend, "__init__", backend_init)
    monkeypatch.setattr(Trainer, "__init__", trainer_init)
    logs, lines = _run(tmp_path, "auto")
    assert len(fake.calls) == 1 and fake.calls[0].vocab > 0  # the tiny model's shapes, measured once
    assert seen == {"backend": torch.bfloat16, "trainer": torch.bfloat16}
    said = [m for m in logs if m.startswith("compute dtype:")]
    assert len(said) == 1 and "bfloat16" in said[0] and "2.00x" in said[0]
    assert len(lines) == 2 and all(
        ln["precision/compute_dtype"] == "bfloat16"
        and ln["precision/bf16_speedup"] == 2.0
        and ln["precision/reason"] == "measured"
        for ln in lines
    )

    logs2, again = _run(tmp_path, "auto2")  # a second run on this machine reads the cache: same ledger fields
    assert (
        len(fake.calls) == 1
        and again[0]["precision/reason"] == "measured"
        and again[0]["precision/bf16_speedup"] == 2.0
    )
    assert any(m.startswith("compute dtype: bfloat16") and "cached in" in m and "measured now" not in m for m in logs2)


def test_a_run_with_an_explicit_dtype_records_it_and_measures_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(precision, "measure_pass_seconds", never)
    logs, lines = _run(tmp_path, "fp32", **{"model.compute_dtype": "float32"})
    assert lines[0]["precision/compute_dtype"] == "float32" and lines[0]["precision/reason"] == "configured"
    assert lines[0]["precision/bf16_speedup"] is None
    assert any(m.startswith("compute dtype: float32 (model.compute_dtype = 'float32'; configured") for m in logs)
