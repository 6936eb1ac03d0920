"""The ``model`` section: the policy, its LoRA adapters, the supervised warm start (with OTR's options,
``rollwise.objectives.otr``) and the rollout engine's options (``rollwise.backends``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rollwise.registry import UserError
from rollwise.sections import Section


class LoraConfig(Section):
    enabled: bool = Field(False, description="Train LoRA adapters instead of all weights (needs peft).")
    r: int = Field(16, ge=1, description="LoRA rank.")
    alpha: int = Field(32, ge=1, description="LoRA alpha.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="LoRA dropout.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="Module names that get adapters.",
    )


class OtrOptions(BaseModel):
    """The options of ``rollwise.objectives.otr`` (its ``OtrOptions``): schema here, behaviour there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    samples: int = Field(8, ge=1, description="K candidate tokens sampled per position (spec [RECON] value).")
    negative: float = Field(
        0.0, le=0.0, description="Reward of a candidate that is not the gold token (0 or small negative; unverified)."
    )
    temperature: float = Field(1.0, gt=0.0, description="Sampling temperature of the candidates.")
    mode: Literal["sample", "exact"] = Field(
        "sample",
        description="'sample' K candidates (the paper), or 'exact': the expectation "
        "over the vocabulary (ours; the K -> infinity limit).",
    )


class WarmStartConfig(Section):
    steps: int = Field(
        1150,
        ge=0,
        description="Supervised steps on task examples before RL (built-in tiny model; a pretrained "
        "model only with pretrained = true; 0 = none).",
    )
    pretrained: bool = Field(
        False,
        description="Also warm-start a pretrained (Hugging Face / GGUF) model, e.g. to teach "
        "SmolLM2 a task's answer format before RL (full fine-tune, before LoRA; cached like the tiny "
        "model's). Off by default: a pretrained model starts RL as loaded.",
    )
    batch_size: int = Field(64, ge=1, description="Warm-start batch size.")
    lr: float = Field(1e-3, gt=0, description="Warm-start learning rate.")
    seed: int = Field(
        0,
        ge=0,
        description="Seed of the warm start (independent of run.seed, so seeds of a comparison share one warm start).",
    )
    cache: bool = Field(
        True, description="Cache the warm-started weights under ~/.cache/rollwise (or $ROLLWISE_CACHE)."
    )
    objective: Literal["sft", "otr"] = Field(
        "sft",
        description="'sft': cross-entropy on the reference completion; 'otr': One-Token "
        "Rollout, a one-token policy gradient on sampled candidates (rollwise.objectives.otr).",
    )
    otr: OtrOptions = Field(default_factory=OtrOptions, description="OTR options (objective = 'otr' only).")


class VllmConfig(Section):
    kv_cache_gib: float = Field(
        1.0,
        gt=0,
        description="CPU: GiB of memory for vLLM's KV cache (VLLM_CPU_KVCACHE_SPACE, rounded up "
        "to whole GiB); ignored on GPU.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "error",
        description="Level of vLLM's own log lines. Below 'error' a run shows two known-harmless warnings: 'Chat "
        "template warmup failed ... ValueError: Tokenizer not available' at start (rollwise sends token "
        "ids; vLLM's tokenizer is deliberately not loaded) and 'RotaryEmbedding: Failed to load weights' "
        "after each push (the rotary cos/sin cache is computed from the config, not loaded, and vLLM "
        "puts it back; the sampler/trainer gap stays ~3e-7 per token on CPU).",
    )
    sleep_level: int = Field(
        0,
        ge=0,
        le=2,
        description="GPU: vLLM sleep mode between generations, so training gets the "
        "memory back: 0 off, 1 (weights offloaded to CPU, KV cache freed), 2 (weights and KV cache "
        "freed; the next push reloads them). Wakes in stages: weights, load, KV cache "
        "(rollwise.backends.vllm.SleepCycle).",
    )
    gpu_memory_utilization: float = Field(
        0.3,
        gt=0,
        le=1,
        description="GPU: share of GPU memory vLLM may take (weights + KV "
        "cache); the trainer shares the device, so keep it well below 1.",
    )
    enforce_eager: bool = Field(
        True, description="Run vLLM without CUDA graphs / torch.compile (faster start; required on CPU here)."
    )
    max_model_len: int | None = Field(
        None,
        ge=16,
        description="Longest prompt + completion vLLM plans for (default: the model's "
        "max_position_embeddings, capped at 4096).",
    )


