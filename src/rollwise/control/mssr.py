"""``mssr``: single-rollout control: uniform prompts, ``rollouts_per_prompt`` rollouts each (MSSR:
1), and the per-prompt Beta value tracker with KL-adaptive forgetting that gives the ``mssr``
advantage its baseline (:mod:`rollwise.objectives.mssr`).

Paper: "Stable and Efficient Single-Rollout RL for Multimodal Reasoning" (MSSR), arXiv
2512.18215; code ruiiu/MSSR @ 3dd0f13 (``MVSRValueTracker``, ``compute_mvsr_advantage``);
docs/specs/guidance.md §2.1.

Tracker. Every prompt id x has ``(alpha, beta)``; an unseen prompt starts at ``v_init = 0.5`` with
``N_0 = 1 / (1 - rho_min)`` pseudo-counts (``alpha = beta = 4`` for rho_min 0.875). ``observe``
first records each prompt's baseline ``v_hat = alpha / (alpha + beta)`` (what the step's advantage
subtracts, :meth:`MSSR.baselines`), then applies every rollout: ``alpha <- rho alpha + r``,
``beta <- rho beta + (1 - r)`` with ``r`` binarised at 0.5 (a prompt drawn twice is updated twice).

KL-adaptive ``rho`` (the paper's eta). ``KL_s`` = mean of the last ``kl_window`` steps' batch-mean
KL to the reference (the trainer's ``train/kl``, logged when ``objective.options.kl_coef > 0``;
the code's low_var_kl is k3 clamped); ``rule = "as_written"`` (code = paper formula):
``rho = rho_min + (KL_s / target)(rho_max - rho_min)`` for ``KL_s <= target``, else ``rho_min`` (it
jumps back down above the target [DERIVED]); ``"monotone"`` [RECON]: ``rho = rho_max - min(KL_s /
target, 1)(rho_max - rho_min)``. Before any KL is recorded: ``(rho_min + rho_max) / 2``. Worked
numbers (0.875, 0.96, target 0.01): KL 0 -> 0.875; 0.005 -> 0.9175; 0.01 -> 0.96; 0.0101 ->
0.875.

Differences: the one-off initialisation pass over the whole training set (``n_init`` rollouts
per prompt before training) is **not built**: every prompt starts at v_init (the code's fallback
for prompts its init loader drops). ``kl_window`` defaults to the paper's 20 (the code hard-codes
10). The optional per-prompt-KL forgetting, prioritised sampler and visual reweighting are not
built. Prompt selection is the seeded shuffled stream of ``uniform``.

Logs ``control/mssr_rho`` and ``control/mssr_kl``. State (checkpointed): the stream, the history,
the tracker, the KL window and the step's baselines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollwise.control.uniform import Uniform
from rollwise.registry import Compat
from rollwise.types import CORRECT, AdvantageInputs, Group, Prompt


class MssrOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rho_min: float = Field(
        0.875, gt=0.0, lt=1.0, description="Fastest forgetting; also sets N_0 = 1/(1 - rho_min) (code 0.875)."
    )
    rho_max: float = Field(0.96, gt=0.0, lt=1.0, description="Slowest forgetting (code 0.96).")
    kl_target: float = Field(0.01, gt=0.0, description="KL_target of the rho rule (code 0.01).")
    kl_window: int = Field(20, ge=1, description="Steps averaged into KL_s (paper 20; the code hard-codes 10).")
    v_init: float = Field(
        0.5, ge=0.0, le=1.0, description="Prior value of an unseen prompt: alpha = N_0 v_init, beta = N_0 (1 - v_init)."
    )
    rule: Literal["as_written", "monotone"] = Field(
        "as_written",
        description="rho rule: 'as_written' (code = paper, jumps back "
        "to rho_min above the target) or 'monotone' [RECON].",
    )

    @model_validator(mode="after")
    def _order(self):
        if self.rho_min > self.rho_max:
            raise ValueError(f"rho_min ({self.rho_min}) exceeds rho_max ({self.rho_max})")
        return self


def forgetting(kl_s: float | None, o: MssrOptions) -> float:
    """The forgetting factor rho for the smoothed KL ``kl_s`` (module docstring)."""
    lo, hi = o.rho_min, o.rho_max
    if kl_s is None:
        return (lo + hi) / 2
    tau = min(kl_s / o.kl_target, 1.0)
    if o.rule == "monotone":
        return hi - tau * (hi - lo)
    return lo if kl_s > o.kl_target else lo + tau * (hi - lo)


class BetaTracker:
    """Per-prompt ``(alpha, beta)`` with forgetting (module docstring)."""

    def __init__(self, n0: float, v_init: float):
        self.n0, self.v_init = n0, v_init
        self.ab: dict[str, list[float]] = {}

    def get(self, pid: str) -> list[float]:
        return self.ab.get(pid) or [self.n0 * self.v_init, self.n0 * (1.0 - self.v_init)]

    def init(self, pid: str, v0: float) -> None:
        """The code's initialisation from a mean outcome v0: alpha = N_0 v0, beta = N_0 (1 - v0)."""
        self.ab[pid] = [self.n0 * v0, self.n0 * (1.0 - v0)]

    def value(self, pid: str) -> float:
        a, b = self.get(pid)
        return a / (a + b) if a + b > 0 else self.v_init

    def update(self, pid: str, reward: float, rho: float) -> None:
        a, b = self.get(pid)
        r = 1.0 if reward >= CORRECT else 0.0
        self.ab[pid] = [rho * a + r, rho * b + (1.0 - r)]


