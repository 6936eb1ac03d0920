"""Typed configuration (docs/architecture.md §6): pydantic models, one section per stage, loaded from TOML
and overridden with ``section.key=value`` strings. Defaults live only here. ``load_config``
rejects unknown keys, bad values, unknown strategy names and invalid strategy options before
any model is loaded, naming the key and the valid choices.

This module is the schema and imports no strategy module. The options of features that have a
fixed section here (``sampling.arrol``, ``batch.d3s``, ``reward.ttrl``, ``model.warm_start.otr``,
``train.ess_lr_scaling``) are defined here (``ArrolOptions``, ``D3SOptions``, ...) and the
strategy modules alias them (strategy -> config, never config -> strategy). The ``options`` of a
named strategy (``control.options``, ``advantage.options``, ...) and the FAPO detector are
validated through the registries by ``rollwise.compat.check``, which ``load_config`` calls
after the schema, together with every refusal between parts (the compatibility table).
``train.async`` is the field ``TrainConfig.async_`` (``async`` is a Python keyword) with the
alias ``async``: TOML, ``--set`` and dumps write ``train.async``; Python reads ``cfg.train.async_``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import tomllib
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from rollwise.registry import UserError, format_validation


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(Section):
    name: str | None = Field(
        None,
        description="Run name; the run directory is <dir>/<name>. Default: "
        "<task>-<model>-<controller>-<objective>-s<seed>, with -2, -3, ... added when a run of that name exists (an "
        "explicit name is never reused: --resume continues it).",
    )
    dir: str = Field("runs", description="Parent directory of run directories.")
    seed: int = Field(0, ge=0, description="Seed for model init, prompt order and sampling.")
    checkpoint_every: int = Field(100, ge=0, description="Save a checkpoint every N steps (0: only at the end).")
    keep_checkpoints: int = Field(
        2,
        ge=1,
        description="How many most recent checkpoints to keep (older ones are deleted once a "
        "new one is complete and verified on disk).",
    )
    report_to: list[Literal["tensorboard", "wandb", "mlflow", "trackio"]] = Field(
        default_factory=list,
        description="Experiment trackers that get every metrics.jsonl / eval.jsonl scalar (against step "
        "and generated tokens) and the config, as HF TrainingArguments.report_to; each an optional extra "
        "(pip install 'rollwise[track]'); see rollwise.trackers.",
    )
    threads: int | None = Field(None, ge=1, description="torch CPU threads (default: all cores).")
    overwrite: bool = Field(False, description="Replace an existing run directory instead of refusing.")
    progress: bool = Field(True, description="Show a progress bar.")
    force: bool = Field(
        False,
        description="Train even when the first step's probe would stop the run: more than half of "
        "the completions cut at sampling.max_new_tokens (pretrained models), or a measured step time that "
        "puts the remaining steps past 24 h (rollwise.defaults.probe).",
    )


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
    backend: Literal["hf", "vllm"] = Field(
        "hf",
        description="Rollout engine: 'hf' (rollwise's own sampler on the trainer's module) or "
        "'vllm' (vLLM in the trainer's process, weights pushed after every optimizer step; "
        "pip install 'rollwise[vllm]'; rollwise.backends.vllm).",
    )
    vllm: VllmConfig = Field(
        default_factory=VllmConfig, description="vLLM engine options (model.backend = 'vllm' only)."
    )


class StrategyConfig(Section):
    name: str
    options: dict[str, Any] = Field(
        default_factory=dict, description="Options of the chosen strategy (validated by it)."
    )


class TaskConfig(StrategyConfig):
    name: str = Field("arithmetic", description="'arithmetic', 'reasoning_gym:<dataset>' or 'jsonl:<path>'.")
    max_train_prompts: int = Field(
        0,
        ge=0,
        description="RL draws its prompts from the first N of the task's train split only "
        "(0 = all; like verl's data.train_max_samples): a small pool recurs every few steps, which "
        "history-based strategies (GRESO, SPEC-RL, replay) need. The warm start still uses the whole split.",
    )
    # Multi-turn episodes (environment tasks, e.g. guess_number; rollwise.generate.episodes, docs/architecture.md §11).
    max_turns: int = Field(
        8, ge=1, description="Environment tasks: policy turns per episode at most (the episode ends 'max_turns')."
    )
    max_tool_calls: int = Field(
        8,
        ge=0,
        description="Environment tasks: tool calls per episode at most; the tool layer marks further calls 'limit' "
        "and does not run them.",
    )
    max_episode_tokens: int = Field(
        256,
        ge=1,
        description="Environment tasks: policy + observation tokens per episode at most; a turn decodes at most "
        "min(sampling.max_new_tokens, what is left); the episode ends 'token_budget'.",
    )
    max_observation_tokens: int = Field(
        64,
        ge=1,
        description="Environment tasks: an observation (tool output, feedback) is cut to this many of its own "
        "tokens (a chat template's tokens around it are kept).",
    )
    tool_timeout_s: float = Field(10.0, gt=0, description="Environment tasks: wall-clock limit of one tool call.")
    tool_workers: int = Field(
        8, ge=1, description="Environment tasks: environment steps (tool calls) run in parallel, in threads."
    )
    episode_schedule: Literal["lockstep", "overlap"] = Field(
        "lockstep",
        description="Environment tasks: 'lockstep' = every turn waits for all environment steps (reproducible for a "
        "seed); 'overlap' = episodes whose step is done generate while others wait on slow tools (faster, not "
        "bit-reproducible).",
    )


class TreeSamplingConfig(Section):
    """LATR tree rollouts (arXiv 2510.24302; systems.md §6; ``rollwise.generate.latr``). Defaults are the
    released code's dataclass defaults and, for the schedule, its Countdown script."""

    enabled: bool = Field(
        False,
        description="Generate a share of each training group as a LATR tree (hf backend only; evaluation never "
        "uses it; not with sampling.arrol or a replay that generates itself, e.g. APRIL, SPEC-RL). The tree phase "
        "decodes at most model.max_batch rows per forward (roots in chunks).",
    )
    schedule: dict[int, float] = Field(
        default_factory=lambda: {0: 1.0, 10: 0.75, 20: 0.5, 80: 0.25, 200: 0.0},
        description="eta by training step: k = round(n * eta) of a group's n rollouts come from the tree (value of "
        "the largest step key <= step; 0 before the first key; k < 2 means no tree). The step looked up is the policy "
        "version the rollouts are generated with (RunState.policy_version), which the synchronous training loop "
        "advances once per step, so it equals the training step. Default: the Countdown script's schedule.",
    )
    max_branch_per_token: int = Field(
        2,
        ge=2,
        description="m: top-m raw-probability candidates considered at each step (rank 1 continues the branch).",
    )
    tau_abs: float = Field(
        0.25,
        ge=0.0,
        description="Branch on candidate j only if p_j > tau_abs (raw, temperature-free probability; >= 1 never "
        "branches).",
    )
    tau_rel: float = Field(0.15, ge=0.0, description="... and p_1 - p_j < tau_rel.")
    lookahead: list[int] = Field(
        default_factory=lambda: [20, 30, 50],
        description="r: ages (tokens since birth) at which a child is compared with its parent and maybe pruned.",
    )
    ed_threshold: float | None = Field(
        0.4, ge=0.0, description="Prune if normalised Levenshtein distance < this (None = test off)."
    )
    suffix_threshold: float | None = Field(
        None, ge=0.0, description="Prune if the suffix-match score > this (None = off; LATR math scripts: 0.2)."
    )
    rouge_threshold: float | None = Field(
        None, ge=0.0, description="Prune if token ROUGE-L F > this (None = off; LATR math scripts: 0.5)."
    )
    keep_math_symbols: bool = Field(
        True,
        description="Never prune a child whose divergence point is an operator token (+ - * / = ^ ( ) < > %) in the "
        "parent.",
    )
    exit_fraction: float = Field(
        0.98,
        gt=0.0,
        le=1.0,
        description="Leave the tree phase once the full roots reach (exit_fraction - exit_decay * t / "
        "force_return_step) of all k's.",
    )
    exit_decay: float = Field(0.05, ge=0.0, description="return_nb_thres_decay of the released scripts.")
    force_return_step: int = Field(
        512, ge=0, description="Leave the tree phase after this many tokens at the latest (Countdown 512, math 1024)."
    )

    @model_validator(mode="after")
    def _check(self):
        bad = {k: v for k, v in self.schedule.items() if k < 0 or not 0.0 <= v <= 1.0}
        if bad:
            raise ValueError(f"sampling.latr.schedule needs step keys >= 0 and eta values in [0, 1], got {bad}")
        if not self.lookahead or any(r < 1 for r in self.lookahead):
            raise ValueError(f"sampling.latr.lookahead must be a non-empty list of ages >= 1, got {self.lookahead}")
        return self


