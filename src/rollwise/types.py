"""Records that cross stage boundaries (docs/architecture.md §2).

Small frozen dataclasses. Stages return new records (``dataclasses.replace``) instead of
mutating. Shapes are given in field comments; token sequences are tuples of ints so records
stay hashable and cheap to copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import torch

# A verified reward at or above this is a correct response (binary rewards): the per-prompt history
# (control), the pass-rate predictor (value) and the ledger's pass rates count with the same line.
CORRECT = 0.5

Finish = Literal["stop", "length", "partial", "error"]


@dataclass(frozen=True)
class Prompt:
    """One task instance. ``text`` is what the model sees unless ``messages`` is set (chat)."""

    id: str  # unique within a task
    task: str  # task name, e.g. "arithmetic"
    text: str  # plain prompt text (also used to render chat prompts)
    answer: str | None  # reference answer as text; None when the verifier needs no reference
    messages: tuple[Mapping[str, str], ...] | None = None  # chat form, if the model uses a template
    metadata: Mapping[str, Any] = field(default_factory=dict)  # difficulty, source, entry, ...


@dataclass(frozen=True)
class Verdict:
    """A verifier's judgement. ``score`` None means *could not verify*; it is never read as 0."""

    score: float | None  # usually 0.0 / 1.0; None = could not verify
    reason: str = ""  # short machine-friendly reason ("correct", "wrong", "no_answer", ...)
    details: Mapping[str, Any] = field(default_factory=dict)  # e.g. {"answer": "42"} for maj@k
    # Named reward components (GDPO, rollwise.objectives.gdpo), e.g. {"correct": 1.0, "format": 1.0};
    # None = the verifier gives only ``score``. ``score`` stays the training scalar and what evaluation counts.
    rewards: Mapping[str, float] | None = None

    @property
    def verified(self) -> bool:
        return self.score is not None


@dataclass(frozen=True)
class Completion:
    """What a backend returns for one sequence it was asked to continue."""

    token_ids: tuple[int, ...]  # newly generated ids (excludes the input); EOS included if hit
    logprobs: tuple[float, ...]  # sampler log-prob of each new id, len == len(token_ids)
    finish: Finish  # "stop" (EOS), "length" (max_new_tokens), "partial" (aborted), "error"
    entropies: tuple[float, ...] | None = (
        None  # sampler entropy at each new id (HFBackend.record_entropy); None = not recorded
    )


@dataclass(frozen=True)
class TreePath:
    """Where a rollout sits in its group's generation tree (LATR tree rollouts,
    ``rollwise.generate.latr``; read by the ``tree`` advantage, ``rollwise.objectives.tree``).

    A node is a token segment between branch points. ``nodes[d]`` is the node at depth d + 1 on
    the path from the prompt (depth 0) to this rollout's leaf; its tokens are
    ``completion_ids[starts[d]:starts[d + 1]]`` (the last one runs to the end). Rows that share a
    node share its tokens. Node ids are unique across the trees of a step.
    """

    nodes: tuple[int, ...]  # (D,) node ids, root -> leaf
    starts: tuple[int, ...]  # (D,) completion index where each node's segment starts; starts[0] == 0, non-decreasing


@dataclass(frozen=True)
class ToolCall:
    """One tool call an episode made (``rollwise.envs``): what was called and how it went."""

    name: str  # tool name as the policy wrote it ("" when the call could not be parsed)
    arguments: str  # the arguments as the policy wrote them (text)
    seconds: float  # wall-clock of the call
    # "ok", "error" (the tool raised / the code failed), "timeout", "truncated" (output cut),
    # "unknown_tool", "parse_error", "limit" (task.max_tool_calls reached: not run)
    outcome: str


