"""Sol-RL's FP8 candidate pool (generate/sol_rl.py, arXiv 2604.06916): the subset kept is the top and
bottom by reward, the kept rows' behaviour log-probs are the full-precision policy's score (not the FP8
sampler's), every candidate's tokens are charged, and the config refuses what cannot work."""

import pytest
import torch

from rollwise.backends.hf import HFBackend
from rollwise.backends.scripted import ScriptedBackend
from rollwise.config import load_config
from rollwise.distributed.local import LocalPool
from rollwise.generate.sol_rl import SolRlPool, contrastive_subset, pool_size
from rollwise.hardware import fp8
from rollwise.registry import UserError
from rollwise.tokens import Codec
from rollwise.trainer.tiny import build_tiny, char_tokenizer
from rollwise.types import Plan, Prompt, Request, Sampling, Verdict

PRESET = "configs/sol_rl.toml"


def _verify(p, text):
    return Verdict(float(text == p.answer), "scripted")


# ---------------------------------------------------------------- the subset (pure)


def test_the_subset_is_the_best_half_and_the_worst_of_the_rest():
    # 0/1 rewards: the two correct rows (1, 4) and the two earliest incorrect ones (0, 2)
    assert contrastive_subset([0, 1, 0, 0, 1, 0, 1, 0], 4) == [0, 1, 2, 4]
    # graded rewards: best 0.9 (row 1), 0.7 (row 4); worst of the rest 0.1 (row 3), 0.2 (row 0)
    assert contrastive_subset([0.2, 0.9, 0.5, 0.1, 0.7, 0.3], 4) == [0, 1, 3, 4]
    # odd k: ceil(3 / 2) = 2 best (rows 1, 4), 1 worst (row 3)
    assert contrastive_subset([0.2, 0.9, 0.5, 0.1, 0.7, 0.3], 3) == [1, 3, 4]
    # mostly correct: the only incorrect row (3) is among the worst; the earliest correct fills the rest
    assert contrastive_subset([1, 1, 1, 0, 1, 1], 4) == [0, 1, 2, 3]
    # unverified rows are ranked by nothing: taken last, earliest first
    assert contrastive_subset([None, 1, None, 0], 3) == [0, 1, 3]
    assert contrastive_subset([0, 1], 5) == [0, 1] and contrastive_subset([0, 1], 0) == []


def test_the_subset_balances_correct_and_incorrect_as_far_as_the_pool_allows():
    rewards = [0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0]  # 3 correct of 16
    kept = contrastive_subset(rewards, 8)
    assert sum(rewards[i] for i in kept) == 3 and len(kept) == 8  # every correct row, 5 incorrect
    kept = contrastive_subset([1 - r for r in rewards], 8)  # 13 correct of 16: the 4 best, then the 3
    assert sum(rewards[i] for i in kept) == 3  # incorrect ones (all of them) and 1 correct as the worst half


def test_pool_size_rounds_up_and_never_shrinks():
    assert (pool_size(8, 4.0), pool_size(3, 1.5), pool_size(1, 1.01)) == (32, 5, 2)


# ---------------------------------------------------------------- the pool, scripted


def _scripted_pool(logprob):
    tok = char_tokenizer()
    # call i answers str(i): calls 0..9 give 1 digit + EOS (2 tokens), calls 10..15 two digits + EOS (3)
    backend = ScriptedBackend(lambda seq, i: tok.encode(str(i)), tok.eos_token_id, logprob=logprob)
    return LocalPool(backend, Codec(tok, use_chat=False), _verify, Sampling(1.0, 1.0, 8), 64), tok


def test_pool_charges_every_candidate_and_keeps_the_rescored_contrastive_subset():
    pool, tok = _scripted_pool(logprob=-0.5)  # the "FP8" sampler reports -0.5 per token
    scorer = ScriptedBackend(lambda seq, i: [], tok.eos_token_id, logprob=-0.25)  # the full-precision forward
    sol = SolRlPool(pool, scorer, Sampling(1.0, 1.0, 8), pool_factor=4.0)
    prompts = [Prompt("a", "t", "x", "3"), Prompt("b", "t", "y", "12")]
    groups = sol.generate(Plan(tuple(Request(p, 2) for p in prompts)), [], version=0)

    # 2 prompts x 4 x 2 = 16 candidates (calls 0..7 for "a", 8..15 for "b"); only 2 per prompt kept:
    # "a": the correct call 3 and the worst of the rest, call 0; "b": call 12 (correct) and call 8
    assert [[r.text for r in g.rollouts] for g in groups] == [["0", "3"], ["8", "12"]]
    assert [[r.reward for r in g.rollouts] for g in groups] == [[0.0, 1.0], [0.0, 1.0]]
    # the kept rows carry the scorer's log-probs, one per completion token, not the sampler's
    assert all(r.logprobs == (-0.25,) * len(r.completion_ids) for g in groups for r in g.rollouts)

    cost = pool.cost
    assert cost.generated_tokens == 10 * 2 + 6 * 3 == 38  # every candidate's tokens, EOS included
    assert (cost.rollouts, cost.verifier_calls) == (16, 16)  # every candidate was generated and verified
    assert cost.verify_tokens == 2 + 2 + 2 + 3  # the re-scoring forward over the kept rows
    m = cost.metrics
    assert (m["sol_rl/candidates"], m["sol_rl/kept"], m["sol_rl/fp8_tokens"]) == (16, 4, 38)
    assert m["sol_rl/pool_reward_mean"] == 2 / 16 and m["sol_rl/kept_reward_mean"] == 0.5
    assert m["sol_rl/fp8_gap_abs_mean"] == 0.25  # |-0.5 - (-0.25)| on every kept token


