"""The ``reward`` section: reward shaping before advantages (``rollwise.reward``): DAPO's overlong
penalty, KL in the reward, FAPO, TTRL (which aliases ``TtrlOptions``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rollwise.sections import Section


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
        description="Flaw detector: 'rule' (first false integer equation in the working; built-in tasks), "
        "'genrm:<run dir>' (a FAPO judge trained with configs/fapo_judge.toml; rollwise.flaws_judge) or "
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