class ArrolOptions(BaseModel):
    """The options of ``rollwise.generate.arrol`` (its ``Options``): schema here, behaviour there."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    oversample: float = Field(
        2.0, ge=1.0, description="N_0 = ceil(oversample * n) rollouts started per request of n (spec example: 2)."
    )
    check_tokens: int | None = Field(
        None,
        ge=1,
        description="Check point L_p in generated tokens (default ceil(check_fraction * sampling.max_new_tokens)); "
        "must be < max_new_tokens.",
    )
    check_fraction: float = Field(
        0.25,
        gt=0.0,
        lt=1.0,
        description="Check point as a fraction of sampling.max_new_tokens, if check_tokens is unset [RECON].",
    )
    target_ratio: float = Field(
        0.5, gt=0.0, lt=1.0, description="rho: survivors' mean predicted success is steered towards this (paper: 0.5)."
    )
    head: Literal["linear", "mlp"] = Field(
        "linear", description="Quality head on the last hidden state: 'linear' (w^T h + b) or 'mlp' (one hidden layer)."
    )
    head_hidden: int = Field(64, ge=1, description="Hidden width of the 'mlp' head.")
    head_lr: float = Field(1e-2, gt=0.0, description="Adam learning rate of the head.")
    head_steps: int = Field(50, ge=1, description="Full-batch BCE steps on the buffer after each generation call.")
    buffer: int = Field(4096, ge=1, description="Most (feature, reward) pairs kept for head training (FIFO).")
    min_examples: int = Field(
        64, ge=0, description="Pruning stays off until the head has seen this many pairs [RECON]."
    )
    min_auc: float = Field(
        0.6,
        ge=0.0,
        le=1.0,
        description="... and until its averaged prequential AUC reaches this [RECON] (0 = prune once min_examples is "
        "met).",
    )
    auc_decay: float = Field(
        0.5,
        ge=0.0,
        lt=1.0,
        description="Exponential averaging of the per-call AUC: auc = decay * auc + (1 - decay) * new.",
    )


class ArrolConfig(ArrolOptions):
    enabled: bool = Field(
        False,
        description="ARRoL online rollout pruning (arXiv 2603.24840; rollwise.generate.arrol): start "
        "oversample * n rollouts per prompt and, at the check point, stop all but n, chosen so that their "
        "predicted success (a quality head on the policy's hidden state, trained online) is balanced "
        "(hf backend only; evaluation never uses it).",
    )


class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature for training rollouts (0 = greedy).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_new_tokens: int = Field(8, ge=1, description="Most tokens generated per rollout.")
    latr: TreeSamplingConfig = Field(
        default_factory=TreeSamplingConfig, description="LATR tree rollouts (off by default)."
    )
    arrol: ArrolConfig = Field(
        default_factory=ArrolConfig, description="ARRoL online rollout pruning (off by default)."
    )


class DynamicSamplingConfig(Section):
    enabled: bool = Field(
        False,
        description="Dynamic sampling for groups the filters drop (needs 'zero_variance' in filter.names); "
        "what it does is 'type'.",
    )
    type: Literal["refill", "replace"] = Field(
        "refill",
        description="'refill' (DAPO, arXiv 2503.14476): while fewer than target_groups "
        "groups pass the filters, generate groups for fresh prompts in another round (needs a "
        "controller with a prompt stream, e.g. 'uniform'). 'replace' (POLARIS / SkyRL): each dropped "
        "group is replaced by a copy of a random kept group of the same batch; a batch with too "
        "few kept groups is discarded and a new one generated (rollwise.control.rounds).",
    )
    max_rounds: int = Field(
        4,
        ge=1,
        description="Most generation rounds per step, the first included (every round is charged to the "
        "ledger); 'refill' only.",
    )
    target_groups: int | None = Field(
        None,
        ge=1,
        description="Groups to train on per step (default prompts_per_step); kept groups beyond it "
        "are dropped, the last generated first, as filter/surplus; 'refill' only.",
    )
    min_replace_ratio: float = Field(
        0.3,
        ge=0.0,
        lt=1.0,
        description="'replace': a batch of B groups is used only when more than "
        "min_replace_ratio * B of them pass the filters (strictly); otherwise it is discarded (SkyRL 0.3).",
    )
    max_failed_batches: int = Field(
        30,
        ge=-1,
        description="'replace': discarded batches in one step that raise an error "
        "(SkyRL max_sample_batches; -1 = unlimited).",
    )
    replace_merge: bool = Field(
        True,
        description="'replace': a copy joins its source group (SkyRL: one group of 2n rollouts, "
        "advantages over the merged group); false = the copy is a group of its own (POLARIS).",
    )

    @model_validator(mode="after")
    def _type_fields(self):
        if self.type == "replace" and self.target_groups is not None:
            raise ValueError(
                "control.dynamic_sampling.target_groups is for type 'refill'; 'replace' trains on the batch it keeps"
            )
        if self.max_failed_batches == 0:
            raise ValueError("control.dynamic_sampling.max_failed_batches must be >= 1, or -1 for unlimited")
        return self


class ControlConfig(StrategyConfig):
    name: str = Field("uniform", description="Controller: which prompts and how many rollouts each.")
    prompts_per_step: int = Field(32, ge=1, description="Prompts drawn per step.")
    rollouts_per_prompt: int = Field(8, ge=1, description="Rollouts per prompt (group size n).")
    budget_rollouts: int | None = Field(
        None,
        ge=1,
        description="Most rollouts per step over all of the controller's rounds "
        "(default: the controller's own, prompts_per_step * rollouts_per_prompt for 'uniform').",
    )
    budget_tokens: int | None = Field(
        None,
        ge=1,
        description="Most expected generated tokens per step: planned rollouts x the mean "
        "completion length of the last 4 recorded steps (sampling.max_new_tokens before any data); "
        "see rollwise.control.budget (None = no token cap).",
    )
    dynamic_sampling: DynamicSamplingConfig = Field(
        default_factory=DynamicSamplingConfig,
        description="Dynamic sampling for groups dropped by the filters: DAPO refill or POLARIS/SkyRL replace.",
    )
    # sampling.max_new_tokens of the enclosing Config (set by Config): the token budget's length
    # estimate before any data (rollwise.control.budget); not a user setting, never serialised.
    _max_new_tokens: int | None = PrivateAttr(None)


class D3SOptions(BaseModel):
    """The options of ``rollwise.batch.d3s`` (its ``Options``): schema here, behaviour there."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    sample_level: bool = Field(
        True, description="Keep only the max-advantage-variance subset of rows (m = ceil(rho_s * G))."
    )
    token_level: bool = Field(True, description="Keep only the top rho_k fraction of loss tokens by |A| * entropy.")
    sample_scope: Literal["group", "batch"] = Field(
        "group", description="Row selection within each group ('group', D3S-I) or over the whole batch ('batch')."
    )
    token_scope: Literal["batch", "sequence"] = Field(
        "batch", description="Token ranking over the whole batch or within each row."
    )
    sample_start: float = Field(
        0.5, gt=0.0, le=1.0, description="rho_s at step 0 (fraction of a group's rows kept) [RECON]."
    )
    token_start: float = Field(
        0.5, gt=0.0, le=1.0, description="rho_k at step 0 (fraction of loss tokens kept) [RECON]."
    )
    schedule: Literal["linear", "constant"] = Field(
        "linear",
        description="'linear': ratios rise linearly to 1.0 at ramp_steps, then hold; 'constant': stay at the start "
        "values.",
    )
    ramp: float = Field(
        0.6,
        ge=0.0,
        le=1.0,
        description="Ramp length as a fraction of train.steps (spec: 50-70%); ignored if ramp_steps is set.",
    )
    ramp_steps: int | None = Field(None, ge=0, description="Ramp length in steps (default ramp * train.steps).")
    entropy: Literal["sampler", "trainer"] = Field(
        "sampler",
        description="Token entropy: 'sampler' (recorded during generation, pi_old; "
        "a no-grad forward where missing) or 'trainer' (always a no-grad forward of pi_theta).",
    )


