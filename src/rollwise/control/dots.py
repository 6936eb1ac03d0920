"""``dots``: difficulty-targeted online data selection (and the ``dots_reference`` filter).

Paper: Sun et al. 2025, "Improving Data Efficiency for LLM Reinforcement Fine-tuning Through
Difficulty-targeted Online Data Selection and Rollout Replay", arXiv 2506.05316 (NeurIPS 2025);
code github.com/ASTRAL-Group/data-efficient-llm-rl at 59df9187 (``teacher_utils.py``,
``ray_trainer_teacher_replay.py``); docs/specs/allocation.md §7. Rollout replay, the other half of the
method, is the replay source ``rollout_replay`` (:mod:`rollwise.replay.rollout_replay`).

DOTS picks the prompts whose *adaptive difficulty* under the current policy is closest to
``alpha = 0.5``, measuring only a small reference set and transferring its success rates to all
prompts by embedding similarity. A **selection round** covers ``mu = steps_per_round`` steps:

1. **Reference rollouts** (the round's first step: ``select`` returns them, ``plan`` gives each
   ``ref_rollouts`` rollouts): ``ref_size`` prompts drawn uniformly without replacement; their
   measured success rates ``v_j`` are the mean verified rewards of their groups.
2. **Prediction** (``next_round`` after the reference round, :func:`predict`): attention over the
   reference set, ``s_j = cos(e_x, e_j)``, ``w = softmax(s / attention_temperature)``,
   ``p_base(x) = sum_j w_j v_j``, then the code's RL-time **linear calibration**: least squares
   ``v ~ a p_base + c`` on the reference set, applied to every prompt (so the mean prediction over
   the reference set equals the mean of its labels).
3. **Selection** (:func:`select_round`): ``score = -|p_hat - alpha|``, logits ``score / tau``
   (``tau = 1e-3``: almost greedy), ``mu * b`` prompts sampled **without replacement** from
   ``softmax(logits)`` (Gumbel top-k, the same distribution), shuffled and split into ``mu``
   batches of ``b``: ``b = B`` in round 0 and ``b = round(B * (1 - replay_fraction))`` afterwards,
   because ``rollout_replay`` fills the rest of each batch (``B = control.prompts_per_step``).
4. Batch 0 is planned in the same step (``next_round``), the others in the round's next steps
   (``select``), ``G = control.rollouts_per_prompt`` rollouts each. A new round starts when the
   batches are used up.

**Reference groups are not training data in the paper.** They are generated through the worker
pool, so the ledger charges them (the paper's per-round overhead), and they are marked
(``Prompt.metadata["dots_reference"] = True``) so the filter ``dots_reference``
(:func:`reference_filter`, reason ``reference``) can drop them: put it in ``filter.names`` to
match the paper. Without it they are trained on like any group (extra uniformly drawn prompts).
Reference prompts are kept out of the same step's batch 0 (the pool would merge the two groups of
one prompt): the shuffled selection puts them last, and any that still fall in batch 0 are
replaced by the next non-reference prompts of the same Gumbel ranking (left out only when the
data set has no other prompt). Their observations are recorded in the shared ``PromptHistory`` like any group.

**Pairing** (configs/dots_rr.toml): ``replay.name = "rollout_replay"`` with the same
``replay_fraction`` and ``warmup_steps = steps_per_round`` (no replay in round 0), the filter
above, and the replay-aware clip ``objective.options = {tis_level = "token", tis_cap = 1e9}`` (see
:mod:`rollwise.replay.rollout_replay`).

**Budget.** Reference and batch-0 rollouts of a round's first step share the step's budget
(:class:`~rollwise.control.budget.StepBudget`); batch 0 loses whole prompts first. Without
``control.budget_rollouts`` the cap is ``ref_size * ref_rollouts + B * G`` (never binds).

Differences from the paper / code:

- **Embeddings [ours].** The paper uses mean-pooled last-layer states of a frozen LLM
  (Qwen2.5-Math-1.5B-Instruct). Here a prompt's embedding is a **hashed character n-gram
  vector** of its text (n = 1..``ngram_max``, ``embed_dim`` signed buckets, L2-normalised;
  :func:`ngram_embedding`): cheap, offline, deterministic across processes, but blind to
  meaning, so predictions transfer between prompts that *look* alike (length, digits, wording).
- **Regressor [ours].** The paper trains projection MLPs (LayerNorm -> 3-layer MLP -> LayerNorm,
  hidden 896) and a calibration head (``group_logit_temp``) offline on success rates of many
  prompts under several checkpoints. No such data exist here, so the attention is closed-form:
  identity projections, cosine scores and a fixed temperature; only the RL-time linear
  calibration of the code is kept. A reference prompt's own label dominates its prediction (it is
  its own most similar reference), as in the code, where reference prompts are queries too.
- The selection is sampled with Gumbel top-k (exactly sampling without replacement from the
  softmax); the code calls ``torch.multinomial``, which fails when fewer categories than the
  selection have non-zero probability (at ``tau = 1e-3`` most underflow).
- ``ref_size`` defaults to ``B / 2`` (the script's 256 for B = 512); the code's curriculum thirds
  (a difficulty-sorted third of the data per third of the epochs) are not done.

Logs nothing of its own (``filter/reference`` counts the dropped reference groups,
``control/rounds`` is 2 on a round's first step). State (checkpointed): the RNG (numpy PCG64),
the number of rounds started, the remaining batches (prompt ids) and the per-prompt history.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from rollwise.control.budget import StepBudget
from rollwise.control.history import PromptHistory
from rollwise.registry import Compat
from rollwise.types import Controller, Decision, Group, Plan, Prompt, Request

REFERENCE_KEY = "dots_reference"  # Prompt.metadata flag of a reference rollout request


def reference_filter(group: Group) -> Decision:
    """Filter ``dots_reference``: drop DOTS's reference groups (measured, not trained on)."""
    if group.prompt.metadata.get(REFERENCE_KEY):
        return Decision(False, "reference")
    return Decision(True, "kept")


