"""The ``batch`` section: the trainer's batch after advantages, D3S down-sampling (``rollwise.batch.d3s``,
which aliases ``D3SOptions``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rollwise.sections import Section


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


class BatchConfig(Section):
    d3s: D3SConfig = Field(
        default_factory=D3SConfig, description="D3S row and token down-sampling of the training batch (off by default)."
    )
