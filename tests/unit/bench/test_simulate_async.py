"""benchmarks/simulate_async.py: the discrete-event model of sync / async (AReaL, eta) / periodic
steps, on tiny cases worked out by hand, and its readers of run directories. The simulator's
figures themselves are a benchmark (benchmarks/results/simulate_async.json), not a test."""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCH))

import simulate_async as sa  # noqa: E402


def setup(**kw):
    base = dict(workers=1, groups=2, group_size=2, max_concurrent=4, steps=8, warmup=2)
    base.update(kw)
    return sa.Setup(**base)


def costs(a=1.0, b=0.0, c0=0.0, c1=0.0, sync=0.0):
    return sa.Costs(a, b, c0, c1, sync)


PAPERISH = sa.LogNormal.from_quantile(100, 1200, sa.Z99, 1600)  # long-tailed, p99/median 12


# ---------------------------------------------------------------- synchronous: exact arithmetic


def test_sync_step_is_generation_plus_training_plus_sync_exactly():
    # B=2 groups x G=2 = 4 sequences of 10 tokens on 1 worker holding 4: 10 iterations of
    # 0.5 + 0.125*4 = 1.0 s -> generation 10 s; training 2 + 0.1 * 40 tokens = 6 s; sync 1 s.
    # Step 10 + 6 + 1 = 17 s; the worker decodes 10 of every 17 s -> idle 7/17; trainer busy 7 of 17.
    r = sa.simulate(setup(mode="sync"), costs(0.5, 0.125, 2.0, 0.1, 1.0), sa.constant(10))
    assert r["step_s"] == pytest.approx(17.0)
    assert r["generation_phase_s"] == pytest.approx(10.0)
    assert r["generator_idle_pct"] == pytest.approx(100 * 7 / 17)
    assert r["trainer_idle_pct"] == pytest.approx(100 * 10 / 17)
    assert r["staleness_hist"] == {0: 2 * (8 - 2)}


def test_continuous_batching_refills_slots_static_waits_for_the_batch():
    # one group of 4 with lengths 10, 2, 2, 2; a worker holds 2; iteration = 1 + 1*k s.
    # continuous: seq 0 runs iterations 0-10; seqs 1, 2, 3 run 0-2, 2-4, 4-6 beside it (k=2 for
    #   6 iterations at 3 s), then seq 0 alone (k=1) for 4 at 2 s: 18 + 8 = 26 s.
    # static: {0, 1}: 2 iterations at k=2 (6 s) + 8 at k=1 (16 s); then {2, 3}: 2 at k=2 (6 s) = 28 s.
    lengths = sa.Cycle((10, 2, 2, 2))
    kw = dict(mode="sync", groups=1, group_size=4, max_concurrent=2, steps=3, warmup=0)
    cont = sa.simulate(setup(batching="continuous", **kw), costs(1.0, 1.0), lengths)
    stat = sa.simulate(setup(batching="static", **kw), costs(1.0, 1.0), lengths)
    assert cont["generation_phase_s"] == pytest.approx(26.0)
    assert stat["generation_phase_s"] == pytest.approx(28.0)


def test_groups_spread_over_workers_divide_generation():
    # 4 groups of 2 sequences of 6 tokens, 1 s per iteration whatever the batch: on 1 worker all 8
    # run at once (6 s); on 2 workers also 6 s; with 2 slots per worker 2 workers take 2 rounds
    # of 6 (12 s) and 1 worker 4 rounds (24 s).
    kw = dict(mode="sync", groups=4, group_size=2, steps=2, warmup=0)
    one = sa.simulate(setup(workers=1, max_concurrent=2, **kw), costs(), sa.constant(6))
    two = sa.simulate(setup(workers=2, max_concurrent=2, **kw), costs(), sa.constant(6))
    assert one["generation_phase_s"] == pytest.approx(24.0)
    assert two["generation_phase_s"] == pytest.approx(12.0)