@dataclass(frozen=True)
class Turn:
    """One turn of an episode, as indices into its rollout's ``completion_ids``: the policy's
    tokens are ``[start, end)`` (loss mask 1), the observation appended after them (tool output,
    environment or verifier feedback; loss mask 0) is ``[end, obs_end)`` (empty on the last turn)."""

    start: int
    end: int
    obs_end: int
    reward: float | None = None  # the environment's reward for this turn's action (None = none given)
    tool_calls: tuple[ToolCall, ...] = ()
    anchor: str | None = None  # the environment state the turn acted in, as a key (GiGPO's step groups)
    # the environment replaced this turn's action by an expert's before going on (UI-S1's patch,
    # ``rollwise.envs.semi_online``): the turns after it follow a history the policy did not write
    patched: bool = False


@dataclass(frozen=True)
class Episode:
    """The turns of a multi-turn rollout (docs/architecture.md §11). A single-turn rollout has no
    ``Episode`` (``Rollout.episode`` None) and is the one-turn case everywhere."""

    turns: tuple[Turn, ...]
    # why it ended: "done" (the environment ended it), "max_turns", "token_budget", "length"
    # (a turn hit max_new_tokens and the environment could not go on), "error"
    end: str = "done"

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(c for t in self.turns for c in t.tool_calls)

    def policy_tokens(self) -> int:
        return sum(t.end - t.start for t in self.turns)

    def observation_tokens(self) -> int:
        return sum(t.obs_end - t.end for t in self.turns)


@dataclass(frozen=True)
class Rollout:
    """One sampled response to a prompt."""

    prompt_id: str
    prompt_ids: tuple[int, ...]  # (P,) tokenised prompt as the model saw it
    completion_ids: tuple[int, ...]  # (C,) response ids, EOS included when finish == "stop"
    logprobs: tuple[float, ...]  # (C,) sampler log-probs (behaviour policy mu)
    finish: Finish
    policy_version: int  # version that generated the first token
    text: str = ""  # decoded completion (special tokens removed)
    verdict: Verdict | None = None
    advantage: float | None = None
    # For resumed rollouts: version of each completion token (None = all policy_version).
    token_versions: tuple[int, ...] | None = None
    # Tree rollouts (LATR): the rollout's path in its group's generation tree (None = sampled alone).
    tree: TreePath | None = None
    # (C,) 1 = the token enters the loss, 0 = context only (APRIL's prefix mode "mask"); None = all 1.
    loss_mask: tuple[int, ...] | None = None
    # (C,) sampler entropy at each completion token (D3S token selection); None = not recorded.
    entropies: tuple[float, ...] | None = None
    # Multi-turn rollouts: the turns inside ``completion_ids`` (policy and observation tokens, the
    # observation tokens with log-prob 0.0 and ``loss_mask`` 0); None = a single-turn rollout.
    episode: Episode | None = None

    @property
    def reward(self) -> float | None:
        return None if self.verdict is None else self.verdict.score


@dataclass(frozen=True)
class Group:
    """A prompt and its rollouts; any number of rollouts (groups may differ in size)."""

    prompt: Prompt
    rollouts: tuple[Rollout, ...]

    def rewards(self) -> list[float | None]:
        return [r.reward for r in self.rollouts]

    def verified_rewards(self) -> list[float]:
        """Rewards of the rollouts that could be verified (None is never read as 0)."""
        return [r.reward for r in self.rollouts if r.reward is not None]

    def is_zero_variance(self, tol: float = 0.0, short_is_zv: bool = True) -> bool:
        """True when the verified rewards (two or more) are all equal within ``tol``: such a
        group has zero advantage under any group baseline (selection.md §0.3 ``is_zv``).
        Groups with fewer than two verified rewards count too (they carry no signal) unless
        ``short_is_zv=False`` (SkyRL's replace rule: a single rollout is a good group)."""
        s = self.verified_rewards()
        if len(s) < 2:
            return short_is_zv
        return max(s) - min(s) <= tol

    @property
    def size(self) -> int:
        return len(self.rollouts)


@dataclass(frozen=True)
class Decision:
    """A filter's keep/drop with a reason; reasons become ``filter/<reason>`` counters."""

    keep: bool
    reason: str