class D3SConfig(D3SOptions):
    enabled: bool = Field(
        False,
        description="D3S dual-level down-sampling (arXiv 2509.22115; rollwise.batch.d3s): after advantages, "
        "keep each group's max-advantage-variance rows and the loss tokens with the largest |A| * entropy, "
        "ratios rising to 1 on a schedule.",
    )


class FilterConfig(Section):
    names: list[str] = Field(default_factory=list, description="Filters applied in order, e.g. ['zero_variance'].")
    options: dict[str, dict[str, Any]] = Field(default_factory=dict, description="Options per filter name.")


class ReplayConfig(StrategyConfig):
    name: str = Field("on_policy", description="Replay source mixing fresh and stored groups.")


class OverlongPenaltyConfig(Section):
    enabled: bool = Field(
        False, description="Add DAPO's soft overlong punishment (arXiv 2503.14476) to each verified rollout's reward."
    )
    max_len: int | None = Field(
        None, ge=1, description="L_max in tokens: longer responses get -1 (default sampling.max_new_tokens)."
    )
    cache_len: int | None = Field(
        None,
        ge=1,
        description="L_cache: the penalty falls linearly from 0 to -1 over the last cache_len tokens "
        "up to max_len (default max(1, max_len // 5), the paper's 4096 / 20480).",
    )