# ---------------------------------------------------------------- asynchronous (AReaL gate)


def test_eta_zero_is_synchronous():
    for workers in (1, 3):
        kw = dict(groups=4, group_size=4, workers=workers, max_concurrent=8, steps=12, warmup=2)
        c = costs(0.01, 0.001, 0.5, 0.001, 0.2)
        s = sa.simulate(sa.Setup(mode="sync", **kw), c, PAPERISH, seed=3)
        a = sa.simulate(sa.Setup(mode="async", eta=0, **kw), c, PAPERISH, seed=3)
        assert a["step_s"] == pytest.approx(s["step_s"], rel=1e-12)
        assert a["generator_idle_pct"] == pytest.approx(s["generator_idle_pct"], rel=1e-9)
        assert set(a["staleness_hist"]) == {0}


def test_async_eta1_overlaps_equal_generation_and_training():
    # generation of a batch 10 s (4 sequences x 10 tokens, 1 s per iteration), training 10 s, sync 0.
    # sync: 20 s a step. async eta=1: batch k+1 is generated while batch k trains -> 10 s a step,
    # neither side idle; every batch but the first was decoded one version before it is trained.
    c = costs(1.0, 0.0, 10.0)
    s = sa.simulate(setup(mode="sync"), c, sa.constant(10))
    a = sa.simulate(setup(mode="async", eta=1), c, sa.constant(10))
    assert s["step_s"] == pytest.approx(20.0)
    assert a["step_s"] == pytest.approx(10.0)
    assert a["trainer_idle_pct"] == pytest.approx(0.0, abs=1e-9)
    assert a["generator_idle_pct"] == pytest.approx(0.0, abs=1e-9)
    assert a["staleness_hist"] == {1: 2 * (8 - 2)}


def test_async_step_is_the_slower_side_plus_the_publish_pause():
    # generation 10 s, training 5 s, publish 1 s (pauses generation): the generator is the
    # bottleneck, 10 s of decoding + 1 s paused per step = 11 s.
    a = sa.simulate(setup(mode="async", eta=2, steps=10), costs(1.0, 0.0, 5.0, 0.0, 1.0), sa.constant(10))
    assert a["step_s"] == pytest.approx(11.0)


def test_colocated_async_cannot_overlap():
    # the trainer shares the generator's devices: generation pauses while it trains, so eta=1 gets
    # the synchronous 10 + 10 s.
    c = costs(1.0, 0.0, 10.0)
    a = sa.simulate(setup(mode="async", eta=1, colocated=True), c, sa.constant(10))
    assert a["step_s"] == pytest.approx(20.0)


@pytest.mark.parametrize("eta", [1, 2, 4])
def test_staleness_never_exceeds_eta_when_groups_finish_in_order(eta):
    # equal lengths finish in submission order; generation (2 s a batch) is faster than training
    # (8 s), so the gate, not the generator, limits how far ahead generation runs: staleness eta is reached
    r = sa.simulate(
        sa.Setup(mode="async", eta=eta, workers=2, groups=3, group_size=2, max_concurrent=64, steps=20, warmup=0),
        costs(1.0, 0.0, 8.0),
        sa.constant(2),
    )
    assert max(r["staleness_hist"]) == eta


def test_out_of_order_completion_can_exceed_eta_unless_taken_in_submission_order():
    # group 0 is 30 tokens, every other group 1 token (B=2, G=1, eta=1, 1 s per iteration,
    # training 1 s). The gate bounds the version at submission, but the trainer takes the oldest
    # *finished* groups, so it is more than 10 versions ahead when group 0 lands at t = 30 s (a
    # step takes at most 2 s): staleness >> eta.
    # Taking groups strictly in submission order keeps staleness <= eta (the trainer waits).
    kw = dict(eta=1, workers=1, groups=2, group_size=1, max_concurrent=64, steps=30, warmup=0)
    n = (30 + 1 + 1) * 2
    lengths = sa.Cycle((30,) + (1,) * (n - 1))
    loose = sa.simulate(sa.Setup(mode="async", take="finished", **kw), costs(1.0, 0.0, 1.0), lengths)
    strict = sa.simulate(sa.Setup(mode="async", take="submitted", **kw), costs(1.0, 0.0, 1.0), lengths)
    assert loose["max_staleness"] > 10
    assert strict["max_staleness"] <= 1