@dataclass(frozen=True)
class Request:
    """Ask for ``n`` rollouts of ``prompt``; ``prefix`` continues a partial response."""

    prompt: Prompt
    n: int
    prefix: tuple[int, ...] | None = None  # completion ids to continue from (same for all n)
    prefix_logprobs: tuple[float, ...] | None = None  # sampler log-probs of the prefix ids
    prefix_versions: tuple[int, ...] | None = None  # policy version of each prefix id


@dataclass(frozen=True)
class Plan:
    """A list of generation requests. An empty plan ends the generation rounds of a step."""

    requests: tuple[Request, ...] = ()

    def __bool__(self) -> bool:
        return any(r.n > 0 for r in self.requests)

    @property
    def total(self) -> int:
        return sum(r.n for r in self.requests)


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 16


@dataclass(frozen=True)
class Batch:
    """Padded tensors for the trainer. Row i is one rollout; positions are aligned so that
    ``*_logprobs[i, t]`` is the log-prob of ``input_ids[i, t]`` given ``input_ids[i, :t]``.

    ``num_loss_tokens`` and ``num_sequences`` are the *global* counts of the optimizer step;
    micro-batch slices keep them, so objectives never normalise by a micro-batch's count.
    """

    input_ids: torch.Tensor  # (B, T) long, right-padded prompt + completion
    attention_mask: torch.Tensor  # (B, T) bool
    loss_mask: torch.Tensor  # (B, T) float, 1 on completion tokens that enter the loss
    old_logprobs: torch.Tensor  # (B, T) float, sampler (behaviour) log-probs, 0 off-mask
    advantages: torch.Tensor  # (B,) float, one per sequence (broadcast over its tokens)
    rewards: torch.Tensor  # (B,) float
    group_index: torch.Tensor  # (B,) long, row -> group
    policy_versions: torch.Tensor  # (B, T) long, version of each token (0 off-mask)
    num_loss_tokens: int  # global sum of loss_mask over the optimizer step
    num_sequences: int  # global number of sequences with >= 1 loss token
    ref_logprobs: torch.Tensor | None = None  # (B, T) frozen reference log-probs, if KL is on
    prox_logprobs: torch.Tensor | None = None  # (B, T) proximal policy log-probs (decoupled PPO)
    token_advantages: torch.Tensor | None = (
        None  # (B, T) per-token advantages (tree advantage); replaces ``advantages`` in token-level objectives
    )
    num_rows: int | None = (
        None  # global number of rows of the optimizer step, empty ones included (objective option count_empty_rows)
    )

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device) -> Batch:
        return dataclasses.replace(
            self,
            **{
                f.name: getattr(self, f.name).to(device)
                for f in dataclasses.fields(self)
                if isinstance(getattr(self, f.name), torch.Tensor)
            },
        )

    def rows(self, idx: slice | torch.Tensor) -> Batch:
        """A micro-batch: the selected rows, trimmed to their longest sequence, global counts kept."""
        mask = self.attention_mask[idx]
        length = int(mask.sum(dim=1).max().item()) if mask.numel() else 0
        cut = lambda t: None if t is None else (t[idx][:, :length] if t.dim() == 2 else t[idx])  # noqa: E731
        return dataclasses.replace(
            self,
            **{
                f.name: cut(getattr(self, f.name))
                for f in dataclasses.fields(self)
                if isinstance(getattr(self, f.name), torch.Tensor)
            },
        )


@dataclass(frozen=True)
class LossOut:
    """An objective's result for one micro-batch: ``loss`` is already divided by the global
    denominator, so summing ``loss`` over micro-batches gives the step's loss."""

    loss: torch.Tensor  # scalar, differentiable
    metrics: Mapping[str, float] = field(default_factory=dict)  # sums over the micro-batch's tokens


# ---------------------------------------------------------------- protocols (docs/architecture.md §3)


@runtime_checkable
class Verifier(Protocol):
    def __call__(self, prompt: Prompt, completion: str) -> Verdict: ...