class MSSR(Uniform):
    """Uniform's prompts, stream, plan and history (``control/uniform.py``), plus the value tracker."""

    Options = MssrOptions

    def __init__(self, prompts: Sequence[Prompt], cfg, options: MssrOptions | None, seed: int):
        super().__init__(prompts, cfg, None, seed)
        self.opts = options if options is not None else MssrOptions()
        self.tracker = BetaTracker(1.0 / (1.0 - self.opts.rho_min), self.opts.v_init)
        self.kl: list[float] = []  # batch-mean KL of recent steps (last kl_window kept)
        self.step_baselines: dict[str, float] = {}
        self.metrics: dict[str, float] = {}

    compat = Compat(pairs_with=("advantage", "mssr"))  # it keeps the baseline of advantage 'mssr'

    def rho(self) -> float:
        return forgetting(sum(self.kl) / len(self.kl) if self.kl else None, self.opts)

    def observe(self, groups: list[Group], state) -> None:
        super().observe(groups, state)
        self.step_baselines = {g.prompt.id: self.tracker.value(g.prompt.id) for g in groups}
        rho = self.rho()
        for g in groups:
            for r in g.verified_rewards():
                self.tracker.update(g.prompt.id, r, rho)
        self.metrics = {"control/mssr_rho": rho, "control/mssr_kl": sum(self.kl) / len(self.kl) if self.kl else 0.0}

    def advantage_inputs(self, rows, needs=()) -> AdvantageInputs:
        """The rows' baselines, when the estimator reads them (``prompt_baseline``: advantage 'mssr')."""
        return AdvantageInputs(baselines=self.baselines(rows) if "prompt_baseline" in needs else None)

    def baselines(self, rows) -> torch.Tensor:  # noqa: F821
        """(B,) each row's baseline: its prompt's value before this step's update."""
        import torch

        return torch.tensor(
            [self.step_baselines.get(r.prompt_id, self.tracker.value(r.prompt_id)) for r in rows], dtype=torch.float32
        )

    def after_update(self, batch, rows, metrics: dict, advantages) -> dict:
        """Record the step's KL to the reference (``train/kl``) for the rho rule."""
        if "train/kl" in metrics:
            self.kl = (self.kl + [float(metrics["train/kl"])])[-self.opts.kl_window :]
        return {}

    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "tracker": {k: list(v) for k, v in self.tracker.ab.items()},
            "kl": list(self.kl),
            "step_baselines": dict(self.step_baselines),
        }

    def load_state_dict(self, s: dict) -> None:
        super().load_state_dict(s)
        self.tracker.ab = {k: list(v) for k, v in s["tracker"].items()}
        self.kl = list(s["kl"])
        self.step_baselines = dict(s["step_baselines"])