def test_long_tail_async_hides_what_sync_waits_for():
    # 4 groups x 2 per step, one 40-token sequence per batch, the rest 4 tokens; 2 workers.
    # Sync waits ~40 iterations for the long one every step; async keeps both workers busy.
    per_batch = (40,) + (4,) * 7
    lengths = sa.Cycle(per_batch)
    kw = dict(workers=2, groups=4, group_size=2, max_concurrent=8, steps=30, warmup=5)
    c = costs(1.0, 0.05, 8.0, 0.0, 1.0)
    s = sa.simulate(sa.Setup(mode="sync", **kw), c, lengths)
    a1 = sa.simulate(sa.Setup(mode="async", eta=1, **kw), c, lengths)
    a2 = sa.simulate(sa.Setup(mode="async", eta=2, **kw), c, lengths)
    assert a1["step_s"] < 0.75 * s["step_s"]
    assert a2["step_s"] <= a1["step_s"] + 1e-9
    assert a1["generator_idle_pct"] < s["generator_idle_pct"]


# ---------------------------------------------------------------- periodic (streaming trainer)


def test_periodic_overlaps_training_of_finished_groups():
    # B=2 groups of 1: lengths 2 and 10, 1 worker, 1 s per iteration. Training 1 + 0.5 s/token.
    # sync: 10 + (1 + 0.5 * 12) = 17 s. periodic: group 0 trains 2..3 s while group 1 decodes,
    # group 1 trains 10..15, the optimizer step 15..16: 16 s (the 1 s of group 0 is hidden).
    kw = dict(groups=2, group_size=1, steps=6, warmup=1)
    c = costs(1.0, 0.0, 1.0, 0.5)
    lengths = sa.Cycle((2, 10))
    assert sa.simulate(setup(mode="sync", **kw), c, lengths)["step_s"] == pytest.approx(17.0)
    assert sa.simulate(setup(mode="periodic", **kw), c, lengths)["step_s"] == pytest.approx(16.0)


@pytest.mark.parametrize("workers", [1, 4])
def test_periodic_is_on_policy_and_never_slower_than_sync(workers):
    kw = dict(workers=workers, groups=6, group_size=4, max_concurrent=16, steps=15, warmup=3)
    c = costs(0.01, 0.001, 0.3, 0.002, 0.1)
    s = sa.simulate(sa.Setup(mode="sync", **kw), c, PAPERISH, seed=1)
    p = sa.simulate(sa.Setup(mode="periodic", **kw), c, PAPERISH, seed=1)
    assert set(p["staleness_hist"]) == {0}
    assert p["step_s"] <= s["step_s"] + 1e-9
    assert p["step_s"] < s["step_s"]  # long-tailed lengths: early groups' training is hidden


# ---------------------------------------------------------------- determinism and inputs


def test_same_seed_same_result_other_seed_other_draws():
    kw = dict(mode="async", eta=2, workers=3, groups=4, group_size=4, max_concurrent=8, steps=10, warmup=2)
    c = costs(0.01, 0.001, 0.5, 0.001, 0.2)
    assert sa.simulate(sa.Setup(**kw), c, PAPERISH, seed=5) == sa.simulate(sa.Setup(**kw), c, PAPERISH, seed=5)
    assert (
        sa.simulate(sa.Setup(**kw), c, PAPERISH, seed=5)["step_s"]
        != sa.simulate(sa.Setup(**kw), c, PAPERISH, seed=6)["step_s"]
    )