@runtime_checkable
class Task(Protocol):
    """A prompt source with fixed train / held-out splits and its verifier."""

    name: str

    def train_prompts(self) -> Sequence[Prompt]: ...

    def heldout_prompts(self) -> Sequence[Prompt]: ...

    def verify(self, prompt: Prompt, completion: str) -> Verdict: ...


def reference_completions(task, n: int, *, episodes: bool) -> tuple[list[str], str]:
    """Up to ``n`` of the task's reference completions (train split, seed 0) and what they are: an
    environment task's demonstrated actions, one per turn (``sampling.max_new_tokens`` bounds a turn;
    ``rollwise.envs.base``), else its warm-start targets, else its reference answers. ``episodes``:
    the task runs multi-turn episodes, as its compatibility record declares
    (``rollwise.compat.declares_episodes``). Read through the task contract, here on the ground floor,
    because the warm start (``trainer/warm_start.py``) and the config derivation (``rollwise.defaults``)
    both ask it of whatever task the run built."""
    n = min(n, len(task.train_prompts()))
    if episodes:
        demos = task.episode_examples(n, 0)
        return [t[0] for _, turns in demos for t in turns if t[0]], "demonstrated actions"
    try:
        return [t for _, t in task.sft_examples(n, 0) if t], "warm-start targets"
    except (NotImplementedError, AttributeError):
        return [p.answer for p in task.train_prompts()[:n] if p.answer], "reference answers"


@runtime_checkable
class Backend(Protocol):
    """Continue token sequences. ``sequences[i]`` is prompt ids + any already generated ids."""

    def generate(self, sequences: Sequence[Sequence[int]], sampling: Sampling) -> list[Completion]: ...


class Controller:
    """Which prompts, how many rollouts each, and extra rounds (docs/architecture.md §1, §3): the
    controller contract, written once, as the base class every controller
    (``rollwise.control.REGISTRY``) and controller wrapper inherits. It lists every hook the loop,
    the batch builder and the pools call, the optional ones with defaults that change nothing, so
    nothing probes a controller for a hook (issue #27). Constructed as
    ``Cls(train_prompts, control_cfg, options, seed)``.

    Required (no default): ``select``, ``plan``, ``state_dict``, ``load_state_dict``. Optional, with
    their defaults: ``next_round`` (no further round), ``finish_batch`` (the kept groups, unchanged),
    ``observe`` (nothing), ``bind`` (nothing), ``advantage_inputs`` (an empty record: advantages
    unweighted, no prior, no baseline), ``after_update`` (nothing), ``metrics`` (none), ``history``
    (None: no ``prompt_stats.json``). Whether it may be planned ahead is its compatibility record's
    ``keeps_plan_state`` (``rollwise.registry.Compat``; ``rollwise/control/__init__.py``)."""

    metrics: Mapping[str, float] = MappingProxyType({})  # read-only default; controllers assign their own dict
    history: Any = None  # a PromptHistory, dumped to prompt_stats.json at each checkpoint

    def select(self, state: RunState) -> list[Prompt]:
        raise NotImplementedError

    def plan(self, prompts: list[Prompt], state: RunState) -> Plan:
        raise NotImplementedError

    def next_round(self, groups: list[Group], state: RunState) -> Plan | None:
        """The next generation round of this step; an empty plan when the step's rollouts are done."""
        return Plan()

    def finish_batch(self, groups: list[Group], kept: list[Group], dropped) -> list[Group]:
        """The training groups from the filters' ``kept`` groups (of all generated ``groups``); may count
        extra drop reasons in ``dropped``."""
        return kept

    def observe(self, groups: list[Group], state: RunState) -> None:
        """Every group generated this step (before filtering), so per-prompt statistics see all
        rollouts."""

    def bind(self, services: Services) -> None:
        """The run's services (:class:`Services`), given once the run is assembled."""

    def advantage_inputs(self, rows, needs: Collection[str] = ()) -> AdvantageInputs:
        """What this controller gives the advantage stage for the step's ``rows``, as one record
        (row weights, priors, baselines; :class:`AdvantageInputs`), computed before the estimator.
        ``needs`` names the inputs the step's estimator declares (``fn.inputs``), so a prior or a
        baseline is computed only for an estimator that reads it. None of them by default:
        advantages unweighted, and an estimator that needs a prior (V0.5) or a baseline (MSSR) is
        refused by the batch builder, naming the controller it needs."""
        return AdvantageInputs()

    def after_update(self, batch, rows, metrics: dict, advantages) -> None:
        """After the optimizer step: the trained ``batch`` and ``rows``, the step's ``metrics`` and the
        estimator's (unweighted) ``advantages`` of the rows."""

    def state_dict(self) -> dict:
        """Goes into checkpoints, with :meth:`load_state_dict`."""
        raise NotImplementedError

    def load_state_dict(self, s: dict) -> None:
        raise NotImplementedError


