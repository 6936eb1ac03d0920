"""The ``sampling`` section: training rollouts' sampling, the tree samplers (LATR, ``rollwise.generate.latr``;
ETMR, ``rollwise.generate.etmr``; EC-Tree, ``rollwise.generate.ec_tree``), ARRoL pruning
(``rollwise.generate.arrol``, which aliases ``ArrolOptions``), Sol-RL's FP8 candidate pool
(``rollwise.generate.sol_rl``) and branching episodes (``rollwise.generate.branching``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollwise.sections import Section


class TreeSamplingConfig(Section):
    """LATR tree rollouts (arXiv 2510.24302; systems.md §6; ``rollwise.generate.latr``). Defaults are the
    released code's dataclass defaults and, for the schedule, its Countdown script."""

    enabled: bool = Field(
        False,
        description="Generate a share of each training group as a LATR tree (hf backend only; evaluation never "
        "uses it; not with sampling.arrol or a replay that generates itself, e.g. APRIL, SPEC-RL). The tree phase "
        "decodes at most model.max_batch rows per forward (roots in chunks).",
    )
    schedule: dict[int, float] = Field(
        default_factory=lambda: {0: 1.0, 10: 0.75, 20: 0.5, 80: 0.25, 200: 0.0},
        description="eta by training step: k = round(n * eta) of a group's n rollouts come from the tree (value of "
        "the largest step key <= step; 0 before the first key; k < 2 means no tree). The step looked up is the policy "
        "version the rollouts are generated with (RunState.policy_version), which the synchronous training loop "
        "advances once per step, so it equals the training step. Default: the Countdown script's schedule.",
    )
    max_branch_per_token: int = Field(
        2,
        ge=2,
        description="m: top-m raw-probability candidates considered at each step (rank 1 continues the branch).",
    )
    tau_abs: float = Field(
        0.25,
        ge=0.0,
        description="Branch on candidate j only if p_j > tau_abs (raw, temperature-free probability; >= 1 never "
        "branches).",
    )
    tau_rel: float = Field(0.15, ge=0.0, description="... and p_1 - p_j < tau_rel.")
    lookahead: list[int] = Field(
        default_factory=lambda: [20, 30, 50],
        description="r: ages (tokens since birth) at which a child is compared with its parent and maybe pruned.",
    )
    ed_threshold: float | None = Field(
        0.4, ge=0.0, description="Prune if normalised Levenshtein distance < this (None = test off)."
    )
    suffix_threshold: float | None = Field(
        None, ge=0.0, description="Prune if the suffix-match score > this (None = off; LATR math scripts: 0.2)."
    )
    rouge_threshold: float | None = Field(
        None, ge=0.0, description="Prune if token ROUGE-L F > this (None = off; LATR math scripts: 0.5)."
    )
    keep_math_symbols: bool = Field(
        True,
        description="Never prune a child whose divergence point is an operator token (+ - * / = ^ ( ) < > %) in the "
        "parent.",
    )
    exit_fraction: float = Field(
        0.98,
        gt=0.0,
        le=1.0,
        description="Leave the tree phase once the full roots reach (exit_fraction - exit_decay * t / "
        "force_return_step) of all k's.",
    )
    exit_decay: float = Field(0.05, ge=0.0, description="return_nb_thres_decay of the released scripts.")
    force_return_step: int = Field(
        512, ge=0, description="Leave the tree phase after this many tokens at the latest (Countdown 512, math 1024)."
    )

    @model_validator(mode="after")
    def _check(self):
        bad = {k: v for k, v in self.schedule.items() if k < 0 or not 0.0 <= v <= 1.0}
        if bad:
            raise ValueError(f"sampling.latr.schedule needs step keys >= 0 and eta values in [0, 1], got {bad}")
        if not self.lookahead or any(r < 1 for r in self.lookahead):
            raise ValueError(f"sampling.latr.lookahead must be a non-empty list of ages >= 1, got {self.lookahead}")
        return self


class EtmrConfig(Section):
    """ETMR entropy-fork tree rollouts (ETTRL, arXiv 2508.11356; guidance.md §5.2.1;
    ``rollwise.generate.etmr``). Defaults: the paper's N = 2, B = 2; the [RECON] details of the spec."""

    enabled: bool = Field(
        False,
        description="Generate each training group as ETMR trees: M roots (M = n // (1 + branches * forks)), each "
        "forked at its forks highest-entropy positions with branches new branches per fork, M (1 + B N) leaves "
        "(hf backend only; evaluation never uses it; not with another tree sampler, sampling.arrol or a replay that "
        "generates itself). control.rollouts_per_prompt must be a multiple of 1 + B N.",
    )
    forks: int = Field(2, ge=1, description="N: fork positions per root, its top-N sampler-entropy positions.")
    branches: int = Field(2, ge=1, description="B: new branches sampled at each fork position.")
    ignore_first: int = Field(
        4, ge=0, description="Completion positions before this are never forks (spec [RECON]: the first 4 tokens)."
    )
    min_gap: int = Field(
        1, ge=1, description="Fork positions of one root are at least this many tokens apart (spec [RECON]: 1)."
    )