def test_bad_setup_is_refused_with_the_field_named():
    with pytest.raises(ValueError, match="mode"):
        sa.Setup(mode="fast").check()
    with pytest.raises(ValueError, match="warmup"):
        sa.Setup(steps=3, warmup=3).check()


def test_lognormal_from_p99_and_its_draws():
    # median 661, p99 = 12 x median: sigma = ln 12 / 2.3263 = 1.0682
    d = sa.LogNormal.from_quantile(661, 661 * 12, sa.Z99, 16384)
    assert d.sigma == pytest.approx(math.log(12) / 2.3263478740408408)
    x = d.draw(np.random.default_rng(0), 200_000)
    assert x.min() >= 1 and x.max() <= 16384
    assert np.median(x) == pytest.approx(661, rel=0.02)
    assert np.percentile(x, 99) == pytest.approx(661 * 12, rel=0.05)


def test_lognormal_with_mean_hits_the_capped_mean():
    d = sa.lognormal_with_mean(3.2, 0.4, 8)
    x = d.draw(np.random.default_rng(0), 200_000)
    assert x.mean() == pytest.approx(3.2, rel=0.01) and x.max() <= 8


def test_rollwise_lengths_come_from_the_measured_quantiles():
    # april_throughput.json: p50 31, p90 52, cap 64 -> sigma = ln(52/31) / 1.2816 = 0.4036
    d = sa.rollwise_lengths()
    assert (d.median, d.cap) == (31.0, 64)
    assert d.sigma == pytest.approx(math.log(52 / 31) / 1.2815515655446004)


def test_read_lengths_jsonl(tmp_path):
    p = tmp_path / "lengths.jsonl"
    p.write_text('3\n{"length": 5}\n{"completion_tokens": 7}\n\n')
    assert sa.read_lengths(str(p)).values == (3, 5, 7)
    p.write_text('{"text": "x"}\n')
    with pytest.raises(ValueError, match="length"):
        sa.read_lengths(str(p))


def test_fit_line():
    # y = 1 + 2x exactly
    assert sa.fit_line([1, 2, 4], [3, 5, 9]) == pytest.approx((1.0, 2.0))
    # x hardly varies (800..820): slope = median(y) / median(x) = 2.0 / 810, no intercept
    assert sa.fit_line([800, 810, 820], [1.0, 2.0, 5.0]) == pytest.approx((0.0, 2.0 / 810))


def test_fit_decode_shape():
    # per-iteration seconds 0.002 + 0.0001 k at k = 1, 10 over 20 new tokens
    gt = {
        "models": [
            {
                "model": "m",
                "new_tokens": 20,
                "batches": [{"batch": 1, "seconds_median": 20 * 0.0021}, {"batch": 10, "seconds_median": 20 * 0.003}],
            }
        ]
    }
    a, b = sa.fit_decode_shape(gt, "m")
    assert (a, b) == pytest.approx((0.002, 0.0001))
    with pytest.raises(ValueError, match="not in gen_throughput"):
        sa.fit_decode_shape(gt, "other")


# ---------------------------------------------------------------- run directories


def fake_run(tmp_path, schedule_toml="", workers=1):
    """Four steps: wall 0, 2, 4.5, 10 s, an evaluation of 3 s recorded with step 3 (it ran after
    step 2, so it lies in the interval 2 -> 3); 100 rollouts and 300 generated tokens a step."""
    d = tmp_path / "run"
    d.mkdir()
    (d / "config.resolved.toml").write_text(
        f'[model]\nname = "tiny"\n[control]\nprompts_per_step = 25\nrollouts_per_prompt = 4\n'
        f"[sampling]\nmax_new_tokens = 8\n[train]\nsteps = 4\n{schedule_toml}\n[distributed]\nworkers = {workers}\n"
    )
    lines = []
    for i, wall in enumerate([0.5, 2.5, 5.0, 10.5]):
        lines.append(
            {
                "step": i,
                "wall_s": wall,
                "cost/generated_tokens": 300 * (i + 1),
                "cost/trained_tokens": 300 * (i + 1),
                "cost/rollouts": 100 * (i + 1),
                "time/generate_s": 0.5,
                "time/train_s": 1.0,
                "time/weight_sync_s": 0.1,
            }
        )
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (d / "eval.jsonl").write_text(json.dumps({"step": 3, "time/eval_s": 3.0}) + "\n")
    return d


