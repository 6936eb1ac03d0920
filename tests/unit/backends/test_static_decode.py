"""The static decode path (``rollwise.backends.static_decode``) against the eager one, token for
token, on the tiny model and on a random-weight model of SmolLM2-135M's attention shapes."""

import pytest
import torch

from conftest import smollm2_shaped_config
from rollwise.backends.hf import HFBackend
from rollwise.backends.static_decode import StaticDecoder, grouped_attention
from rollwise.config import load_config
from rollwise.registry import UserError
from rollwise.trainer.tiny import build_tiny
from rollwise.types import Sampling

SAMPLINGS = {
    "greedy": Sampling(0.0, 1.0, 10),
    "temperature": Sampling(1.0, 1.0, 10),
    "top_p": Sampling(1.0, 0.9, 10),
    "cooler": Sampling(0.7, 1.0, 10),
    "cooler_top_p": Sampling(0.7, 0.8, 10),
}
# The random SmolLM2-shaped model's next-token distributions are nearly uniform over 49,152 ids: there
# the float rounding of two paths (other batch shapes, other attention kernels) moves ids across the
# top-p nucleus edge at temperature 0.7 / top-p 0.8; a trained model's peaked distributions do not
# have thousands of ids at the edge. The tiny model (vocabulary 40) runs the cooler settings.
CASES = [("tiny", m) for m in SAMPLINGS] + [("smol", m) for m in ("greedy", "temperature", "top_p")]


@pytest.fixture(scope="module")
def tiny():
    model, tok = build_tiny("tiny-s", seed=1)
    prompts = [[1] + tok.encode(s) for s in ("12+34=", "7+8=", "100-37=")]
    return model.eval(), tok.pad_token_id, prompts


@pytest.fixture(scope="module")
def smol():
    """SmolLM2-135M's shapes (hidden 576, 9 heads over 3 K/V heads, vocab 49,152), two layers,
    random weights."""
    from transformers import LlamaForCausalLM

    cfg = smollm2_shaped_config(max_position_embeddings=256, pad_token_id=2, eos_token_id=2)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 49152, (n,), generator=g).tolist() for n in (9, 5, 12)]
    return model, 2, prompts


def _pair(model, pad, eos, seed=3, max_batch=16, **static):
    eager = HFBackend(model, eos, pad, max_batch=max_batch, seed=seed, sampler="eager")
    fast = HFBackend(model, eos, pad, max_batch=max_batch, seed=seed, sampler="static")
    if static:
        fast._static = StaticDecoder(fast, **static)
    return eager, fast


def _ending_id(backend, seqs, sampling):
    """An id the model emits in some rows but not first: taken as an extra end-of-sequence id, it
    ends rows at different lengths (the one whose first occurrences are most spread out)."""
    outs = [c.token_ids for c in backend.generate(seqs, sampling)]

    def spread(i):
        return len({o.index(i) if i in o else -1 for o in outs})

    return max(sorted({i for o in outs for i in o[1:]}), key=spread)


def _assert_same(eager_out, static_out, atol=1e-5):
    assert len(eager_out) == len(static_out)
    for e, s in zip(eager_out, static_out):
        assert s.token_ids == e.token_ids
        assert s.finish == e.finish
        assert torch.allclose(torch.tensor(s.logprobs), torch.tensor(e.logprobs), atol=atol, rtol=0)
        if e.entropies is not None:
            assert torch.allclose(torch.tensor(s.entropies), torch.tensor(e.entropies), atol=atol, rtol=0)


@pytest.mark.parametrize("model_name, mode", CASES)
def test_static_equals_eager_rows_stopping_at_different_lengths(request, model_name, mode):
    model, pad, prompts = request.getfixturevalue(model_name)
    sampling = SAMPLINGS[mode]
    seqs = [prompts[0]] * 3 + [prompts[1]] * 2 + [prompts[2]] * 3  # groups: repeated prompts
    probe, _ = _pair(model, pad, [pad])
    eos = [pad, _ending_id(probe, seqs, sampling)]
    limits = [10, 7, 10, 3, 10, 9, 10, 5]  # per-row budgets (resumed rollouts)
    eager, fast = _pair(model, pad, eos)
    eager.record_entropy = fast.record_entropy = True
    e = eager.generate(seqs, sampling, max_new_tokens=limits)
    s = fast.generate(seqs, sampling, max_new_tokens=limits)
    lengths = {len(c.token_ids) for c in e}
    assert len(lengths) >= 3 and {"stop", "length"} <= {c.finish for c in e}  # the case is exercised
    _assert_same(e, s)