@runtime_checkable
class Filter(Protocol):
    def __call__(self, group: Group) -> Decision: ...


@runtime_checkable
class Pool(Protocol):
    """What the loop generates through (``rollwise.distributed.local.LocalPool`` and every pool or
    wrapper around it): the groups of a plan, the step's cost, and ``close`` (stop threads, actors)."""

    def generate(self, plan: Plan, groups: list[Group], version: int) -> list[Group]: ...

    def take_cost(self) -> Any: ...

    def close(self) -> None: ...


class PoolWrapper:
    """A rollout wrapper around another pool (``self.pool``; ``components.ROLLOUT_WRAPPERS``): it
    overrides ``generate`` for training groups, and the step's cost (``cost``, ``take_cost``),
    evaluation (``rollouts``) and ``close`` are the wrapped pool's."""

    def __init__(self, pool):
        self.pool = pool

    @property
    def cost(self):
        return self.pool.cost

    def take_cost(self):
        return self.pool.take_cost()

    def close(self) -> None:
        self.pool.close()

    def rollouts(self, *args, **kwargs):
        return self.pool.rollouts(*args, **kwargs)


@runtime_checkable
class Stateful(Protocol):
    """A part whose state goes into checkpoints (controller, replay source, trainer, ledger, backend, ...)."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, s: dict) -> None: ...


@runtime_checkable
class WeightReceiver(Protocol):
    """An engine or pool that does not share the trainer's module and gets its published weights
    (vLLM, Ray workers, the async pool's generator)."""

    def load_weights(self, version: int, weights: dict) -> Any: ...


@runtime_checkable
class EntropyRecorder(Protocol):
    """A backend that can record the sampler's entropy of each generated token (``HFBackend``)."""

    record_entropy: bool


class ReplaySource:
    """Base class of every replay source (``rollwise.replay.REGISTRY``): ``add``, ``mix``,
    ``state_dict``, ``load_state_dict`` required; ``metrics`` (none) and ``bind`` (nothing) optional
    with defaults. A source that schedules generation itself (APRIL and SPEC-RL, in ``generate/``) sets
    ``schedules_generation = True`` and has ``wrap_pool(pool, controller, state) -> pool``; the
    assembler wraps the worker pool with it (``rollwise.components.ROLLOUT_WRAPPERS``). On the ground
    floor, since both the replay stage and those generators implement it (docs/architecture.md §5
    rule 2)."""

    schedules_generation: ClassVar[bool] = False  # True: wrap_pool(pool, controller, state) owns generation
    metrics: Mapping[str, float] = MappingProxyType({})  # read-only default; sources assign their own dict

    def bind(self, services) -> None:
        """The run's services (``rollwise.types.Services``), given once the run is assembled."""

    def add(self, groups: list) -> None:
        raise NotImplementedError

    def mix(self, fresh: list, state) -> list:
        raise NotImplementedError

    def state_dict(self) -> dict:
        raise NotImplementedError

    def load_state_dict(self, s: dict) -> None:
        raise NotImplementedError


@runtime_checkable
class ReplaySourceProtocol(Protocol):
    """A replay source (:class:`ReplaySource` declares the optional parts)."""

    metrics: Mapping[str, float]
    schedules_generation: bool

    def bind(self, services: Services) -> None: ...

    def add(self, groups: list[Group]) -> None: ...

    def mix(self, fresh: list[Group], state: RunState) -> list[Group]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, s: dict) -> None: ...


