"""rollwise export: a checkpoint as a Hugging Face directory that from_pretrained loads and that
generates rollwise's greedy tokens (full and LoRA runs, merged or adapter), a GGUF file the gguf
package reads back, and final/ at the end of a run."""

import json

import pytest
import torch

from conftest import tiny_overrides
from rollwise.backends.hf import HFBackend
from rollwise.cli import main
from rollwise.registry import UserError
from rollwise.types import Sampling

N_NEW = 10


def _train(trained, tmp_path, name, copy=False, **extra):
    """A 2-step run with a checkpoint at each step, trained once per configuration in the session
    (``trained``, tests/conftest.py): exports only read it; ``copy``: the test's own copy to write into."""
    o = tiny_overrides(tmp_path, name=name, steps=2, **{"run.checkpoint_every": 1, "train.lr": 1e-2, **extra})
    return trained(o, copy_to=tmp_path / name if copy else None)


def _rollwise_greedy(run_dir, step=None):
    """Token ids rollwise's own backend generates greedily from the checkpoint, per held-out prompt."""
    from safetensors.torch import load_model

    from rollwise import components
    from rollwise.export import _policy, resolve_checkpoint

    cfg, model, codec = _policy(run_dir)
    load_model(model, str(resolve_checkpoint(run_dir, step) / "model.safetensors"))
    prompts = components.build_task(cfg).heldout_prompts()[:6]
    seqs = [codec.encode_prompt(p) for p in prompts]
    outs = HFBackend(model, codec.eos_ids, codec.pad_id).generate(seqs, Sampling(0.0, 1.0, N_NEW))
    return seqs, [list(o.token_ids) for o in outs], codec


def _hf_greedy(model, seqs, eos):
    out = []
    for s in seqs:  # one prompt at a time: no padding
        ids = model.generate(torch.tensor([list(s)]), do_sample=False, max_new_tokens=N_NEW, eos_token_id=eos)[
            0, len(s) :
        ].tolist()
        out.append(ids)
    return out


def test_export_full_run_loads_and_generates_rollwise_greedy_tokens(tmp_path, trained):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = _train(trained, tmp_path, "full")
    seqs, want, codec = _rollwise_greedy(run)
    with pytest.raises(SystemExit):  # a checkpoint that is not there: exit 2 naming the steps there
        main(["export", str(run), str(tmp_path / "x"), "--step", "7"])
    main(["export", str(run), str(tmp_path / "out"), "--gguf"])
    out = tmp_path / "out"
    model, tok = AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    assert tok.encode("12+3=", add_special_tokens=False) == codec.tokenizer.encode("12+3=", add_special_tokens=False)
    got = _hf_greedy(model, seqs, codec.tokenizer.eos_token_id)
    assert got == want and any(len(w) > 1 for w in want)
    print("greedy:", [tok.decode(w) for w in want])
    # GGUF: the gguf package reads it; transformers rebuilds the same weights (q/k permutation undone)
    import gguf

    reader = gguf.GGUFReader(out / "model.gguf")
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "blk.0.attn_q.weight", "blk.1.ffn_down.weight", "output_norm.weight"} <= names
    assert bytes(reader.fields["general.architecture"].parts[-1]).decode() == "llama"
    back = AutoModelForCausalLM.from_pretrained(out, gguf_file="model.gguf")
    sd, sd_back = model.state_dict(), back.state_dict()
    assert all(torch.allclose(sd[k], sd_back[k]) for k in sd)
    assert _hf_greedy(back, seqs, codec.tokenizer.eos_token_id) == want
    # the run's end wrote final/ the same way: the weights of the last checkpoint
    fin = AutoModelForCausalLM.from_pretrained(run / "final")
    assert all(torch.equal(v, fin.state_dict()[k]) for k, v in sd.items())
    meta = json.loads((out / "rollwise_export.json").read_text())
    assert meta["checkpoint"] == "step-2" and meta["gguf"] == "model.gguf"


def test_export_step_and_refusals(tmp_path, trained):
    run = _train(trained, tmp_path, "s", **{"run.keep_checkpoints": 3})
    seqs, want1, codec = _rollwise_greedy(run, step=1)
    from transformers import AutoModelForCausalLM

    from rollwise.export import export_run

    export_run(run, tmp_path / "s1", step=1, log=lambda m: None)
    assert (
        _hf_greedy(AutoModelForCausalLM.from_pretrained(tmp_path / "s1"), seqs, codec.tokenizer.eos_token_id) == want1
    )
    with pytest.raises(UserError, match=r"no checkpoint step-9; it has steps \[1, 2\]"):
        export_run(run, tmp_path / "s9", step=9)
    with pytest.raises(UserError, match="exists and is not empty"):
        export_run(run, tmp_path / "s1")
    with pytest.raises(UserError, match="--adapter needs a LoRA run"):
        export_run(run, tmp_path / "a", adapter=True)


