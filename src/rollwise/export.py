"""Model export (``rollwise export`` and a run's ``final/``): a checkpoint as a standard Hugging
Face model directory, and optionally a GGUF file.

Contract:

- ``export_run(run_dir, out_dir, step=None, adapter=False, gguf=False)`` rebuilds the run's
  policy from ``config.resolved.toml`` (no warm start; the task is built, as the policy's
  checks read it), loads the verified
  checkpoint ``step-<step>`` (default: the newest that verifies, see ``trainer/checkpoint.py``)
  and writes ``out_dir`` with ``write_hf``. Refuses (``UserError``) a missing run, a missing
  step (naming the steps there), a non-empty ``out_dir`` and ``--adapter`` on a run without
  LoRA, all before the model is built; with ``gguf=True`` it first checks that the ``gguf``
  package imports, and writes the GGUF file before the directory, so a GGUF refusal leaves
  nothing that a rerun would have to clear.
- ``write_hf(model, tokenizer, out_dir, adapter)``: ``config.json``, ``generation_config.json``,
  ``model.safetensors``, and the tokenizer files, so ``AutoModelForCausalLM.from_pretrained``
  and ``AutoTokenizer.from_pretrained`` load it. LoRA runs: the adapters folded into the base
  weights (``hf_models.merged_state_dict``; the training model is not modified), or with
  ``adapter=True`` the PEFT adapter directory (``adapter_config.json`` +
  ``adapter_model.safetensors``, loaded with ``peft.PeftModel.from_pretrained`` over the base);
  ``base_model_name_or_path`` is an absolute path: the base model's own directory (a relative
  ``model.name`` resolved against the working directory of the export), or, for a built-in base
  model, which has no directory of its own, ``<out>/base/`` where it is written.
  Written to ``<out>.tmp`` and renamed, so a kill never leaves half a directory.
- Greedy equality: rollwise's prompts are the codec's token ids (``tokens.Codec``: BOS + text
  for the built-in character model, the chat template for instruct models); the exported model
  given the same ids and ``do_sample=False`` generates the tokens rollwise's greedy decoding
  does (tests/integration/test_export.py).
- ``write_gguf(model, tokenizer, path)``: a float32 GGUF of a Llama-architecture model (the
  built-in tiny models, SmolLM2, Llama): llama.* metadata, the tokenizer's token list and special
  ids, and tensors under llama.cpp's names (``gguf.get_tensor_name_map``) with the q/k
  projection rows permuted the way llama.cpp's converter does (its rotary layout). Other
  architectures raise ``UserError``. Read back with ``gguf.GGUFReader``; transformers' GGUF
  loader rebuilds the same weights from it. Not checked here: running it in llama.cpp, which
  for the built-in character tokenizer would need a tokenizer model llama.cpp knows.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from rollwise.registry import UserError


def is_lora(model) -> bool:
    return hasattr(model, "peft_config")


def _fresh_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise UserError(f"export directory {out} exists and is not empty; choose another directory")


def write_hf(model, tokenizer, out_dir: str | Path, adapter: bool = False, overwrite: bool = False) -> Path:
    """Write ``model`` (and ``tokenizer``) as a Hugging Face directory; see the module docstring."""
    out = Path(out_dir)
    _fresh_dir(out, overwrite)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:  # a failed write (a full disk) leaves no half directory
        if adapter:
            if not is_lora(model):
                raise UserError("--adapter needs a LoRA run (model.lora.enabled = true)")
            model.save_pretrained(str(tmp))
            source = getattr(model.get_base_model().config, "_name_or_path", "")
            if source and Path(source).expanduser().is_dir():  # a local model directory: named by its absolute path,
                base = Path(source).expanduser().resolve()  # so the adapter loads from any working directory
            else:  # built-in model: its base weights go beside the adapter
                _plain(model, merged=False).save_pretrained(str(tmp / "base"))
                tokenizer.save_pretrained(str(tmp / "base"))
                base = (out / "base").resolve()
            cfg_path = tmp / "adapter_config.json"
            acfg = json.loads(cfg_path.read_text())
            acfg["base_model_name_or_path"] = str(base)
            cfg_path.write_text(json.dumps(acfg, indent=2))
        elif is_lora(model):
            _plain(model, merged=True).save_pretrained(str(tmp))
        else:
            model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def _plain(model, merged: bool):
    """The base model of a LoRA ``model`` without adapter layers: with the adapters folded in
    (``merged``) or its original weights."""
    from rollwise.trainer.hf_models import merged_state_dict

    base = model.get_base_model()
    if merged:
        state = merged_state_dict(model)
    else:
        state = {
            k.replace(".base_layer.", "."): v.detach().clone()
            for k, v in base.state_dict().items()
            if not any(p.startswith("lora_") for p in k.split("."))
        }
    plain = type(base)(base.config)
    missing, unexpected = plain.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:  # a tied lm_head is the embedding
        raise RuntimeError(
            f"LoRA export: weights do not fit the base model (missing {missing}, unexpected {unexpected})"
        )
    return plain.to(next(base.parameters()).dtype)


def _policy(run_dir: Path):
    """The run's config and its policy built without warm start (weights come from a checkpoint)."""
    from rollwise import components
    from rollwise.config import load_config

    cfg = load_config(
        run_dir / "config.resolved.toml", ["model.warm_start.steps=0", "run.progress=false", "train.fsdp=false"]
    )
    model, codec = components.build_policy(cfg, components.build_task(cfg), log=lambda m: None)
    return cfg, model, codec