class ModelConfig(Section):
    name: str = Field(
        "tiny",
        description="'tiny' / 'tiny-s' / 'tiny-m' / 'tiny-l' (built-in), 'smollm2-135m', a local HF model directory, "
        "or a .gguf file.",
    )
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Weights and compute dtype.")
    compute_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="Dtype the policy's matrix products run in (generation, scoring, training) while weights, "
        "gradients and optimizer state stay in model.dtype (bf16 autocast, fp32 master weights; "
        "rollwise.hardware.precision). 'auto': the faster of the two here: on a CPU, measured on the model's own "
        "matrix shapes at the first run (a few seconds; bf16 only if >= 1.1x as fast) and cached per CPU and torch "
        "version; on CUDA, bfloat16 when the GPU supports it. The choice and its reason are logged and written to "
        "metrics.jsonl (precision/*). An explicit float32 / bfloat16 always wins.",
    )
    rollout_precision: Literal["model", "fp8"] = Field(
        "model",
        description="Precision of the sampler's linear layers: 'model' (model.dtype / model.compute_dtype, as the "
        "trainer) or 'fp8': Jet-RL's FP8 rollouts (arXiv 2601.14243), emulated: every decoder linear layer of the "
        "sampler's module (sharing the policy's weights) quantises its weights (block x block scales) and inputs "
        "(1 x block scales) to float8 e4m3 and back (rollwise.hardware.fp8). hf backend only; the trainer stays in "
        "model precision unless train.matched_quantisation.",
    )
    fp8_block_size: int = Field(
        128,
        ge=1,
        description="Tile size of model.rollout_precision = 'fp8': one scale per block x block weight tile and per "
        "block consecutive input features of a token (128: the DeepSeek-V3 granularity Jet-RL builds on).",
    )
    fp8_gemm: Literal["emulated", "scaled_mm"] = Field(
        "emulated",
        description="How model.rollout_precision = 'fp8' multiplies: 'emulated' (quantise to e4m3 and back, then "
        "the model's own matmul; any device) or 'scaled_mm' (the e4m3 codes multiplied by torch._scaled_mm, FP8 "
        "tensor cores on a GPU of compute capability 8.9 or newer, torch's CPU kernel on a CPU). The same "
        "products up to the order of fp32 additions (rollwise.hardware.fp8).",
    )
    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda(:\d+)?)$",
        description="Where the policy, the reference, the hf sampler, the trainer and the warm start run: "
        "'auto' (cuda when torch sees a CUDA device, else cpu), 'cpu', 'cuda' or 'cuda:N' "
        "(rollwise.hardware.device; memory is checked against the device before the model moves there).",
    )
    max_batch: int = Field(256, ge=1, description="Most sequences per generation forward pass.")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA options.")
    warm_start: WarmStartConfig = Field(
        default_factory=WarmStartConfig, description="Supervised warm start of the built-in model."
    )
    sampler: Literal["auto", "static", "eager"] = Field(
        "auto",
        description="How the hf backend decodes: 'static' (preallocated KV cache per batch bucket, grouped-query "
        "attention without K/V copies, each group's prompt prefilled once, fp32 sampling on the device, 'done' "
        "read every 8 steps, one CUDA graph per bucket on CUDA, on a generation copy of the weights whose linears "
        "are in the compute dtype, LoRA merged; rollwise.backends.static_decode) or 'eager' (a growing cache, host "
        "checks after every token). 'auto': static (measured faster on a CPU; on CUDA by design, not yet measured), "
        "train.async included.",
    )
    backend: Literal["hf", "vllm"] = Field(
        "hf",
        description="Rollout engine: 'hf' (rollwise's own sampler on the trainer's module) or "
        "'vllm' (vLLM in the trainer's process, weights pushed after every optimizer step; "
        "pip install 'rollwise[vllm]'; rollwise.backends.vllm).",
    )
    vllm: VllmConfig = Field(
        default_factory=VllmConfig, description="vLLM engine options (model.backend = 'vllm' only)."
    )


def check_lora(model: ModelConfig) -> None:
    """``model.lora.enabled`` trains adapters with peft, an optional extra: refused at load when it is not
    installed, before any model loads."""
    if model.lora.enabled:
        import importlib.util

        if importlib.util.find_spec("peft") is None:
            raise UserError("model.lora.enabled needs peft: pip install 'rollwise[hf]'")