def _perturb_adapters(run):
    """Write checkpoint step-3: step-2 with random LoRA B matrices (two RL steps may leave them at
    peft's zero init when every group's rewards are equal)."""
    from safetensors.torch import load_model

    from rollwise.export import _policy
    from rollwise.trainer import checkpoint

    _, model, _ = _policy(run)
    load_model(model, str(run / "checkpoints" / "step-2" / "model.safetensors"))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    state = torch.load(run / "checkpoints" / "step-2" / "state.pt", weights_only=False)
    checkpoint.save(run, 3, model, {k: v for k, v in state.items() if k not in ("rng", "step")}, keep=5)


def test_export_lora_run_merged_and_adapter(tmp_path, trained):
    pytest.importorskip("peft")
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    lora = {"model.lora.enabled": True, "model.lora.r": 4, "train.lr": 5e-2}
    run = _train(trained, tmp_path, "lora", copy=True, **lora)  # a copy: step-3 is written into it
    _perturb_adapters(run)  # step-3: LoRA B matrices surely non-zero, so merged != base
    seqs, want, codec = _rollwise_greedy(run)
    from rollwise.export import export_run

    export_run(run, tmp_path / "merged", log=lambda m: None)
    export_run(run, tmp_path / "adapter", adapter=True, log=lambda m: None)
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    eos = codec.tokenizer.eos_token_id
    assert _hf_greedy(merged, seqs, eos) == want
    acfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    base = AutoModelForCausalLM.from_pretrained(acfg["base_model_name_or_path"])
    with_adapter = PeftModel.from_pretrained(base, tmp_path / "adapter")
    assert _hf_greedy(with_adapter, seqs, eos) == want
    # the adapter did change the model: the bare base differs somewhere in its logits
    ids = torch.tensor([list(seqs[0])])
    assert not torch.allclose(
        AutoModelForCausalLM.from_pretrained(acfg["base_model_name_or_path"])(ids).logits, merged(ids).logits
    )


def test_export_gguf_without_the_package_writes_nothing_and_the_rerun_works(tmp_path, monkeypatch, capsys, trained):
    import sys

    run = _train(trained, tmp_path, "g")
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` raises ImportError
    with pytest.raises(SystemExit) as exc:
        main(["export", str(run), str(tmp_path / "out"), "--gguf"])
    assert exc.value.code == 2 and "gguf package" in capsys.readouterr().out
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.tmp").exists()  # nothing written before the refusal
    main(["export", str(run), str(tmp_path / "out")])  # the rerun is not refused for a non-empty directory
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_adapter_names_a_local_base_model_by_its_absolute_path(tmp_path, monkeypatch):
    """A LoRA run on a local model directory given relative to where training ran: the adapter's
    base_model_name_or_path is absolute, so it loads from any working directory."""
    pytest.importorskip("peft")
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rollwise.export import write_hf
    from rollwise.trainer.hf_models import apply_lora
    from rollwise.trainer.tiny import build_tiny

    model, tok = build_tiny("tiny-s", seed=0)
    model.save_pretrained(tmp_path / "models" / "base")
    tok.save_pretrained(tmp_path / "models" / "base")
    monkeypatch.chdir(tmp_path)
    base = AutoModelForCausalLM.from_pretrained("models/base")  # relative, as model.name = "models/base" loads it
    lora = apply_lora(base, r=2, alpha=4, dropout=0.0, target_modules=["q_proj", "v_proj"])
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    write_hf(lora, tok, "adapter", adapter=True)
    acfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert acfg["base_model_name_or_path"] == str((tmp_path / "models" / "base").resolve())
    assert not (tmp_path / "adapter" / "base").exists()  # the base has a directory of its own: not copied
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(acfg["base_model_name_or_path"]), tmp_path / "adapter"
    )
    ids = torch.tensor([[1, 5, 7, 9]])
    assert torch.allclose(loaded(ids).logits, lora(ids).logits, atol=1e-6)


def test_export_gguf_refused_for_its_architecture_leaves_no_directory(tmp_path, monkeypatch, trained):
    import rollwise.export as export

    run = _train(trained, tmp_path, "arch")

    def refuse(model, tokenizer, path):
        raise UserError("GGUF export supports Llama-architecture models; this model is 'gpt2'")

    monkeypatch.setattr(export, "write_gguf", refuse)
    with pytest.raises(UserError, match="Llama-architecture"):
        export.export_run(run, tmp_path / "out", gguf=True, log=lambda m: None)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("out*"))
    export.export_run(run, tmp_path / "out", log=lambda m: None)  # the rerun without --gguf is not refused
