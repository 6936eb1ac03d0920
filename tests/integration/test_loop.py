"""The real loop on CPU: a scripted backend (deterministic rewards) and the tiny model."""

import json

import pytest

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.backends.scripted import ScriptedBackend
from rollwise.config import load_config

METRIC_KEYS = {
    "step",
    "policy_version",
    "wall_s",
    "cost/generated_tokens",
    "cost/trained_tokens",
    "cost/rollouts",
    "cost/verifier_calls",
    "time/generate_s",
    "time/verify_s",
    "time/train_s",
    "reward/mean",
    "groups/degenerate_frac",
}
EVAL_KEYS = {"step", "cost/generated_tokens", "eval/pass@1", "eval/pass@2", "eval/maj@2", "eval/n_prompts"}


def _lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_tiny_run_writes_the_run_directory(tmp_path):
    cfg = load_config(overrides=as_sets(tiny_overrides(tmp_path, steps=3, **{"eval.every": 2})))
    result = rollwise.train(cfg, log=lambda m: None)
    d = tmp_path / "t"
    assert result.run_dir == d
    metrics = _lines(d / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert all(METRIC_KEYS <= set(m) for m in metrics)
    assert [m["policy_version"] for m in metrics] == [1, 2, 3]
    gen = [m["cost/generated_tokens"] for m in metrics]
    assert gen == sorted(gen) and gen[0] > 0  # cumulative
    assert metrics[-1]["cost/rollouts"] == 3 * 4 * 4
    evals = _lines(d / "eval.jsonl")
    assert [e["step"] for e in evals] == [0, 2, 3]
    assert all(EVAL_KEYS <= set(e) for e in evals)
    assert evals[0]["cost/generated_tokens"] == 0  # evaluation is never charged
    assert evals[-1]["cost/generated_tokens"] == metrics[-1]["cost/generated_tokens"]
    assert (d / "config.resolved.toml").exists()
    assert (d / "plots" / "pass_at_1.png").exists() and (d / "plots" / "reward.png").exists()
    assert (d / "checkpoints" / "step-3" / "model.safetensors").exists()


def test_scripted_backend_rewards_flow_through_the_ledger(tmp_path):
    """Scripted answers: prompt 'a+b=' answered correctly on even calls, wrongly on odd ones."""
    cfg = load_config(overrides=as_sets(tiny_overrides(tmp_path, steps=2, **{"eval.at_start": False})))
    from rollwise.trainer.tiny import char_tokenizer

    tok = char_tokenizer()

    def respond(seq, i):
        text = tok.decode(seq, skip_special_tokens=True)
        a, b = text.rstrip("=").replace("-", "+-").split("+")[:2]
        ans = int(a) + int(b)
        return tok.encode(str(ans if i % 2 == 0 else ans + 1))

    backend = ScriptedBackend(respond, eos_id=tok.eos_token_id)
    result = rollwise.train(cfg, backend=backend, log=lambda m: None)
    metrics = _lines(result.run_dir / "metrics.jsonl")
    # every group of 4 alternates right/wrong: reward 0.5, no degenerate groups
    assert all(m["reward/mean"] == pytest.approx(0.5) for m in metrics)
    assert all(m["groups/degenerate_frac"] == 0.0 for m in metrics)
    assert metrics[-1]["cost/verifier_calls"] == 2 * 16


def test_filters_drop_with_reasons(tmp_path):
    o = tiny_overrides(tmp_path, steps=1, **{"filter.names": ["zero_variance"], "eval.at_start": False})
    cfg = load_config(overrides=as_sets(o))
    from rollwise.trainer.tiny import char_tokenizer

    tok = char_tokenizer()
    backend = ScriptedBackend(lambda seq, i: tok.encode("0"), eos_id=tok.eos_token_id)  # always wrong
    result = rollwise.train(cfg, backend=backend, log=lambda m: None)
    m = _lines(result.run_dir / "metrics.jsonl")[0]
    assert m["filter/all_wrong"] == 4 and m["cost/trained_tokens"] == 0
