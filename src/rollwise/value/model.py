"""The run's pass-rate predictor as a service for controllers and advantages (issue #31).

``ValueModel`` joins the state-zero predictor (:mod:`rollwise.value.predictor`) to the policy: a
prompt's features are the sampler's prefill state at its last token (``HFBackend.prompt_states``),
computed once per prompt and policy version and cached for that version. ``predict(prompts)`` gives
each prompt's predicted pass rate before any rollout; ``observe(groups)`` adds the step's groups
(verified rewards only, correct at ``CORRECT``) to the predictor's bank and refits it; ``evaluate``
scores the predictions on held-out prompts against their evaluation groups (Brier, AUC of
"zero-variance", the calibration curve kept for the run's plot).

Its cost is charged: ``take_cost()`` returns the prompt tokens of the prefill forwards and their
seconds and the probe's fitting seconds since the last call (``value/forward_tokens``,
``time/value_forward_s``, ``time/value_fit_s``; the evaluation's own forwards are not charged, as
evaluation is not).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from rollwise.types import CORRECT
from rollwise.value import metrics
from rollwise.value.predictor import PassRatePredictor


class ValueModel:
    """``prompts``: the prompts it may be asked about by id (the task's train split; ``prompt_of``);
    ``trajectories``: also keep POISE's trajectory probe (:meth:`trajectory_values`); ``frozen_rows``:
    how many rows' POISE baselines :meth:`freeze` keeps (0: none, no row is trained twice)."""

    def __init__(
        self,
        backend,
        codec,
        hidden_size: int,
        seed: int = 0,
        prompts: Sequence = (),
        trajectories: bool = False,
        frozen_rows: int = 0,
        **predictor_options,
    ):
        if not hasattr(backend, "prompt_states"):
            raise ValueError(
                f"the pass-rate predictor needs the prompt states of an in-process hf backend; "
                f"{type(backend).__name__} has none"
            )
        self.backend, self.codec = backend, codec
        self.predictor = PassRatePredictor(hidden_size, seed=seed, **predictor_options)
        # POISE's trajectory probe: a rollout's reward from the state at its last token (prompt + completion)
        self.trajectory = PassRatePredictor(hidden_size, seed=seed + 1, **predictor_options) if trajectories else None
        self._prompts = {p.id: p for p in prompts}
        self._states: dict[str, torch.Tensor] = {}
        self._version: int | None = None
        self._cost = self._no_cost()
        self.curves: dict[str, list[dict]] = {}  # calibration curve per evaluation step (held-out)
        self._rows = 0  # trajectory rows seen (their probe ids)
        self.frozen: dict[str, float] = {}  # POISE: row key -> the baseline it got when first seen (freeze)
        self.frozen_rows = frozen_rows

    @staticmethod
    def _no_cost() -> dict:
        return {"value/forward_tokens": 0, "time/value_forward_s": 0.0, "time/value_fit_s": 0.0}

    def _forward(self, seqs: list, charge: bool = True) -> torch.Tensor:
        """The backend's last-token states of ``seqs``; their tokens and seconds charged unless ``charge`` is off."""
        t0 = time.perf_counter()
        out = self.backend.prompt_states(seqs)
        if charge:
            self._cost["time/value_forward_s"] += time.perf_counter() - t0
            self._cost["value/forward_tokens"] += sum(len(s) for s in seqs)
        return out

    def states(self, prompts: Sequence, version: int, charge: bool = True) -> torch.Tensor:
        """(N, H) prefill states of ``prompts`` under policy ``version`` (cached for that version)."""
        if version != self._version:
            self._states, self._version = {}, version
        missing = [p for p in dict((p.id, p) for p in prompts if p.id not in self._states).values()]
        if missing:
            new = self._forward([self.codec.encode_prompt(p) for p in missing], charge)
            self._states.update({p.id: new[i] for i, p in enumerate(missing)})
        return torch.stack([self._states[p.id] for p in prompts]) if prompts else torch.zeros(0, self.predictor.dim)

    def prompt_of(self, prompt_id: str):
        return self._prompts[prompt_id]

    def trajectory_values(self, rows: Sequence, version: int) -> torch.Tensor:
        """(B,) each rollout's predicted reward from its own final state (prompt + completion ids), by
        the trajectory probe as it stood *before* these rows; the probe then learns the rows' verified
        rewards. So a value handed to another rollout of the group (``poise.cross_rollout``) depends on
        no rollout it is subtracted from. The forward is charged like the prompt states."""
        if self.trajectory is None:
            raise ValueError("trajectory values need ValueModel(trajectories=True) (advantage 'poise')")
        if not rows:
            return torch.zeros(0, dtype=torch.float64)
        states = self._forward([tuple(r.prompt_ids) + tuple(r.completion_ids) for r in rows])
        self._rows += len(rows)
        ids = [f"{r.prompt_id}#{self._rows + k}" for k, r in enumerate(rows)]  # unique: no own history
        out = self.trajectory.predict(states, ids)
        keep = [k for k, r in enumerate(rows) if r.reward is not None]
        if keep:
            fit = self.trajectory.update(
                states[keep], [ids[k] for k in keep], [float(rows[k].reward >= CORRECT) for k in keep], [1] * len(keep)
            )
            self._cost["time/value_fit_s"] += fit["value/fit_s"]
        return out

    FROZEN_ROWS = 1 << 18  # frozen_rows with rollout replay: its 512-group buffer of up to 512 rows each

    def freeze(self, keys: Sequence[str], baselines: Sequence[float]) -> None:
        """Keep each new row's POISE baseline under its key (``objectives.inputs.row_keys``), so that a
        row trained again gets the baseline computed before the probes learned its outcome
        (``objectives.inputs.value_baseline``). The newest ``frozen_rows`` are kept."""
        if self.frozen_rows <= 0:
            return
        self.frozen.update(zip(keys, (float(b) for b in baselines)))
        for key in list(self.frozen)[: max(0, len(self.frozen) - self.frozen_rows)]:
            del self.frozen[key]

    def predict(self, prompts: Sequence, version: int) -> dict[str, float]:
        """Prompt id -> predicted pass rate under policy ``version``."""
        if not prompts:
            return {}
        p = self.predictor.predict(self.states(prompts, version), [q.id for q in prompts])
        return {q.id: float(v) for q, v in zip(prompts, p)}

    def observe(self, groups: Sequence, version: int) -> dict:
        """Add the groups with at least one verified reward to the bank and refit the probe; returns the
        bank size, the fit's loss, and how well the step's prompts were predicted *before* this update
        (``value/train_brier``, ``value/train_auc_degenerate``: None when all or none were degenerate)."""
        rows = [(g.prompt, rs) for g in groups for rs in [g.verified_rewards()] if len(rs) >= 1]
        if not rows:
            return {}
        rates = [sum(r >= CORRECT for r in rs) / len(rs) for _, rs in rows]
        states, ids, sizes = (
            self.states([p for p, _ in rows], version),
            [p.id for p, _ in rows],
            [len(rs) for _, rs in rows],
        )
        # the step's own prompts as predicted before this update: how well the choice was informed
        pred = self.predictor.predict(states, ids).tolist()
        degenerate = [len({r >= CORRECT for r in rs}) == 1 for _, rs in rows]
        before = metrics.summary(pred, rates, degenerate, sizes)
        out = self.predictor.update(states, ids, rates, sizes)
        self._cost["time/value_fit_s"] += out["value/fit_s"]
        out.update(
            {"value/train_brier": before["value/brier"], "value/train_auc_degenerate": before["value/auc_degenerate"]}
        )
        return {k: v for k, v in out.items() if k != "value/fit_s" and v == v}  # train_loss: once fitted (not NaN)

    def evaluate(self, prompts: Sequence, outcomes: dict[str, list[bool]], version: int, label: str) -> dict:
        """Held-out scores of the predictions for those of ``prompts`` that have evaluation groups
        (``outcomes``: prompt id -> correct flags of its evaluation samples); the calibration curve is
        kept under ``label``. The forwards are not charged (evaluation is free in the ledger)."""
        prompts = [p for p in prompts if outcomes.get(p.id)]
        if not prompts:
            return {}
        pred = self.predictor.predict(self.states(prompts, version, charge=False), [p.id for p in prompts]).tolist()
        obs = [sum(outcomes[p.id]) / len(outcomes[p.id]) for p in prompts]
        degenerate = [len(set(outcomes[p.id])) == 1 for p in prompts]
        self.curves[label] = metrics.calibration(pred, obs)
        out = metrics.summary(pred, obs, degenerate, [len(outcomes[p.id]) for p in prompts])
        return {k.replace("value/", "value/heldout_"): v for k, v in out.items()}

    def take_cost(self) -> dict:
        out, self._cost = self._cost, self._no_cost()
        return out

    def state_dict(self) -> dict:
        out = {
            "predictor": self.predictor.state_dict(),
            "curves": self.curves,
            "rows": self._rows,
            "frozen": dict(self.frozen),
        }
        if self.trajectory is not None:
            out["trajectory"] = self.trajectory.state_dict()
        return out

    def load_state_dict(self, d: dict) -> None:
        self.predictor.load_state_dict(d["predictor"])
        self.curves, self._rows = dict(d.get("curves", {})), int(d.get("rows", 0))
        self.frozen = dict(d.get("frozen", {}))
        if self.trajectory is not None and "trajectory" in d:
            self.trajectory.load_state_dict(d["trajectory"])