class EcTreeConfig(Section):
    """EC-Tree entropy-confidence tree rollouts (ECHO, arXiv 2602.02150; guidance.md §5.3.3;
    ``rollwise.generate.ec_tree``). Entropy over the full vocabulary and the paper's confidence (mean top-k
    probability), so the confidence thresholds are the spec's recalibration [RECON], not the released code's."""

    enabled: bool = Field(
        False,
        description="Generate each training group as an EC-Tree: base completions branched once where entropy is "
        "high, confidence low and entropy jumps; completions that fail an online-pruning test are dropped and the "
        "group topped up with independent samples to n (hf backend only; evaluation never uses it; not with another "
        "tree sampler, sampling.arrol or a replay that generates itself).",
    )
    roots: int = Field(1, ge=1, description="Base completions per prompt (released code: 1).")
    min_depth: int = Field(4, ge=0, description="No branch or prune test before this completion position (code: 4).")
    entropy_high: float = Field(3.5, ge=0.0, description="H_high: branch only where H_t >= this (code: 3.5).")
    entropy_low: float = Field(1.0, ge=0.0, description="H_low of the width formula (code: 1.0).")
    entropy_jump: float = Field(
        0.2, description="Branch only where H_t - mean(H of the previous entropy_window steps) >= this (code: 0.2)."
    )
    entropy_window: int = Field(4, ge=1, description="Steps the entropy jump is measured against (code: 4).")
    confidence_top_k: int = Field(5, ge=1, description="k of the confidence C_t = mean top-k probability (paper: 5).")
    group_window: int = Field(
        4, ge=1, description="W_G: grouped confidence C^G_t = mean C over the last W_G steps [RECON: 4]."
    )
    branch_threshold: float = Field(
        0.1, gt=0.0, description="tau_b: branch only where C^G_t <= this (spec's recalibration for k = 5 [RECON])."
    )
    alpha: float = Field(2.0, description="alpha of the width formula (code: 2.0).")
    beta: float = Field(1.0, description="beta of the width formula (code: 1.0).")
    min_branches: int = Field(1, ge=1, description="Smallest width (candidates at the branch point, code: 1).")
    max_branches: int = Field(4, ge=1, description="Largest width (code: 4).")
    prune_threshold: float = Field(
        0.05, ge=0.0, description="Prune once the running minimum of C^G is below this (recalibrated [RECON])."
    )
    tail_window: int = Field(8, ge=1, description="W_T: tail confidence C_tail = mean C over the last W_T steps.")
    tail_threshold: float = Field(
        0.075,
        ge=0.0,
        description="Prune once C_tail fell 3 steps running and is <= this (recalibrated between the prune and "
        "branch thresholds [RECON]; code: 1.0 in DeepConf units).",
    )
    spike: float = Field(
        0.5, description="Prune once the entropy jump was > 0 for 3 steps running and is > this (code: 0.5)."
    )

    @model_validator(mode="after")
    def _check(self):
        if self.min_branches > self.max_branches:
            raise ValueError(
                f"sampling.ec_tree.min_branches ({self.min_branches}) must be <= max_branches ({self.max_branches})"
            )
        if self.entropy_high <= self.entropy_low:
            raise ValueError(
                f"sampling.ec_tree.entropy_high ({self.entropy_high}) must be above entropy_low ({self.entropy_low})"
            )
        return self


