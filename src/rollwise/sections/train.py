"""The ``train`` section: the optimizer and its steps, VCPO's ESS learning-rate scaling
(``rollwise.objectives.ess``, which aliases ``EssOptions``), asynchrony (``train.async``:
``rollwise.distributed.async_pool``, ``rollwise.trainer.streaming``) and the stale-weight alarm
(``rollwise.trainer.mismatch``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rollwise.sections import Section


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
    packing: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Pack a micro-batch's rows so the decoder computes no padding: 'on' packs them first-fit "
        "into rows of at least 256 tokens, each sequence with its own position ids, and the model's "
        "packed-sequence attention mask (transformers builds it from the position ids: block-diagonal causal "
        "attention, exact) keeps them apart; 'off' runs one padded row per sequence with plain causal "
        "attention; 'auto' packs on CUDA, and on CPU only when the packed rows hold at most 85% of the padded "
        "positions (there the packed mask costs more than it saves otherwise: "
        "benchmarks/results/train_packing_default.json). Either way only "
        "completion positions reach the LM head, in chunks (rollwise.trainer.head). 'on' is refused for a "
        "model whose logits are not its LM head's output (a logit soft-cap or scale).",
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
        "(rollwise.trainer.fsdp). Needs torchrun with at least 2 processes; not with model.lora.",
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
    matched_quantisation: bool = Field(
        False,
        description="With model.rollout_precision = 'fp8': the trainer's forward quantises the same linear layers "
        "the same way (Jet-RL's unified precision flow; gradients pass straight through to the full-precision "
        "weights), so the sampler and the trainer agree (mismatch/* near 0). false: a full-precision trainer.",
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
