"""The ``value`` section: the pass-rate predictor (``rollwise.value``)."""

from __future__ import annotations

from pydantic import Field

from rollwise.sections import Section


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
