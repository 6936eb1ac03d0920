"""``opmd``: the policy loss of R³L's released code (Trinity-RFT's ``opmd`` policy loss).

Paper: R³L, arXiv 2601.03715; code shiweijiezero/R3L (``opmd_policy_loss.py``); guidance.md §7a.1
step 9. Per loss token::

    l_t = -A * log pi_theta(y_t) / (1 + tau)

aggregated like every objective (default ``token_mean`` over the step's global loss tokens, as
the code's token-mean). Plain REINFORCE with the advantage: **no importance ratio and no clip**
(the paper's "IS dropped"), so off-policy rows (R³L's retries) get no correction. ``tau = 1``
(code). The KL / entropy / behaviour-weight options of :class:`ObjectiveOptions` apply as for
every objective; all default off. Whether the paper keeps a KL term is unresolved (the code's
algorithm defaults list a k2 KL at 0.001; reviewers read the paper as dropping it): set
``kl_coef`` to reproduce the former.

Properties (§7a.5): with A = 0 everywhere the loss is 0; the gradient w.r.t. ``log pi_theta(y_t)``
is ``-A / ((1 + tau) N)`` per token (N = global loss tokens), independent of the old policy.
"""

from __future__ import annotations

import torch
from pydantic import Field

from rollwise.objectives.common import AGGREGATION_HELP, Aggregation, ObjectiveOptions, finish, objective
from rollwise.types import Batch, LossOut


class Options(ObjectiveOptions):
    aggregation: Aggregation = Field("token_mean", description=AGGREGATION_HELP)
    tau: float = Field(1.0, ge=0.0, description="The loss is divided by (1 + tau) (R3L code: tau = 1).")


@objective(Options)
def loss(batch: Batch, new_logprobs: torch.Tensor, opts: Options, entropy: torch.Tensor | None = None) -> LossOut:
    """OPMD loss (minimise): ``-A log pi_theta / (1 + tau)`` per token, no ratio, no clip."""
    adv = batch.advantages[:, None] if batch.token_advantages is None else batch.token_advantages
    per_token = -adv.to(new_logprobs.dtype) * new_logprobs / (1.0 + opts.tau)
    return finish(batch, new_logprobs, per_token, opts, entropy, {})
