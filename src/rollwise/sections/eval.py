"""The ``eval`` section: held-out evaluation (``rollwise.eval``)."""

from __future__ import annotations

from pydantic import Field, model_validator

from rollwise.sections import Section


class EvalConfig(Section):
    every: int = Field(50, ge=0, description="Evaluate every N steps (0 = only at start and end).")
    n_prompts: int = Field(
        200, ge=1, description="Held-out prompts evaluated (N evenly spaced through the held-out split, or all)."
    )
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