def is_reference(prompt: Prompt) -> bool:
    return bool(prompt.metadata.get(REFERENCE_KEY))


def as_reference(prompt: Prompt) -> Prompt:
    return dataclasses.replace(prompt, metadata={**prompt.metadata, REFERENCE_KEY: True})


# ------------------------------------------------------------------------- embeddings and predictor


def ngram_embedding(text: str, dim: int = 256, ngram_max: int = 3) -> np.ndarray:
    """(dim,) float64, L2-normalised: signed feature hashing of the UTF-8 byte n-grams of ``text``
    (n = 1..ngram_max). Deterministic across processes (no Python ``hash``). Empty text -> zeros."""
    b = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint64)
    vec = np.zeros(dim, dtype=np.float64)
    with np.errstate(over="ignore"):
        for n in range(1, ngram_max + 1):
            m = len(b) - n + 1
            if m <= 0:
                break
            h = np.full(m, np.uint64(0xCBF29CE484222325) ^ np.uint64(n), dtype=np.uint64)  # FNV-1a, seeded by n
            for j in range(n):
                h = (h ^ b[j : j + m]) * np.uint64(0x100000001B3)
            h ^= h >> np.uint64(33)  # murmur3 finaliser: spread the bits before bucketing
            h *= np.uint64(0xFF51AFD7ED558CCD)
            h ^= h >> np.uint64(33)
            bucket = (h % np.uint64(dim)).astype(np.int64)
            sign = np.where((h >> np.uint64(63)) & np.uint64(1), -1.0, 1.0)
            vec += np.bincount(bucket, weights=sign, minlength=dim)
    norm = np.linalg.norm(vec)
    return vec / norm if norm > 0 else vec


def predict(
    emb: np.ndarray,
    ref_idx: Sequence[int],
    labels: Sequence[float],
    temperature: float,
    calibrate: bool = True,
    chunk: int = 4096,
) -> np.ndarray:
    """(N,) predicted success rates of every row of ``emb`` (N, d; unit rows) from the reference
    rows ``ref_idx`` with measured ``labels``: closed-form attention, then the linear calibration.

    Worked example: two references with labels 0 and 1 and a query at cosine 1 and 0 to them,
    temperature 1: ``w = softmax([1, 0]) = [0.731, 0.269]``, ``p_base = 0.269``."""
    ref = emb[list(ref_idx)]
    v = np.asarray(labels, dtype=np.float64)
    out = np.empty(emb.shape[0], dtype=np.float64)
    for start in range(0, emb.shape[0], chunk):
        s = emb[start : start + chunk] @ ref.T / temperature
        s -= s.max(axis=1, keepdims=True)
        w = np.exp(s)
        out[start : start + chunk] = (w @ v) / w.sum(axis=1)
    if calibrate:
        out = linear_calibration(out[list(ref_idx)], v)(out)
    return out


