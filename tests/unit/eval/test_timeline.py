"""The run timeline (rollwise.eval.plots): measured spans from timeline.jsonl, or a synchronous
run's spans reconstructed from metrics.jsonl."""

import json

from rollwise.eval.plots import plot_timeline, timeline_spans


def test_sync_spans_are_generation_then_training_ending_at_the_step_wall_clock(tmp_path):
    # step 0 ends at 10 s: training 3 s (+ 0.5 s weight sync) before it, generation 4 s (+ 1 s verify) before that
    line = {
        "step": 0,
        "wall_s": 10.0,
        "time/train_s": 3.0,
        "time/weight_sync_s": 0.5,
        "time/generate_s": 4.0,
        "time/verify_s": 1.0,
    }
    (tmp_path / "metrics.jsonl").write_text(json.dumps(line) + "\n")
    spans, measured = timeline_spans(tmp_path)
    assert not measured
    assert spans == [
        {"lane": "trainer", "kind": "train", "step": 0, "start": 6.5, "end": 10.0},
        {"lane": "generator", "kind": "generate", "step": 0, "start": 1.5, "end": 6.5},
    ]
    (tmp_path / "plots").mkdir()
    assert plot_timeline(tmp_path, tmp_path / "plots").stat().st_size > 0


def test_measured_spans_win_over_the_ledger(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "wall_s": 1.0}) + "\n")
    spans = [
        {"lane": "worker 0", "kind": "generate", "step": 1, "start": 0.0, "end": 2.0},
        {"lane": "trainer", "kind": "train", "step": 0, "start": 0.5, "end": 1.5},
    ]
    (tmp_path / "timeline.jsonl").write_text("".join(json.dumps(s) + "\n" for s in spans))
    assert timeline_spans(tmp_path) == (spans, True)
    (tmp_path / "plots").mkdir()
    assert plot_timeline(tmp_path, tmp_path / "plots").exists()


def test_timeline_shows_every_step_with_a_whole_title_and_no_overlapping_numbers(tmp_path):
    """60 steps, short and long spans, a long run name: every span is drawn (not only the last
    steps), the title stays inside the figure, and no two step numbers overlap."""
    from rollwise.eval.plots import timeline_figure

    run = tmp_path / ("a-rather-long-run-name-from-a-sweep-" * 3).rstrip("-")
    run.mkdir()
    spans, t = [], 0.0
    for k in range(60):
        gen = 0.05 if k % 3 else 2.0  # many bars too narrow for their number
        spans.append({"lane": "generator", "kind": "generate", "step": k, "start": t, "end": t + gen})
        spans.append({"lane": "trainer", "kind": "train", "step": k, "start": t + gen, "end": t + gen + 0.4})
        t += gen + 0.4
    (run / "timeline.jsonl").write_text("".join(json.dumps(s) + "\n" for s in spans))
    fig = timeline_figure(run)
    ax = fig.axes[0]
    assert len(ax.patches) == len(spans)  # every span of every step, not only the last dozen
    renderer = fig.canvas.get_renderer()
    title = ax.title.get_window_extent(renderer)
    assert title.x0 >= fig.bbox.x0 and title.x1 <= fig.bbox.x1 and title.y1 <= fig.bbox.y1
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(boxes) >= 20  # the wide bars keep their numbers
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    shown = {int(t.get_text()) for t in ax.texts}
    assert {0, 3, 57} <= shown  # the 2 s generation spans, first to last