def test_read_run_removes_evaluation_time_and_reads_the_schedule(tmp_path):
    r = sa.read_run(fake_run(tmp_path))
    # intervals: 2.0, 2.5, 5.5 - 3.0 (eval) = 2.5 -> median 2.5
    assert [row["dwall"] for row in r["rows"]] == pytest.approx([2.0, 2.5, 2.5])
    assert r["median"]["dwall"] == pytest.approx(2.5)
    assert r["mean_length"] == pytest.approx(3.0)
    assert (r["mode"], r["eta"], r["workers"], r["groups"], r["group_size"]) == ("sync", 0, 1, 25, 4)


@pytest.mark.parametrize(
    "toml,expect",
    [
        ("", ("sync", 0)),
        ("[train.async_]\nmax_staleness = 2\n", ("async", 2)),
        ('[train.async_]\nmax_staleness = 2\nmode = "async"\n', ("async", 2)),
        ("[train.async_]\nmax_staleness = 0\n", ("sync", 0)),
        ('[train.async_]\nmode = "periodic"\n', ("periodic", 0)),
        ("[train.async_]\nmax_staleness = 3\nenabled = false\n", ("sync", 0)),
    ],
)
def test_run_schedule_reads_async_keys_defensively(toml, expect):
    import tomllib

    s = sa.run_schedule(tomllib.loads(toml + "[distributed]\nworkers = 2\n"))
    assert (s["mode"], s["eta"]) == expect and s["workers"] == 2


def test_calibration_reproduces_its_own_run(tmp_path):
    # the run's own configuration simulated with the costs fitted from it gives its median step:
    # generation exactly (the decode scale is fitted on this very simulation), training and the
    # rest to within the simulated batches' token counts, which are drawn around the run's mean
    run = sa.read_run(fake_run(tmp_path))
    c, lengths, notes = sa.calibrate(run, 0.4, sa.load_gen_throughput())
    p = sa.simulate(sa.run_setup(run), c, lengths)
    assert p["generation_phase_s"] == pytest.approx(0.5, rel=1e-9)
    assert p["step_s"] == pytest.approx(2.5, rel=0.02)
    assert c.sync_s == pytest.approx(0.1)


def test_validate_writes_predicted_and_measured(tmp_path):
    d = fake_run(tmp_path)
    out = sa.validate([str(d)], None, 0.4, 0)
    (r,) = out["runs"]
    assert r["measured_step_s"] == pytest.approx(2.5)
    assert r["predicted_step_s"] == pytest.approx(2.5, rel=0.02)
    assert r["predicted_error_pct"] == pytest.approx(100 * (r["predicted_step_s"] / 2.5 - 1), abs=0.06)


def test_cli_writes_json_with_assumptions(tmp_path):
    out = tmp_path / "sim.json"
    sa.main(
        ["--workers", "1", "2", "--eta", "1", "--steps", "6", "--warmup", "1", "--no-comparison", "--out", str(out)]
    )
    r = json.loads(out.read_text())
    assert [row["workers"] for row in r["sweep"]["rows"]] == [1, 2]
    assert "async_eta1" in r["sweep"]["rows"][0] and "periodic" in r["sweep"]["rows"][0]
    assert "Staleness" in r["assumptions"] and r["machine"]["cores"] >= 1