@pytest.mark.parametrize("model_name", ["tiny", "smol"])
def test_padded_buckets_as_on_cuda_equal_eager(request, model_name):
    """The CUDA path's shapes without graphs: 7 rows padded to a bucket of 8, cache rounded up,
    finished rows moving to a smaller bucket, slots reused by a second call."""
    model, pad, prompts = request.getfixturevalue(model_name)
    sampling = SAMPLINGS["temperature"]
    seqs = [prompts[0]] * 4 + [prompts[1]] * 3
    probe, _ = _pair(model, pad, [pad])
    eos = [pad, _ending_id(probe, seqs, sampling)]
    eager, fast = _pair(model, pad, eos, pad_buckets=True, read_every=2)
    limits = [10, 3, 2, 2, 4, 2, 10]  # after step 2, five rows; after step 4, two
    for _ in range(2):
        _assert_same(
            eager.generate(seqs, sampling, max_new_tokens=limits), fast.generate(seqs, sampling, max_new_tokens=limits)
        )
    buckets = {k[0] for k in fast._static._slots}
    assert 8 in buckets and min(buckets) <= 2  # the live rows moved to smaller buckets


class _Hook:
    """ARRoL-like: wants steps 2 and 5, records what it is given, cuts row 1 at step 5."""

    def __init__(self):
        self.calls = []

    def wants(self, t):
        return t in (0, 2, 5)

    def __call__(self, t, rows, hidden, alive):
        self.calls.append((t, rows.clone(), hidden.float().clone(), alive.clone()))
        return rows == 1 if t == 5 else None


@pytest.mark.parametrize("model_name", ["tiny", "smol"])
def test_static_with_a_decode_hook_equals_eager(request, model_name):
    model, pad, prompts = request.getfixturevalue(model_name)
    sampling = SAMPLINGS["temperature"]
    seqs = [prompts[0]] * 2 + [prompts[2]] * 2
    eager, fast = _pair(model, pad, [pad], max_batch=3)  # two chunks: the hook's row indices carry offsets
    he, hs = _Hook(), _Hook()
    e = eager.generate(seqs, sampling, decode_hook=he)
    s = fast.generate(seqs, sampling, decode_hook=hs)
    _assert_same(e, s)
    assert e[1].finish == "partial" and len(e[1].token_ids) == 5
    assert [c[0] for c in hs.calls] == [c[0] for c in he.calls]  # not after all rows are done
    assert [c[0] for c in he.calls][:3] == [0, 2, 5]
    for (_, re_, he_, ae), (_, rs, hs_, as_) in zip(he.calls, hs.calls):
        assert torch.equal(rs, re_) and torch.equal(as_, ae)
        assert torch.allclose(hs_, he_, atol=1e-4)


def test_each_distinct_prompt_is_prefilled_once(tiny):
    model, pad, prompts = tiny
    seqs = [prompts[0]] * 4 + [prompts[1]] * 4
    widths = []
    handle = model.model.embed_tokens.register_forward_hook(lambda m, a, out: widths.append(tuple(a[0].shape)))
    try:
        _, fast = _pair(model, pad, [pad])
        fast.generate(seqs, SAMPLINGS["greedy"])
    finally:
        handle.remove()
    assert widths[0] == (2, max(len(p) for p in prompts[:2]))  # two prompts, not eight rows
    assert all(w == (8, 1) for w in widths[1:])  # then one token per row and step


