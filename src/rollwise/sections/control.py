"""The ``control`` section: the controller (``rollwise.control``, options validated by it), the per-step
budgets and dynamic sampling (``rollwise.control.rounds``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PrivateAttr, model_validator

from rollwise.sections import Section, StrategyConfig


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