class KlInRewardConfig(Section):
    coef: float = Field(
        0.0,
        ge=0,
        description="beta: subtract beta * sum_t KL_t(pi_theta || pi_ref) from each verified rollout's reward "
        "(0 = off; on, the trainer keeps a frozen reference copy of the initial model).",
    )
    estimator: Literal["k1", "k2", "k3"] = Field(
        "k1",
        description="Per-token KL estimator with l = log pi_ref - log pi_theta: "
        "'k1' = -l, 'k2' = l^2/2, 'k3' = exp(l) - 1 - l (as objective.options.kl_estimator).",
    )


class TtrlOptions(BaseModel):
    """The options of ``rollwise.reward.ttrl`` (its ``Options``): schema here, behaviour there."""

    model_config = ConfigDict(extra="forbid")

    train_samples: int | None = Field(
        None,
        ge=1,
        description="N_sample: train on the first N_sample rollouts of each group "
        "(the vote uses all of them, N_vote = control.rollouts_per_prompt); None = all.",
    )


class TtrlConfig(TtrlOptions):
    enabled: bool = Field(
        False,
        description="Test-time RL (TTRL, arXiv 2504.16084; rollwise.reward.ttrl): the training reward is "
        "agreement with the majority answer of the group, never the reference answer (evaluation still "
        "uses the reference).",
    )