def test_done_is_read_every_k_steps(tiny):
    """APRIL's stop_when is asked at the host reads only: every k = 4 steps (and the chunk ends
    there), where the eager path asks after every token."""
    model, pad, prompts = tiny
    eager, fast = _pair(model, pad, [pad], read_every=4)
    asked = {"eager": 0, "static": 0}

    def counter(name):
        def stop(done):
            asked[name] += 1
            return False

        return stop

    e = eager.generate(prompts, SAMPLINGS["greedy"], stop_when=counter("eager"))
    s = fast.generate(prompts, SAMPLINGS["greedy"], stop_when=counter("static"))
    _assert_same(e, s)
    assert asked == {"eager": 10, "static": 2}  # 10 steps: eager after each; static after 4 and 8 (10 ends)
    stopped = fast.generate(prompts, SAMPLINGS["greedy"], stop_when=lambda done: True)
    assert [len(c.token_ids) for c in stopped] == [4, 4, 4] and {c.finish for c in stopped} == {"partial"}


def test_grouped_attention_equals_repeated_kv():
    """Folding a K/V head's query heads into the query axis is the same attention as repeating
    K/V (hand-built 2 K/V heads x 3 query heads, a padding mask and a causal prefill)."""
    from transformers.integrations.sdpa_attention import repeat_kv

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, 4, 8, generator=g) for n in (6, 2, 2))
    mask = torch.ones(2, 1, 4, 4, dtype=torch.bool).tril()
    mask[1, :, :, 0] = False  # row 1: position 0 is padding
    mask[1, :, 0, 0] = True  # ...which attends to itself only
    got, _ = grouped_attention(None, q, k, v, mask, scaling=0.5)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, repeat_kv(k, 3), repeat_kv(v, 3), attn_mask=mask, scale=0.5
    )
    assert torch.allclose(got, ref.transpose(1, 2), atol=1e-6)
    one, _ = grouped_attention(None, q[:, :, -1:], k, v, mask[:, :, -1:, :3], scaling=0.5)  # decode: 3 positions read
    ref1 = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, -1:], repeat_kv(k[:, :, :3], 3), repeat_kv(v[:, :, :3], 3), attn_mask=mask[:, :, -1:, :3], scale=0.5
    )
    assert torch.allclose(one, ref1.transpose(1, 2), atol=1e-6)


def test_the_sampler_setting_is_checked_by_name():
    with pytest.raises(UserError, match=r"model\.sampler"):
        load_config(overrides=["model.sampler=fast"])
    assert load_config(overrides=["model.sampler=eager"]).model.sampler == "eager"


def test_auto_is_the_static_path_and_eager_stays_selectable(tiny):
    model, pad, _ = tiny
    assert HFBackend(model, [pad], pad, sampler="auto").sampler == "static"
    assert HFBackend(model, [pad], pad, sampler="eager")._static is None
    with pytest.raises(UserError, match=r"model\.sampler"):
        HFBackend(model, [pad], pad, sampler="fast")


def test_a_model_with_sliding_window_layers_keeps_the_eager_path():
    """Its static cache keeps a window, not the positions the static path's mask describes."""
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        sliding_window=4,
    )
    model = MistralForCausalLM(cfg)
    assert HFBackend(model, [0], 0, sampler="auto").sampler == "eager"
    with pytest.raises(UserError, match=r"model\.sampler = 'static': .*StaticSlidingWindowLayer"):
        HFBackend(model, [0], 0, sampler="static")


