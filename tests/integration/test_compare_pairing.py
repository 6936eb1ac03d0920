"""Paired seeds (issue #43): the runs that ``rollwise compare`` plans for different arms with the same
seed start from the same warm-started weights, evaluate on the same held-out prompts and visit the
training pool in the same order, so each seed's ratio of tokens to target compares like with like.
The runs are assembled as ``rollwise compare`` trains them (warm start, task, controller), no step
is trained."""

import hashlib

from rollwise.bench.sweep import load_sweep, plan
from rollwise.session import Run

SWEEP = """
seeds = [0, 1]
budget = { rollouts = 64 }
[base]
"model.name" = "tiny-s"
"model.warm_start.steps" = 20
"model.warm_start.batch_size" = 16
"task.options" = { n_train = 40, n_heldout = 12 }
"train.steps" = 10
"control.prompts_per_step" = 4
"control.rollouts_per_prompt" = 4
"eval.n_prompts" = 8
"eval.samples" = 2
"eval.k" = [2]
"run.checkpoint_every" = 0
"run.progress" = false
[[arms]]
name = "uniform"
[[arms]]
name = "dapo"
set = { "filter.names" = ["zero_variance"], "control.dynamic_sampling.enabled" = true }
[[arms]]
name = "greso"
set = { "control.name" = "greso", "control.dynamic_sampling.enabled" = true, "filter.names" = ["zero_variance"] }
"""


def _weights_hash(model) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _what_a_seed_fixes(cfg) -> dict:
    run = Run(cfg, log=lambda m: None)
    try:
        ctrl = getattr(run.parts.controller, "inner", run.parts.controller)  # dynamic sampling wraps the controller
        n = len(run.task.train_prompts())
        return {
            "warm start": _weights_hash(run.model),
            "held-out": [p.id for p in run.task.heldout_prompts()],
            "prompt order": [p.id for p in ctrl.stream.take(2 * n)],  # two epochs of the stream
        }
    finally:
        run.close()


def test_arms_that_share_a_seed_share_its_warm_start_held_out_set_and_prompt_stream(tmp_path):
    path = tmp_path / "pairing.toml"
    path.write_text(SWEEP)
    specs = plan(load_sweep(path), tmp_path / "out")
    # seed 0 of every arm, and seed 1 of the baseline (a run takes ~20 s to assemble on a loaded CPU)
    seen = {(s.arm, s.seed): _what_a_seed_fixes(s.cfg) for s in specs if s.seed == 0 or s.arm == "uniform"}
    base = seen[("uniform", 0)]
    assert len(base["prompt order"]) == 80 and len(base["held-out"]) == 12
    for arm in ("dapo", "greso"):
        assert seen[(arm, 0)] == base, f"arm {arm!r}"
    # what the comparison can tell apart: another seed visits the pool in another order (and one warm
    # start serves every seed, model.warm_start.seed)
    s0, s1 = seen[("uniform", 0)], seen[("uniform", 1)]
    assert s0["prompt order"] != s1["prompt order"] and sorted(s0["prompt order"]) == sorted(s1["prompt order"])
    assert s0["warm start"] == s1["warm start"] and s0["held-out"] == s1["held-out"]