def linear_calibration(pred: np.ndarray, labels: np.ndarray):
    """Least-squares ``labels ~ a * pred + c`` (the code's ``LinearRegression``); with constant
    predictions the fit is the labels' mean. The fitted line passes through the means, so the
    mean calibrated prediction over the fitted points equals the mean label."""
    x, y = np.asarray(pred, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    xm, ym = x.mean(), y.mean()
    var = ((x - xm) ** 2).sum()
    a = ((x - xm) * (y - ym)).sum() / var if var > 1e-12 else 0.0
    c = ym - a * xm
    return lambda p: a * p + c


def gumbel_ranking(p_hat: np.ndarray, alpha: float, tau: float, rng: np.random.Generator) -> np.ndarray:
    """All indices ordered by ``-|p_hat - alpha| / tau + Gumbel noise``, best first: every prefix
    is a sample without replacement from ``softmax(-|p_hat - alpha| / tau)`` (Gumbel top-k)."""
    logits = -np.abs(p_hat - alpha) / tau
    return np.argsort(-(logits + rng.gumbel(size=logits.shape[0])), kind="stable")


def select_round(p_hat: np.ndarray, count: int, alpha: float, tau: float, rng: np.random.Generator) -> np.ndarray:
    """``count`` indices sampled without replacement from ``softmax(-|p_hat - alpha| / tau)``,
    then shuffled (the code shuffles the selection before splitting it)."""
    top = gumbel_ranking(p_hat, alpha, tau, rng)[:count]
    return top[rng.permutation(len(top))]


# ------------------------------------------------------------------------- the controller


class DOTSOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps_per_round: int = Field(
        2, ge=1, description="mu: steps per selection round (reference rollouts once per round)."
    )
    ref_size: int | None = Field(
        None,
        ge=1,
        description="Reference prompts rolled out per round (default "
        "control.prompts_per_step // 2, at least 1; the script: 256 for 512 prompts per step).",
    )
    ref_rollouts: int | None = Field(
        None, ge=1, description="Rollouts per reference prompt (default control.rollouts_per_prompt)."
    )
    alpha: float = Field(0.5, ge=0.0, le=1.0, description="Target success rate: score = -|p_hat - alpha|.")
    tau: float = Field(1e-3, gt=0, description="Selection temperature of softmax(score / tau) (small = almost greedy).")
    replay_fraction: float = Field(
        0.5,
        ge=0.0,
        lt=1.0,
        description="Share of each batch that rollout replay supplies after "
        "round 0: rounds after the first select round(B * (1 - replay_fraction)) prompts per "
        "step; use the same value in replay.options.replay_fraction (0 = no replay).",
    )
    attention_temperature: float = Field(
        0.1,
        gt=0,
        description="Temperature of the attention softmax over cosine similarities to the reference prompts [ours].",
    )
    calibrate: bool = Field(True, description="Apply the least-squares linear calibration fitted on the reference set.")
    embed_dim: int = Field(256, ge=8, description="Buckets of the hashed character n-gram embedding [ours].")
    ngram_max: int = Field(
        3, ge=1, le=8, description="Longest character (byte) n-gram hashed into the embedding [ours]."
    )


class DOTS(Controller):
    """DOTS (arXiv 2506.05316): reference rollouts once per round, attention-predicted difficulty,
    near-greedy selection of the prompts closest to ``alpha`` for the round's ``mu`` steps."""

    Options = DOTSOptions
    compat = Compat(keeps_plan_state=True)  # select() sets the reference-step flag that plan() and next_round read

    def __init__(self, prompts: Sequence[Prompt], cfg, options: DOTSOptions | None, seed: int):
        self.cfg = cfg
        self.opts = options if options is not None else self.Options()
        self.prompts = list(prompts)
        self.index = {p.id: i for i, p in enumerate(self.prompts)}
        self.ref_size = min(self.opts.ref_size or max(1, cfg.prompts_per_step // 2), len(self.prompts))
        self.ref_rollouts = self.opts.ref_rollouts or cfg.rollouts_per_prompt
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.history = PromptHistory()
        self.step_budget = StepBudget.from_config(
            cfg, self.ref_size * self.ref_rollouts + cfg.prompts_per_step * cfg.rollouts_per_prompt
        )
        self.rounds = 0  # selection rounds started (the current round is number rounds - 1, from 0)
        self.queue: list[list[str]] = []  # the current round's remaining batches (prompt ids)
        self._emb: np.ndarray | None = None  # (N, embed_dim), computed on first use
        self._reference_step = False  # this step began with the reference rollouts
        self.last_predictions: np.ndarray | None = None  # (N,) p_hat of the latest round (inspection)

    @property
    def budget(self) -> int | None:
        return self.step_budget.rollouts

    @property
    def embeddings(self) -> np.ndarray:
        if self._emb is None:
            o = self.opts
            self._emb = (
                np.stack([ngram_embedding(p.text, o.embed_dim, o.ngram_max) for p in self.prompts])
                if self.prompts
                else np.zeros((0, o.embed_dim))
            )
        return self._emb

    def per_step(self) -> int:
        """Prompts per step of the current round: B in round 0, B (1 - replay_fraction) later."""
        b = self.cfg.prompts_per_step
        if self.rounds <= 1:
            return b
        return max(1, int(np.floor(b * (1.0 - self.opts.replay_fraction) + 0.5 + 1e-9)))

    # -------------------------------------------------------------- the controller protocol
    def select(self, state) -> list[Prompt]:
        if self.queue:
            self._reference_step = False
            return [self.prompts[self.index[pid]] for pid in self.queue.pop(0)]
        self._reference_step = True
        refs = self.rng.choice(len(self.prompts), size=self.ref_size, replace=False)
        return [as_reference(self.prompts[int(i)]) for i in refs]

    def plan(self, prompts: list[Prompt], state) -> Plan:
        n = self.ref_rollouts if self._reference_step else self.cfg.rollouts_per_prompt
        return self.step_budget.cap([Request(p, n) for p in prompts], self.history)

    def next_round(self, groups: list[Group], state) -> Plan:
        if not self._reference_step:
            return Plan()
        self._reference_step = False
        refs = [g for g in groups if is_reference(g.prompt)]
        self.start_round(refs)
        if not self.queue:
            return Plan()
        batch = self.queue.pop(0)  # holds no reference prompt (start_round)
        n = self.cfg.rollouts_per_prompt
        left = self.step_budget.remaining(self.history, groups)
        if left is not None:
            batch = batch[: left // n]  # whole groups only
        return self.step_budget.cap([Request(self.prompts[self.index[pid]], n) for pid in batch], self.history, groups)

    def observe(self, groups: list[Group], state) -> None:
        self.history.record(groups, state.step, self.rounds)

    # -------------------------------------------------------------- a selection round
    def start_round(self, ref_groups: list[Group]) -> None:
        """Predict every prompt's success rate from the reference groups, sample the round's
        selection and split it into batches (``queue``)."""
        self.rounds += 1
        idx, labels = [], []
        for g in ref_groups:
            scores = g.verified_rewards()
            if scores and g.prompt.id in self.index:
                idx.append(self.index[g.prompt.id])
                labels.append(sum(scores) / len(scores))
        if idx:
            p_hat = predict(self.embeddings, idx, labels, self.opts.attention_temperature, self.opts.calibrate)
        else:  # nothing could be measured: every prompt looks alike, the draw is uniform
            p_hat = np.full(len(self.prompts), self.opts.alpha)
        self.last_predictions = p_hat
        b = self.per_step()
        count = min(self.opts.steps_per_round * b, len(self.prompts))
        order = gumbel_ranking(p_hat, self.opts.alpha, self.opts.tau, self.rng)
        top = order[:count][self.rng.permutation(count)]
        ids = [self.prompts[int(i)].id for i in top]
        refs = {g.prompt.id for g in ref_groups}
        ids = [pid for pid in ids if pid not in refs] + [pid for pid in ids if pid in refs]  # references last
        self.queue = [ids[i : i + b] for i in range(0, len(ids), b)]
        # References still in batch 0 (generated in this very step) give way to the next prompts
        # of the same draw (the ranking continues the sampling without replacement).
        spare = (self.prompts[int(i)].id for i in order[count:] if self.prompts[int(i)].id not in refs)
        self.queue[0] = [pid if pid not in refs else next(spare, None) for pid in self.queue[0]]
        self.queue[0] = [pid for pid in self.queue[0] if pid is not None]

    # -------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        return {
            "rng": self.rng.bit_generator.state,
            "rounds": self.rounds,
            "queue": [list(q) for q in self.queue],
            "history": self.history.state_dict(),
        }

    def load_state_dict(self, s: dict) -> None:
        self.rng.bit_generator.state = s["rng"]
        self.rounds = int(s["rounds"])
        self.queue = [list(q) for q in s["queue"]]
        self.history.load_state_dict(s["history"])
        self._reference_step = False