@dataclass(frozen=True)
class Services:
    """What strategies may use of the assembled run, handed to them at ``bind`` (instead of the run):
    the task, the token codec, ``sampling.max_new_tokens``, the trainer's no-grad log-probs of a
    batch under the current weights (``policy_logprobs``) and with the frozen reference's
    (``policy_and_reference_logprobs``), and ``trainer`` for a strategy that scores the batch with its
    own loss at the current weights (Prompt-GDRO's per-response losses), and ``value``: the pass-rate
    predictor (``rollwise.value.model.ValueModel``) when ``value.enabled``, else None."""

    task: Any = None
    codec: Any = None
    max_new_tokens: int | None = None
    policy_logprobs: Callable[[Batch], torch.Tensor] | None = None
    policy_and_reference_logprobs: Callable[[Batch], tuple[torch.Tensor, torch.Tensor]] | None = None
    trainer: Any = None
    value: Any = None


@dataclass(frozen=True)
class AdvantageContext:
    """The advantage inputs that need more than the rows, computed before the estimator
    (``rollwise.batches.advantage_context``); None where the estimator / controller has none.

    ``confidence_shift``: (B,) sampler minus reference log-prob sums (ACE); ``value_prior``: (B,)
    V0.5's prior; ``prompt_baseline``: (B,) MSSR's baseline; ``value_baseline``: (B,) POISE's
    cross-rollout value baseline; ``policy_entropy``: (B, L) the current policy's entropy at each
    completion position (ADHint's CGM); ``seq_log_weights`` and ``score_norms``: (B,) each row's
    ``sum_t (log pi_prox - log mu)`` and score-gradient norm (VCPO's OPOB); ``weights``: (B,)
    Prompt-GDRO's row weights, multiplied into the estimator's advantages."""

    confidence_shift: torch.Tensor | None = None
    value_prior: torch.Tensor | None = None
    prompt_baseline: torch.Tensor | None = None
    value_baseline: torch.Tensor | None = None
    policy_entropy: torch.Tensor | None = None
    seq_log_weights: torch.Tensor | None = None
    score_norms: torch.Tensor | None = None
    weights: torch.Tensor | None = None


@dataclass(frozen=True)
class AdvantageInputs:
    """What a controller gives the advantage stage for a step's rows, one record from one hook
    (``Controller.advantage_inputs``; issue #41): ``weights``, (B,) row weights multiplied into the
    estimator's advantages (Prompt-GDRO); ``priors``, (B,) each row's prompt prior (V0.5's
    ``value_prior``); ``baselines``, (B,) each row's per-prompt value baseline (MSSR's
    ``prompt_baseline``). None where the controller has none: the default record, ``AdvantageInputs()``,
    leaves the advantages unweighted, and an estimator that declares a prior or a baseline is refused
    (``objectives.inputs.advantage_context``)."""

    weights: torch.Tensor | None = None
    priors: torch.Tensor | None = None
    baselines: torch.Tensor | None = None


@dataclass(frozen=True)
class Advantages:
    """An advantage estimator's output for the rows of a batch."""

    values: torch.Tensor  # (B,) float, one advantage per rollout
    include: torch.Tensor  # (B,) bool, rows that enter the loss (False e.g. for MC-GRPO's pivot)
    # Optional per-token form (tree advantage): (B, L) over completion positions, L = longest
    # completion; positions past a row's completion are ignored. ``values`` stays the per-row summary.
    token_values: torch.Tensor | None = None  # (B, L) float
    token_include: torch.Tensor | None = None  # (B, L) bool, completion tokens that enter the loss (gradient pruning)


@dataclass
class RunState:
    """What the loop knows at a step; passed to controllers and replay sources (read-only for them)."""

    step: int = 0
    policy_version: int = 0
    seed: int = 0