def test_quiet_frac_keeps_the_fastest_steps(tmp_path):
    # intervals 2.0, 2.5, 2.5; half of 3 rounds up to 2 kept: 2.0 and 2.5 -> median 2.25
    r = sa.read_run(fake_run(tmp_path), quiet_frac=0.5)
    assert r["steps_used"] == 2 and r["median"]["dwall"] == pytest.approx(2.25)
    with pytest.raises(SystemExit, match="quiet-frac"):
        sa.read_run(tmp_path / "run", quiet_frac=0)


def test_committed_costs_reproduce_the_arm_they_come_from_and_predict_the_others():
    # machine_costs is fitted on scale_out.json's local pool: its generation comes back (to the
    # lengths' sampling); the request-by-request and 2-worker arms are predictions.
    rows = {r["arm"]: r for r in sa.validate_committed()["rows"]}
    assert rows["local"]["calibrated_on"] and not rows["ray_2_workers"]["calibrated_on"]
    assert rows["local"]["predicted_generate_s"] == pytest.approx(rows["local"]["measured_generate_s"], rel=0.02)
    # one worker, one group per call: 32 calls of ~5 iterations at batch <= 8 cost more than one
    # call of ~8 iterations at batch 256; two workers halve it
    one, two = rows["local_request_seeds"]["predicted_generate_s"], rows["ray_2_workers"]["predicted_generate_s"]
    assert one > 3 * rows["local"]["predicted_generate_s"]
    assert two == pytest.approx(one / 2, rel=0.1)


def test_validate_against_committed_costs(tmp_path):
    out = sa.validate([str(fake_run(tmp_path))], "committed", 0.4, 0)
    assert out["calibration_run"].startswith("committed") and out["runs"][0]["predicted_step_s"] > 0


def test_cli_from_run_takes_costs_and_batch_from_the_run_and_flags_win(tmp_path):
    out = tmp_path / "sim.json"
    sa.main(
        [
            "--from-run",
            str(fake_run(tmp_path)),
            "--workers",
            "1",
            "--eta",
            "1",
            "--steps",
            "4",
            "--warmup",
            "1",
            "--sync-s",
            "0.5",
            "--no-comparison",
            "--out",
            str(out),
        ]
    )
    r = json.loads(out.read_text())["sweep"]
    assert r["costs_source"]["from_run"].endswith("run")
    assert (r["setup"]["groups"], r["setup"]["group_size"]) == (25, 4)  # the run's B x G
    assert r["costs"]["sync_s"] == 0.5  # the flag over the run's 0.1
    assert r["lengths"]["cap"] == 8  # the run's max_new_tokens


def test_cli_from_run_with_explicit_lengths_keeps_them(tmp_path):
    out = tmp_path / "sim.json"
    sa.main(
        [
            "--from-run",
            str(fake_run(tmp_path)),
            "--lengths",
            "constant",
            "--median",
            "5",
            "--workers",
            "1",
            "--eta",
            "1",
            "--steps",
            "4",
            "--warmup",
            "1",
            "--no-comparison",
            "--out",
            str(out),
        ]
    )
    assert json.loads(out.read_text())["sweep"]["lengths"] == {"kind": "cycle", "values": [5], "period": 1}


@pytest.mark.parametrize("mode,eta", [("async", 1), ("async", 3), ("periodic", 0)])
def test_colocated_generation_and_training_never_overlap(mode, eta):
    # one worker sharing the trainer's device: decoding share + trainer-busy share <= 100%
    kw = dict(workers=1, groups=4, group_size=4, max_concurrent=8, steps=12, warmup=2, colocated=True)
    c = costs(0.01, 0.001, 0.3, 0.002, 0.1)
    r = sa.simulate(sa.Setup(mode=mode, eta=eta, **kw), c, PAPERISH, seed=2)
    assert (100 - r["generator_idle_pct"]) + (100 - r["trainer_idle_pct"]) <= 100 + 1e-6
    apart = sa.simulate(sa.Setup(mode=mode, eta=eta, **{**kw, "colocated": False}), c, PAPERISH, seed=2)
    assert apart["step_s"] <= r["step_s"] + 1e-9