def test_a_prefix_request_is_refused():
    pool, tok = _scripted_pool(logprob=-0.5)
    sol = SolRlPool(pool, pool.backend, Sampling(1.0, 1.0, 8), pool_factor=2.0)
    req = Request(Prompt("a", "t", "x", "3"), 2, prefix=(21,), prefix_logprobs=(-1.0,))
    with pytest.raises(ValueError, match="continues a prefix"):
        sol.generate(Plan((req,)), [], version=0)


# ---------------------------------------------------------------- the pool, a real FP8 sampler


@pytest.fixture(scope="module")
def tiny():
    model, tok = build_tiny("tiny-s", seed=1)
    return model.eval(), tok


def test_kept_rows_carry_the_full_precision_score_not_the_fp8_log_probs(tiny):
    model, tok = tiny
    eos, pad = [tok.eos_token_id], tok.pad_token_id
    sampler = HFBackend(fp8.sampler_copy(model, 128), eos, pad, max_batch=64, seed=0)  # FP8, shares the weights
    scorer = HFBackend(model, eos, pad, max_batch=64, seed=0)  # the trainer's module, fp32
    sampling = Sampling(1.0, 1.0, 6)
    pool = LocalPool(sampler, Codec(tok, use_chat=False), _verify, sampling, 64)
    sol = SolRlPool(pool, scorer, sampling, pool_factor=2.0)
    plan = Plan(tuple(Request(Prompt(f"p{i}", "t", f"{i}+{i}=", str(2 * i)), 3) for i in range(2)))
    groups = sol.generate(plan, [], version=0)

    rows = [r for g in groups for r in g.rollouts]
    assert [len(g.rollouts) for g in groups] == [3, 3] and pool.cost.rollouts == 12
    seqs, starts = [r.prompt_ids + r.completion_ids for r in rows], [len(r.prompt_ids) for r in rows]
    full = [torch.tensor(s) for s in scorer.score(seqs, starts, sampling)]
    low = [torch.tensor(s) for s in sampler.score(seqs, starts, sampling)]
    kept = [torch.tensor(r.logprobs) for r in rows]
    assert all(torch.allclose(k, f, atol=1e-6, rtol=0) for k, f in zip(kept, full))
    # the FP8 forward gives other log-probs (its quantisation error); the kept rows do not carry them
    gap = max(float((k - q).abs().max()) for k, q in zip(kept, low))
    assert gap > 1e-4


# ---------------------------------------------------------------- refusals at load


@pytest.mark.parametrize(
    "overrides, keys",
    [
        (["model.rollout_precision=model"], ["sampling.sol_rl.enabled", "model.rollout_precision"]),
        (["train.matched_quantisation=true"], ["sampling.sol_rl.enabled", "train.matched_quantisation"]),
        (["reward.ttrl.enabled=true"], ["sampling.sol_rl.enabled", "reward.ttrl.enabled"]),
        (["sampling.sol_rl.pool_factor=1.0"], ["sampling.sol_rl.pool_factor"]),
        (["sampling.arrol.enabled=true", "sampling.max_new_tokens=16"], ["sampling.arrol.enabled", "sampling.sol_rl"]),
        (["sampling.latr.enabled=true"], ["sampling.latr.enabled", "sampling.sol_rl.enabled"]),
        (["replay.name=spec_rl"], ["sampling.sol_rl.enabled", "replay 'spec_rl'"]),
        (["control.name=adhint", "advantage.name=adhint"], ["control.name = 'adhint'", "sampling.sol_rl.enabled"]),
        (["model.backend=vllm"], ["sampling.sol_rl.enabled", "model.backend"]),
        (["train.async.max_staleness=1"], ["train.async"]),
    ],
)
def test_the_preset_refuses_what_cannot_work_naming_the_keys(overrides, keys):
    with pytest.raises(UserError) as e:
        load_config(PRESET, overrides)
    assert all(k in str(e.value) for k in keys), str(e.value)


def test_the_preset_loads_with_its_pool():
    cfg = load_config(PRESET)
    assert cfg.sampling.sol_rl.enabled and cfg.sampling.sol_rl.pool_factor == 4.0
    assert cfg.model.rollout_precision == "fp8" and not cfg.train.matched_quantisation