class FapoConfig(Section):
    enabled: bool = Field(
        False,
        description="FAPO flawed-positive penalty (arXiv 2510.22543; rollwise.reward.fapo): a correct rollout "
        "whose reasoning the detector finds flawed loses 'penalty' from its reward.",
    )
    detector: str = Field(
        "rule",
        description="Flaw detector: 'rule' (first false integer equation in the working; built-in tasks) or "
        "'package.module:attr', a callable (prompt, completion) -> earliest error step, -1, or None (cannot judge); "
        "resolved at load (rollwise.compat.check).",
    )
    penalty: float = Field(
        0.5,
        ge=0.0,
        description="Subtracted from a flawed positive's 0/1 score; 0.5 = the paper's lambda = 1 on "
        "its +-1 reward scale (a flawed positive sits at the midpoint).",
    )
    correct_at: float = Field(
        1.0, description="A rollout whose verifier score is >= this is a positive and is checked."
    )


class RewardConfig(Section):
    overlong_penalty: OverlongPenaltyConfig = Field(
        default_factory=OverlongPenaltyConfig, description="DAPO overlong reward shaping."
    )
    kl: KlInRewardConfig = Field(
        default_factory=KlInRewardConfig,
        description="KL to the reference as a reward penalty (KL in the loss is objective.options.kl_coef).",
    )
    fapo: FapoConfig = Field(default_factory=FapoConfig, description="FAPO flawed-positive penalty (off by default).")
    ttrl: TtrlConfig = Field(
        default_factory=TtrlConfig, description="Test-time RL: majority-vote pseudo-rewards (off by default)."
    )


class AdvantageConfig(StrategyConfig):
    name: str = Field("grpo", description="Advantage estimator.")


class ObjectiveConfig(StrategyConfig):
    name: str = Field("grpo", description="Policy objective.")