def test_static_equals_eager_through_a_lora_wrapper():
    """The policy as the trainer holds it with ``model.lora``: a peft wrapper (its B matrices
    moved off zero so that the adapters count)."""
    from rollwise.trainer.hf_models import apply_lora

    model, tok = build_tiny("tiny-s", seed=2)
    model = apply_lora(model, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"]).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2, generator=torch.Generator().manual_seed(len(n)))
    prompts = [[1] + tok.encode(s) for s in ("12+34=", "7+8=")]
    eager, fast = _pair(model, tok.pad_token_id, [tok.pad_token_id])
    assert fast.sampler == "static"
    seqs = [prompts[0]] * 2 + [prompts[1]] * 2
    _assert_same(eager.generate(seqs, SAMPLINGS["cooler_top_p"]), fast.generate(seqs, SAMPLINGS["cooler_top_p"]))


def test_multi_turn_episodes_through_the_static_path_equal_eager(tiny):
    """The episode pool (``rollwise.generate.episodes``) calls the backend for every turn: with
    the static path its episodes are the eager path's (lockstep schedule: reproducible)."""
    from rollwise.envs.base import StepResult
    from rollwise.generate.episodes import EpisodeLimits, EpisodePool
    from rollwise.tokens import Codec
    from rollwise.trainer.tiny import char_tokenizer
    from rollwise.types import Plan, Prompt, Request, Verdict

    model, pad, _ = tiny
    tok = char_tokenizer()

    class Env:
        def reset(self, seed):
            pass

        def step(self, action):
            return StepResult(" ok:", reward=0.5)

    class Task:
        name = "t"

        def train_prompts(self):
            return [Prompt("p0", "t", "12+34=", None, metadata={"seed": 3})]

        def verify(self, prompt, completion):
            return Verdict(None, "no")

        def environment(self, prompt):
            return Env()

    def episodes(backend):
        pool = EpisodePool(
            backend, Codec(tok, use_chat=False), Task(), Sampling(1.0, 1.0, 6), EpisodeLimits(max_turns=3)
        )
        try:
            return [r for _, r in pool.rollouts(Plan((Request(Task().train_prompts()[0], 3),)), version=0)]
        finally:
            pool.close()

    ends = [tok.eos_token_id] + list(range(0, len(tok), 3))  # a turn ends at one id in three: turns of several lengths
    eager, fast = _pair(model, pad, ends)
    e, s = episodes(eager), episodes(fast)
    assert [len(r.episode.turns) for r in s] == [len(r.episode.turns) for r in e]
    assert max(len(r.episode.turns) for r in e) > 1
    assert [r.completion_ids for r in s] == [r.completion_ids for r in e]
    for a, b in zip(e, s):
        assert torch.allclose(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-5, rtol=0)


def test_static_equals_eager_under_bf16_autocast(tiny):
    """``model.compute_dtype = bfloat16``: the keys leave the rotary embedding in fp32 and the values
    in bf16; the cache holds both in bf16, which is what autocast's attention reads them in."""
    model, pad, prompts = tiny
    seqs = [prompts[0]] * 3 + [prompts[1]] * 2
    eager, fast = _pair(model, pad, [pad])
    eager.compute_dtype = fast.compute_dtype = torch.bfloat16
    for sampling in (SAMPLINGS["greedy"], SAMPLINGS["temperature"]):
        _assert_same(eager.generate(seqs, sampling), fast.generate(seqs, sampling))


def test_the_models_own_forward_runs_unchanged_in_the_middle_of_a_static_decode(tiny):
    """Under train.async the trainer's thread runs the model's forwards (no padding mask) while the
    generator decodes. A decode hook runs in the middle of a decode, so it stands in for that thread:
    the model's own forward there equals its forward outside any decode (the static path's attention
    belongs to its generation copy; it was switched on the model itself, which then crashed)."""
    model, pad, prompts = tiny
    ids = torch.tensor([prompts[0]])
    with torch.no_grad():
        outside = model(input_ids=ids).logits
    inside = []

    class TrainerForward:
        def wants(self, t):
            return t == 2

        def __call__(self, t, rows, hidden, alive):
            with torch.no_grad():
                inside.append(model(input_ids=ids).logits)

    _, fast = _pair(model, pad, [pad])
    fast.generate(prompts, SAMPLINGS["temperature"], decode_hook=TrainerForward())
    assert len(inside) == 1 and torch.equal(inside[0], outside)


def test_a_shallow_copy_of_the_backend_decodes_its_own_model(tiny):
    """The asynchronous generator's backend is ``copy.copy`` of the run's, given a model of its own
    (distributed/async_pool.py): its static decodes read that model, as its eager ones do."""
    import copy

    model, pad, prompts = tiny
    other = build_tiny("tiny-s", seed=7)[0].eval()
    _, fast = _pair(model, pad, [pad])
    local = copy.copy(fast)
    local.model = other
    eager_other = HFBackend(other, [pad], pad, max_batch=16, sampler="eager")
    seqs = [prompts[0]] * 2 + [prompts[1]] * 2
    for sampling in (SAMPLINGS["greedy"], SAMPLINGS["temperature"]):
        e = eager_other.generate(seqs, sampling, generator=torch.Generator().manual_seed(5))
        s = local.generate(seqs, sampling, generator=torch.Generator().manual_seed(5))
        _assert_same(e, s)
