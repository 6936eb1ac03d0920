"""The static decode path's CUDA graphs (``rollwise.backends.static_decode``, issue #42 item 5): a
graph replay decodes what the eager path decodes. Skipped without a CUDA device
(benchmarks/gpu_check.py runs it on a lent GPU)."""

import pytest
import torch

from conftest import smollm2_shaped_config
from rollwise.backends.hf import HFBackend
from rollwise.types import Sampling

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


@pytest.fixture(scope="module")
def smol():
    """SmolLM2-135M's attention shapes (9 heads over 3 K/V heads), two layers, random weights, on CUDA."""
    from transformers import LlamaForCausalLM

    cfg = smollm2_shaped_config(max_position_embeddings=512, pad_token_id=2, eos_token_id=2)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 on both paths, as on a CPU
    torch.backends.cudnn.allow_tf32 = False
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).cuda().eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 49152, (n,), generator=g).tolist() for n in (9, 5, 12)]
    return model, prompts


@pytest.mark.parametrize("sampling", [Sampling(0.0, 1.0, 12), Sampling(1.0, 1.0, 12), Sampling(1.0, 0.9, 12)])
def test_graph_replay_equals_eager_decoding(smol, sampling):
    model, prompts = smol
    seqs = [prompts[0]] * 3 + [prompts[1]] * 2 + [prompts[2]] * 2  # 7 rows: the bucket of 8
    limits = [12, 7, 12, 3, 12, 9, 5]  # rows stop at different lengths: the batch moves to smaller buckets
    eager = HFBackend(model, [2], 2, max_batch=16, seed=3, sampler="eager")
    fast = HFBackend(model, [2], 2, max_batch=16, seed=3, sampler="static")
    for _ in range(2):  # the second call replays the graphs the first captured
        e = eager.generate(seqs, sampling, max_new_tokens=limits)
        s = fast.generate(seqs, sampling, max_new_tokens=limits)
        for a, b in zip(e, s):
            assert b.token_ids == a.token_ids and b.finish == a.finish
            assert torch.allclose(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-4, rtol=0)
    assert fast._static.uses_graphs(torch.device("cuda")) and fast._static.captures >= 2  # buckets 8 and below


def test_a_graph_replay_reads_the_generation_copy_refreshed_in_place(smol):
    """bf16: after the master's weights change in place (as an optimizer step changes them) the captured
    graphs replay on the refreshed generation copy, without a new capture, and decode what a backend
    built after the change decodes."""
    import copy

    model, prompts = smol
    model = copy.deepcopy(model)
    seqs = [prompts[0]] * 3 + [prompts[1]] * 2
    sampling = Sampling(1.0, 1.0, 12)
    fast = HFBackend(model, [2], 2, max_batch=16, seed=3, compute_dtype=torch.bfloat16, sampler="static")
    fast.generate(seqs, sampling, generator=torch.Generator().manual_seed(4))
    captures, gen = fast._static.captures, fast._static.gen
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.mul_(-1.5)
    s = fast.generate(seqs, sampling, generator=torch.Generator().manual_seed(4))
    assert fast._static.captures == captures and fast._static.gen is gen
    fresh = HFBackend(model, [2], 2, max_batch=16, seed=3, compute_dtype=torch.bfloat16, sampler="static")
    f = fresh.generate(seqs, sampling, generator=torch.Generator().manual_seed(4))
    for a, b in zip(f, s):
        assert b.token_ids == a.token_ids
        assert torch.allclose(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-4, rtol=0)