class EssOptions(BaseModel):
    """The options of ``rollwise.objectives.ess`` (its ``Options``): schema here, behaviour there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rule: Literal["sqrt", "linear"] = Field(
        "sqrt",
        description="LR scale: sqrt(min(1, rho/rho_base)) ('sqrt', VCPO default) or min(1, rho/rho_base) ('linear').",
    )
    base_ess_ratio: float = Field(
        1.0, gt=0, le=1.0, description="rho_base: ESS ratio at or above which the LR is not reduced."
    )


class EssLrScalingConfig(EssOptions):
    enabled: bool = Field(
        False,
        description="Scale each optimizer step's learning rate by VCPO's effective-sample-size rule "
        "(arXiv 2602.17616) on the step's sequence weights pi_prox / mu; for off-policy data.",
    )


class AsyncConfig(Section):
    enabled: bool | None = Field(
        None,
        description="Generate rollouts in a background generator ahead of the trainer "
        "(rollwise.distributed.async_pool; AReaL arXiv 2505.24298). None = on when max_staleness > 0; "
        "true with max_staleness = 0 runs the asynchronous machinery synchronously (the same run as off).",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        description="eta: a rollout is trained at most this many policy versions after the "
        "version that drew its oldest token (plans k .. k + eta are generated while step k trains). "
        "0 = synchronous. eta >= 1 needs a controller that can plan ahead and an objective with an "
        "off-policy correction (objective.name = 'decoupled_ppo' or objective.options.tis_level), "
        "unless allow_uncorrected.",
    )
    on_new_weights: Literal["finish", "interrupt", "discard"] = Field(
        "finish",
        description="When new weights are published mid-plan: finish the plan with the old ones; interrupt "
        "(AReaL's interruptible generation: load them between decode steps and continue unfinished rollouts from their "
        "tokens, per-token versions record the switch); or discard the unfinished rollouts and restart them. interrupt "
        "and discard need the in-process hf backend (distributed.workers = 0).",
    )
    allow_uncorrected: bool = Field(
        False,
        description="Train stale rollouts (max_staleness >= 1) with an objective that "
        "has no off-policy correction (no proximal recompute: objective.options.tis_level = 'off', "
        "not decoupled_ppo); refused at load unless true.",
    )
    periodic: bool = Field(
        False,
        description="Periodic asynchrony (arXiv 2511.18871): strictly on-policy; the trainer "
        "back-propagates each group as soon as it is generated while the rest of the batch is still "
        "generating, one optimizer step per batch (rollwise.trainer.streaming).",
    )
    periodic_chunks: int = Field(
        4,
        ge=1,
        description="Periodic asynchrony: generate each step's plan in this many chunks of "
        "groups; the trainer back-propagates a chunk while the next one generates.",
    )

    @property
    def on(self) -> bool:
        """A generator with its own weights: bounded staleness, or periodic asynchrony."""
        return self.periodic or (self.max_staleness > 0 if self.enabled is None else bool(self.enabled))


class GapGuardConfig(Section):
    """The stale-weight alarm (rollwise.trainer.mismatch.GapGuard; docs/architecture.md §9): on when the sampler is a
    separate engine (vLLM, Ray workers) fed only fresh rollouts (no asynchrony, on-policy replay)."""

    enabled: bool = Field(
        True, description="Stop the run when the sampler/trainer log-prob gap (mismatch/abs_mean) jumps."
    )
    ceiling: float = Field(1.0, gt=0, description="Stop whenever mismatch/abs_mean exceeds this (nats per token).")
    jump: float = Field(5.0, gt=1, description="... or exceeds `jump` x the median of the earlier steps' gaps ...")
    floor: float = Field(0.05, ge=0, description="... and this floor (below it, rounding noise never stops a run).")


class TrainConfig(Section):
    # ``async`` is a Python keyword: the field is ``async_``, written ``train.async`` in TOML, --set and dumps
    model_config = ConfigDict(extra="forbid", validate_assignment=True, serialize_by_alias=True)

    steps: int = Field(600, ge=0, description="RL steps (optimizer steps).")
    lr: float = Field(2e-4, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW betas.")
    max_grad_norm: float = Field(1.0, ge=0, description="Gradient clipping (0 = off).")
    warmup_steps: int = Field(0, ge=0, description="Linear learning-rate warm-up steps.")
    micro_batch: int = Field(
        128, ge=1, description="Sequences per forward/backward pass (gradient accumulation is exact)."
    )
    gap_guard: GapGuardConfig = Field(
        default_factory=GapGuardConfig, description="Stale-weight alarm on the sampler/trainer log-prob gap."
    )
    activation_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in the backward pass "
        "(Hugging Face gradient checkpointing): less memory per micro-batch, ~30% more compute.",
    )
    fsdp: bool = Field(
        False,
        description="Shard the training state (weights, gradients, fp32 AdamW moments) across the torchrun "
        "data-parallel ranks with FSDP2 (torch fully_shard, one group per decoder layer): each rank keeps 1/N "
        "of it, and a full-weight copy for its hf sampler, refreshed after every optimizer step "
        "(rollwise.distributed.fsdp). Needs torchrun with at least 2 processes; not with model.lora.",
    )
    epochs: int = Field(
        1,
        ge=1,
        description="Update epochs per batch (PPO's ppo_epochs, TRL's num_iterations): one "
        "full-batch optimizer step per epoch; the LR schedule counts optimizer steps.",
    )
    ess_lr_scaling: EssLrScalingConfig = Field(
        default_factory=EssLrScalingConfig, description="VCPO ESS learning-rate scaling."
    )
    budget_generated_tokens: int | None = Field(
        None,
        ge=1,
        description="Stop once the cumulative generated tokens of training "
        "rollouts (cost/generated_tokens) reach this; train.steps still caps (None = no budget).",
    )
    budget_rollouts: int | None = Field(
        None,
        ge=1,
        description="Stop once the cumulative training rollouts (cost/rollouts) "
        "reach this; train.steps still caps (None = no budget).",
    )
    async_: AsyncConfig = Field(
        default_factory=AsyncConfig,
        alias="async",
        description="Asynchronous rollouts with a staleness bound (AReaL), or periodic asynchrony.",
    )


class DistributedConfig(Section):
    workers: int = Field(
        0,
        ge=0,
        description="Rollout workers as Ray actors, each with its own model.backend (0 = generate in "
        "this process, the local pool; > 0 needs pip install 'rollwise[ray]'; rollwise.distributed.ray_pool).",
    )
    address: str | None = Field(
        None,
        description="Ray cluster to join, 'host:port' or 'ray://host:port' (None = start Ray "
        "locally with this machine's CPUs).",
    )
    cpus_per_worker: int = Field(1, ge=1, description="CPUs reserved for each rollout worker (its torch threads).")
    gpus_per_worker: float = Field(
        0.0,
        ge=0.0,
        description="GPUs Ray reserves for each rollout worker (0 = none: the worker generates on its CPUs; "
        "1 = a GPU of its own, where its hf model or vLLM engine runs; a fraction shares one GPU between "
        "workers). Refused before the model loads when the cluster has fewer GPUs than workers x this.",
    )
    request_seeds: bool = Field(
        False,
        description="Seed each request's rollouts from (run.seed, policy version, prompt id, request "
        "index) and generate request by request, so results do not depend on how a plan is split "
        "across workers; always on when workers > 0 (set it with workers = 0 to compare with the "
        "local pool).",
    )
    data_parallel: bool | None = Field(
        None,
        description="Data-parallel training with torch.distributed, started by torchrun "
        "(torchrun --nproc_per_node N -m rollwise.cli train ...): every process generates and "
        "trains on a share of each step, gradients are summed, rank 0 writes the run "
        "(rollwise.distributed.data_parallel). None = on when torchrun starts more than one "
        "process (WORLD_SIZE > 1); true = refuse to run without torchrun; false = refuse to run "
        "under it.",
    )


class EvalConfig(Section):
    every: int = Field(50, ge=0, description="Evaluate every N steps (0 = only at start and end).")
    n_prompts: int = Field(200, ge=1, description="Held-out prompts evaluated (first N of the held-out split).")
    samples: int = Field(4, ge=1, description="Samples per held-out prompt.")
    k: list[int] = Field(default_factory=lambda: [4], description="k values for pass@k and maj@k (each <= samples).")
    temperature: float | None = Field(
        None, ge=0.0, description="Evaluation temperature (default: the training temperature)."
    )
    at_start: bool = Field(True, description="Evaluate before the first step.")

    @model_validator(mode="after")
    def _k_le_samples(self):
        bad = [k for k in self.k if k < 1 or k > self.samples]
        if bad:
            raise ValueError(f"eval.k values {bad} must be between 1 and eval.samples={self.samples}")
        return self


class BatchConfig(Section):
    d3s: D3SConfig = Field(
        default_factory=D3SConfig, description="D3S row and token down-sampling of the training batch (off by default)."
    )


class ValueConfig(Section):
    """The pass-rate predictor (``rollwise.value``, issue #31): a prompt's pass rate under the current
    policy predicted before any rollout of it, from the sampler's prefill state and a context of
    recently observed prompts; trained online on every step's groups. Off by default; the strategies
    that read its predictions (``control.options.prior = 'learned'``, ``first_visit = 'predicted'``,
    ``rates = 'predicted'`` (cures, dars), ``control.name = 'wise2'``, ``advantage.name = 'poise'``) need it on."""

    enabled: bool = Field(
        False, description="Build the pass-rate predictor (needs model.backend = 'hf' in this process)."
    )
    proj_dim: int = Field(16, ge=1, description="Dimensions of the fixed random projection of the prompt state.")
    context: int = Field(512, ge=2, description="Observed (prompt, pass rate) pairs kept as context and training data.")
    tau: float = Field(10.0, gt=0, description="Sharpness of the context's softmax over cosine similarities.")
    fit_steps: int = Field(50, ge=1, description="Full-batch Adam iterations of the probe after every step.")
    lr: float = Field(0.05, gt=0, description="The probe's learning rate.")
    l2: float = Field(1e-2, ge=0, description="L2 penalty on the probe's weights.")
    min_fit: int = Field(
        16, ge=1, description="Observations before the probe is fitted (until then: the context value)."
    )


class Config(Section):
    _derived: dict = PrivateAttr(default_factory=dict)  # key -> "value from why" (rollwise.defaults.resolve)
    run: RunConfig = Field(default_factory=RunConfig, description="Run directory, seed, checkpoints.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy model.")
    task: TaskConfig = Field(default_factory=TaskConfig, description="Prompt source and verifier.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Rollout sampling.")
    control: ControlConfig = Field(
        default_factory=ControlConfig, description="Prompt selection and rollout allocation."
    )
    filter: FilterConfig = Field(default_factory=FilterConfig, description="Group filters.")
    replay: ReplayConfig = Field(default_factory=ReplayConfig, description="Replay source.")
    reward: RewardConfig = Field(
        default_factory=RewardConfig, description="Reward shaping before advantages (verified rollouts only)."
    )
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig, description="Advantage estimator.")
    batch: BatchConfig = Field(
        default_factory=BatchConfig,
        description="The trainer's batch after advantages: D3S row and token down-sampling.",
    )
    objective: ObjectiveConfig = Field(default_factory=ObjectiveConfig, description="Policy objective.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Optimizer and steps.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation.")
    distributed: DistributedConfig = Field(
        default_factory=DistributedConfig, description="Rollout workers (local pool or Ray actors)."
    )
    value: ValueConfig = Field(default_factory=ValueConfig, description="Pass-rate predictor (off by default).")

    @model_validator(mode="after")
    def _control_knows_max_new_tokens(self):
        self.control._max_new_tokens = self.sampling.max_new_tokens
        return self

    def run_name(self) -> str:
        """``run.name``, or the default ``<task>-<model>-<controller>-<objective>-s<seed>`` (e.g.
        ``arithmetic-tiny-uniform-grpo-s0``, ``rg.chain_sum-smollm2-135m-dars-dapo-s1``,
        ``jsonl.mydata-tiny-uniform-grpo-s0``); ``with_run_name`` makes a default name unique."""
        if self.run.name:
            return self.run.name
        head, _, arg = self.task.name.partition(":")
        task = {"reasoning_gym": "rg"}.get(head, head.rsplit(".", 1)[-1]) + (f".{Path(arg).stem}" if arg else "")
        parts = (
            task,
            Path(self.model.name).stem or self.model.name,
            self.control.name.rsplit(":", 1)[-1],
            self.objective.name.rsplit(":", 1)[-1],
            f"s{self.run.seed}",
        )
        return "-".join(re.sub(r"[^A-Za-z0-9_.]+", "_", p).strip("_.") or "x" for p in parts)

    def run_dir(self) -> Path:
        return Path(self.run.dir) / self.run_name()

    def with_run_name(self) -> Config:
        """This config with ``run.name`` set: itself if set, else the default name, or, when a run
        directory of that name already holds files, the first free ``<name>-2``, ``<name>-3``, ...
        (a default name never reuses an existing run)."""
        if self.run.name:
            return self
        base, n = self.run_name(), 1
        name = base
        while (Path(self.run.dir) / name).is_dir() and any(
            p.name != ".lock" for p in (Path(self.run.dir) / name).iterdir()
        ):
            n += 1
            name = f"{base}-{n}"
        return self.model_copy(update={"run": self.run.model_copy(update={"name": name})})


# ---------------------------------------------------------------- loading


def parse_override(text: str) -> tuple[list[str], Any]:
    """'a.b=value' -> (['a', 'b'], value); the value is read as TOML, else kept as a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"bad override {text!r}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return [p for p in key.strip().split(".")], value


def _wants_text(path: list[str]) -> bool:
    """True when the field at ``path`` is a plain string field (``run.name``, ``task.name``):
    ``--set run.name=2024`` then means the text "2024", not the integer TOML reads."""
    import typing

    from rollwise.registry import keys, model_at

    section = model_at(Config, path[:-1])
    field = keys(section).get(path[-1]) if section is not None else None
    if field is None:
        return False
    args = typing.get_args(field.annotation)
    return field.annotation is str or (bool(args) and str in args and all(a in (str, type(None)) for a in args))


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for text in overrides:
        path, value = parse_override(text)
        if not isinstance(value, str) and not isinstance(value, (dict, list)) and _wants_text(path):
            value = text.partition("=")[2].strip()
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UserError(f"override {text!r}: {part!r} is not a section")
        node[path[-1]] = value
    return data


def read_toml(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"config file not found: {p}")
    try:
        return tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"config file {p} is not valid TOML: {e}") from None