class ArrolOptions(BaseModel):
    """The options of ``rollwise.generate.arrol`` (its ``Options``): schema here, behaviour there."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    oversample: float = Field(
        2.0, ge=1.0, description="N_0 = ceil(oversample * n) rollouts started per request of n (spec example: 2)."
    )
    check_tokens: int | None = Field(
        None,
        ge=1,
        description="Check point L_p in generated tokens (default ceil(check_fraction * sampling.max_new_tokens)); "
        "must be < max_new_tokens.",
    )
    check_fraction: float = Field(
        0.25,
        gt=0.0,
        lt=1.0,
        description="Check point as a fraction of sampling.max_new_tokens, if check_tokens is unset [RECON].",
    )
    target_ratio: float = Field(
        0.5, gt=0.0, lt=1.0, description="rho: survivors' mean predicted success is steered towards this (paper: 0.5)."
    )
    head: Literal["linear", "mlp"] = Field(
        "linear", description="Quality head on the last hidden state: 'linear' (w^T h + b) or 'mlp' (one hidden layer)."
    )
    head_hidden: int = Field(64, ge=1, description="Hidden width of the 'mlp' head.")
    head_lr: float = Field(1e-2, gt=0.0, description="Adam learning rate of the head.")
    head_steps: int = Field(50, ge=1, description="Full-batch BCE steps on the buffer after each generation call.")
    buffer: int = Field(4096, ge=1, description="Most (feature, reward) pairs kept for head training (FIFO).")
    min_examples: int = Field(
        64, ge=0, description="Pruning stays off until the head has seen this many pairs [RECON]."
    )
    min_auc: float = Field(
        0.6,
        ge=0.0,
        le=1.0,
        description="... and until its averaged prequential AUC reaches this [RECON] (0 = prune once min_examples is "
        "met).",
    )
    auc_decay: float = Field(
        0.5,
        ge=0.0,
        lt=1.0,
        description="Exponential averaging of the per-call AUC: auc = decay * auc + (1 - decay) * new.",
    )


class ArrolConfig(ArrolOptions):
    enabled: bool = Field(
        False,
        description="ARRoL online rollout pruning (arXiv 2603.24840; rollwise.generate.arrol): start "
        "oversample * n rollouts per prompt and, at the check point, stop all but n, chosen so that their "
        "predicted success (a quality head on the policy's hidden state, trained online) is balanced "
        "(hf backend only; evaluation never uses it).",
    )


class SolRlConfig(Section):
    """Sol-RL's two-stage rollouts, an LLM analogue (arXiv 2604.06916; ``rollwise.generate.sol_rl``)."""

    enabled: bool = Field(
        False,
        description="Sol-RL (arXiv 2604.06916; rollwise.generate.sol_rl): sample pool_factor * n candidates per "
        "prompt with the FP8 sampler (needs model.rollout_precision = 'fp8' and train.matched_quantisation = false), "
        "verify all, keep the n most contrastive (top and bottom by reward) and re-score them with the trainer's "
        "full-precision forward, so the behaviour log-probs the trainer sees are the full-precision policy's. Every "
        "candidate's tokens are charged (hf backend only; evaluation never uses it).",
    )
    pool_factor: float = Field(
        4.0,
        gt=1.0,
        description="Candidates per prompt = ceil(pool_factor * n) for a request of n (the paper: 96 candidates, "
        "24 trained on, i.e. 4).",
    )


class BranchingConfig(Section):
    """Branching rollouts of environment tasks (episodes): episodes forked at tool-call turns
    (``rollwise.generate.branching``, issue #44); refused for a task whose environments cannot be forked."""

    mode: Literal["off", "aepo", "portool"] = Field(
        "off",
        description="Environment tasks: 'aepo' = AEPO's entropy pre-monitoring splits a group between fresh "
        "episodes and branches at tool-call turns (rollwise.generate.aepo, arXiv 2510.14545); 'portool' = "
        "PORTool's tree rollouts, forks at tool-call turns (rollwise.generate.portool, arXiv 2510.26020); "
        "'off' = independent episodes.",
    )
    fork_factor: int = Field(
        2, ge=2, le=16, description="Branches one fork makes (the forked episode and fork_factor - 1 copies)."
    )
    beta: float = Field(
        1.0,
        ge=0.0,
        description="AEPO: fresh episodes m = ceil(n * sigmoid(beta * (H_root - H_tool))), the mean sampler "
        "entropies of first turns and of turns after a tool call (0 = half the group).",
    )
    penalty: float = Field(
        0.5,
        ge=0.0,
        description="AEPO: an episode's branching score (the entropy of its turn after a tool call) minus "
        "penalty x the consecutive turns its line already branched at [reconstructed].",
    )


class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature for training rollouts (0 = greedy).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_new_tokens: int = Field(8, ge=1, description="Most tokens generated per rollout.")
    latr: TreeSamplingConfig = Field(
        default_factory=TreeSamplingConfig, description="LATR tree rollouts (off by default)."
    )
    etmr: EtmrConfig = Field(
        default_factory=EtmrConfig, description="ETMR entropy-fork tree rollouts (off by default)."
    )
    ec_tree: EcTreeConfig = Field(
        default_factory=EcTreeConfig, description="EC-Tree entropy-confidence tree rollouts (off by default)."
    )
    arrol: ArrolConfig = Field(
        default_factory=ArrolConfig, description="ARRoL online rollout pruning (off by default)."
    )
    sol_rl: SolRlConfig = Field(
        default_factory=SolRlConfig, description="Sol-RL's FP8 candidate pool and contrastive subset (off by default)."
    )
    branching: BranchingConfig = Field(
        default_factory=BranchingConfig,
        description="Environment tasks: episodes forked at tool-call turns (AEPO, PORTool; off by default).",
    )