def resolve_checkpoint(run_dir: Path, step: int | None, log=print) -> Path:
    from rollwise.trainer import checkpoint

    if not (run_dir / "config.resolved.toml").is_file():
        raise UserError(f"{run_dir} is not a run directory (no config.resolved.toml)")
    if step is None:
        path = checkpoint.latest(run_dir, log=log)
        if path is None:
            raise UserError(f"no checkpoint in {run_dir}")
        return path
    steps = checkpoint.list_steps(run_dir)
    if step not in steps:
        raise UserError(f"{run_dir} has no checkpoint step-{step}; it has steps {steps}")
    path = checkpoint.ckpt_dir(run_dir) / f"step-{step}"
    problem = checkpoint.verify(path)
    if problem is not None:
        raise UserError(f"checkpoint {path} is corrupted: {problem}")
    return path


def export_run(
    run_dir: str | Path,
    out_dir: str | Path,
    step: int | None = None,
    adapter: bool = False,
    gguf: bool = False,
    log=print,
) -> Path:
    """``rollwise export``: see the module docstring. Returns the output directory."""
    from safetensors.torch import load_model

    run_dir, out = Path(run_dir), Path(out_dir)
    if not run_dir.is_dir():
        raise UserError(f"run directory not found: {run_dir}")
    if gguf:  # before anything is written: a failed GGUF step would leave a directory the rerun refuses
        _gguf_module()
    ckpt = resolve_checkpoint(run_dir, step, log)
    _fresh_dir(out, overwrite=False)
    cfg, model, codec = _policy(run_dir)
    if adapter and not cfg.model.lora.enabled:
        raise UserError(f"--adapter needs a LoRA run; {run_dir} has model.lora.enabled = false")
    load_model(model, str(ckpt / "model.safetensors"))
    from rollwise import storage

    meta = {"run_dir": str(run_dir), "checkpoint": ckpt.name, "adapter": adapter}
    staged = out.with_name(out.name + ".model.gguf")  # GGUF first: one it refuses (architecture) leaves no directory
    with storage.guard(str(out), out.parent, then="run the export again"):  # a full disk: one line, no traceback
        try:
            if gguf:
                write_gguf(model, codec.tokenizer, staged)
            write_hf(model, codec.tokenizer, out, adapter=adapter)
            if gguf:
                os.replace(staged, out / "model.gguf")
                meta["gguf"] = "model.gguf"
        finally:
            staged.unlink(missing_ok=True)
        (out / "rollwise_export.json").write_text(json.dumps(meta, indent=1))
    log(f"exported {ckpt} to {out}")
    return out


# ----------------------------------------------------------------------------- GGUF


def rotary_permute(w, n_head: int):
    """llama.cpp's layout of a q/k projection: within each head, the rows of the two rotary halves
    interleaved (row i of half 0, row i of half 1, ...). ``w`` has ``n_head * head_dim`` rows."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_module():
    """The ``gguf`` package, or ``UserError`` saying how to install it."""
    try:
        import gguf
    except ImportError:
        raise UserError(
            "--gguf needs the gguf package (not installed here): pip install 'rollwise[hf]' "
            "(or pip install gguf), then rerun the export"
        ) from None
    return gguf


def write_gguf(model, tokenizer, path: str | Path) -> Path:
    """A float32 GGUF of a Llama-architecture ``model``; see the module docstring."""
    gguf = _gguf_module()
    if is_lora(model):
        from rollwise.trainer.hf_models import merged_state_dict

        state, config = merged_state_dict(model), model.get_base_model().config
    else:
        state, config = model.state_dict(), model.config
    if getattr(config, "model_type", None) != "llama":
        raise UserError(f"GGUF export supports Llama-architecture models; this model is {config.model_type!r}")
    n_layers, n_head = config.num_hidden_layers, config.num_attention_heads
    n_kv = config.num_key_value_heads or n_head
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(getattr(config, "_name_or_path", "") or "rollwise-export")
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    w.add_rope_dimension_count(config.hidden_size // n_head)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab = tokenizer.get_vocab()
    size = max(config.vocab_size, max(vocab.values()) + 1)
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [gguf.TokenType.UNUSED] * size
    special = set(tokenizer.all_special_ids)
    for tok, i in vocab.items():
        tokens[i] = tok
        types[i] = gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([])
    for attr, add in (
        ("bos_token_id", w.add_bos_token_id),
        ("eos_token_id", w.add_eos_token_id),
        ("pad_token_id", w.add_pad_token_id),
        ("unk_token_id", w.add_unk_token_id),
    ):
        if getattr(tokenizer, attr, None) is not None:
            add(getattr(tokenizer, attr))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_layers)
    for key, tensor in state.items():
        if key == "lm_head.weight" and getattr(config, "tie_word_embeddings", False):
            continue  # llama.cpp ties the output to token_embd when "output" is absent
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise UserError(f"GGUF export: no llama.cpp name for tensor {key!r}")
        data = tensor.detach().float().cpu().numpy()
        if key.endswith("self_attn.q_proj.weight"):
            data = rotary_permute(data, n_head)
        elif key.endswith("self_attn.k_proj.weight"):
            data = rotary_permute(data, n_kv)
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)
    return path