# Keys renamed so that each feature's config section, module folder and metric prefix use one word
# (LATR: sampling.latr, rollwise.generate.latr, latr/*; D3S: batch.d3s, rollwise.batch.d3s, d3s/*).
RENAMED = {"sampling.tree": "sampling.latr", "filter.d3s": "batch.d3s"}


def check_renamed(raw: dict) -> None:
    """``UserError`` naming the new key when a config file, ``data`` or a --set override uses a
    key listed in ``RENAMED``."""
    for old, new in RENAMED.items():
        node = raw
        for part in old.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            raise UserError(f"{old} was renamed {new}: write [{new}] in the config file or --set {new}.<key>=...")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, data: dict | None = None) -> Config:
    """Build a validated ``Config`` from a TOML file, a dict and ``section.key=value`` overrides."""
    raw = dict(data or {})
    if path is not None:
        raw = read_toml(path) | raw
    raw = apply_overrides(raw, list(overrides or []))
    check_renamed(raw)
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as e:
        raise UserError("invalid configuration:\n" + format_validation(e, model=Config)) from None
    check_strategies(cfg)
    return cfg


def check_strategies(cfg: Config) -> None:
    """Resolve every strategy name, validate its options and refuse parts that cannot be combined
    (``rollwise.compat.check``: strategies reached through their registries, no models)."""
    from rollwise import compat

    compat.check(cfg)


def to_toml(cfg: Config) -> str:
    import tomli_w

    head = "".join(f"# derived: {k} = {why}\n" for k, why in getattr(cfg, "_derived", {}).items())
    return (head + "\n" if head else "") + tomli_w.dumps(cfg.model_dump(mode="json", exclude_none=True))
