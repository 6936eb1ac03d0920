"""The ``task`` section: the prompt source, and the multi-turn keys of environment tasks
(``rollwise.generate.episodes``, docs/architecture.md §11) with their own refusal."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rollwise.registry import UserError
from rollwise.sections import Section, StrategyConfig


class TurnBudgetConfig(Section):
    """Turn budgets of environment tasks (``rollwise.generate.turn_budget``, issue #44)."""

    enabled: bool = Field(
        False,
        description="Environment tasks: cap an episode's turns at a quantile of the turns episodes took so far "
        "(arXiv 2510.16786's turn control), extended while the episode still moves; savings in turn_budget/*.",
    )
    quantile: float = Field(
        0.75, gt=0.0, le=1.0, description="The cap is this quantile of the observed turns (paper: the 75th percentile)."
    )
    warmup_episodes: int = Field(
        32, ge=1, description="Episodes observed at task.max_turns before the first cap is set."
    )
    window: int = Field(512, ge=1, description="The cap reads the turns of the last this many uncapped episodes.")
    extension: int = Field(1, ge=1, description="Turns one extension adds to an episode that reached its cap.")
    max_extensions: int = Field(
        2, ge=0, description="Extensions one episode may get (0 = a fixed cap); never past task.max_turns."
    )


class CleanerConfig(Section):
    """CLEANER's repaired trajectories (``rollwise.generate.cleaner``, issue #44)."""

    enabled: bool = Field(
        False,
        description="Tool tasks: when a tool call fails and a later turn repairs it, splice the repair in place of "
        "the failure before training (arXiv 2601.15141); the spliced row's tokens from the splice on are re-scored "
        "by the sampler; counts in cleaner/*.",
    )
    threshold: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Code similarity (difflib ratio of the failed and the repaired call) at or above which the "
        "splice is shallow (the call only); below it deep (the reasoning before the call too) [reconstructed].",
    )


class SemiOnlineConfig(Section):
    """UI-S1's semi-online replay of expert trajectories (``rollwise.envs.semi_online``, issue #44)."""

    enabled: bool = Field(
        False,
        description="Tasks with demonstrations: training episodes replay the prompt's expert trajectory, conditioned "
        "on the policy's own turns; a mismatched action is patched with the expert's (arXiv 2509.11543).",
    )
    patch_budget: int = Field(1, ge=0, description="Patches one episode may take; the next mismatch ends it (score 0).")


class TaskConfig(StrategyConfig):
    name: str = Field("arithmetic", description="'arithmetic', 'reasoning_gym:<dataset>' or 'jsonl:<path>'.")
    max_train_prompts: int = Field(
        0,
        ge=0,
        description="RL draws its prompts from the first N of the task's train split only "
        "(0 = all; like verl's data.train_max_samples): a small pool recurs every few steps, which "
        "history-based strategies (GRESO, SPEC-RL, replay) need. The warm start still uses the whole split.",
    )
    train_mix: dict[str, float] = Field(
        default_factory=dict,
        description="RL draws its prompts by difficulty in these shares (prompt metadata 'difficulty', e.g. "
        'arithmetic\'s level: {"5" = 0.75, "4" = 0.25}; shares sum to 1): the split\'s prompts in order, each '
        "difficulty up to its share of task.max_train_prompts (needed). The warm start and the held-out split keep "
        "the whole task (an RL prompt set harder than the supervised data, as practice has it). Empty: no mix.",
    )
    # Multi-turn episodes (environment tasks, e.g. guess_number; rollwise.generate.episodes, docs/architecture.md §11).
    max_turns: int = Field(
        8, ge=1, description="Environment tasks: policy turns per episode at most (the episode ends 'max_turns')."
    )
    max_tool_calls: int = Field(
        8,
        ge=0,
        description="Environment tasks: tool calls per episode at most; the tool layer marks further calls 'limit' "
        "and does not run them.",
    )
    max_episode_tokens: int = Field(
        256,
        ge=1,
        description="Environment tasks: policy + observation tokens per episode at most; a turn decodes at most "
        "min(sampling.max_new_tokens, what is left); the episode ends 'token_budget'.",
    )
    max_observation_tokens: int = Field(
        64,
        ge=1,
        description="Environment tasks: an observation (tool output, feedback) is cut to this many of its own "
        "tokens (a chat template's tokens around it are kept).",
    )
    tool_timeout_s: float = Field(10.0, gt=0, description="Environment tasks: wall-clock limit of one tool call.")
    tool_workers: int = Field(
        8, ge=1, description="Environment tasks: environment steps (tool calls) run in parallel, in threads."
    )
    turn_budget: TurnBudgetConfig = Field(
        default_factory=TurnBudgetConfig,
        description="Environment tasks: a cap on turns set from the observed turn distribution, with extensions.",
    )
    cleaner: CleanerConfig = Field(
        default_factory=CleanerConfig,
        description="Tool tasks: splice a repaired tool call in place of the failed one before training (CLEANER).",
    )
    semi_online: SemiOnlineConfig = Field(
        default_factory=SemiOnlineConfig,
        description="Tasks with demonstrations: training episodes replay expert trajectories, patched on a "
        "mismatch (UI-S1).",
    )
    episode_schedule: Literal["lockstep", "overlap", "rollout_wise"] = Field(
        "lockstep",
        description="Environment tasks: 'lockstep' = every turn waits for all environment steps (reproducible for a "
        "seed); 'overlap' = episodes whose step is done generate while others wait on slow tools (faster, not "
        "bit-reproducible); 'rollout_wise' = overlap, and a freed environment slot (task.env_slots) starts the next "
        "queued episode at once (DART, arXiv 2509.23866; rollwise.generate.rollout_wise).",
    )
    env_slots: int = Field(
        0,
        ge=0,
        description="Environment tasks: environments live at once (0 = one per episode of the call, all started "
        "together). With slots, episodes queue for one: 'lockstep' starts them in waves of env_slots, each waiting "
        "for its slowest episode; 'rollout_wise' starts the next one the moment an episode ends. Reports "
        "episodes/env_utilisation and episodes/sampler_utilisation.",
    )
    high_entropy_turns: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="Environment tasks: train only this fraction of a call's turns, those with the highest mean "
        "sampler entropy (DART; the others' tokens leave the loss; 1 = every turn) [reconstructed fraction: "
        "the paper's is not published].",
    )


# The multi-turn keys above (rollwise.generate.episodes); a single-turn task refuses them changed.
EPISODE_KEYS = (
    "max_turns",
    "max_tool_calls",
    "max_episode_tokens",
    "max_observation_tokens",
    "tool_timeout_s",
    "tool_workers",
    "episode_schedule",
    "env_slots",
    "high_entropy_turns",
    "turn_budget",
    "cleaner",
    "semi_online",
)


def check_single_turn(task: TaskConfig) -> None:
    """A task that makes single-turn rollouts (``rollwise.compat.check_episodes`` knows which from its
    factory) refuses the episode keys changed from their defaults: they would be silently ignored."""
    fields = type(task).model_fields
    changed = [k for k in EPISODE_KEYS if getattr(task, k) != fields[k].get_default(call_default_factory=True)]
    if changed:
        raise UserError(
            f"task.{changed[0]} applies to environment tasks (multi-turn episodes, e.g. 'guess_number') only; "
            f"task.name = {task.name!r} makes single-turn rollouts: remove the setting"
        )


def check_schedule(task: TaskConfig) -> None:
    """``task.episode_schedule = 'rollout_wise'`` refills freed environment slots: without
    ``task.env_slots`` every episode has its own environment from the start and nothing is refilled
    (it would be ``'overlap'`` under another name)."""
    if task.episode_schedule == "rollout_wise" and task.env_slots == 0:
        raise UserError(
            "task.episode_schedule = 'rollout_wise' starts queued episodes in freed environment slots, and "
            "task.env_slots = 0 gives every episode its own from the start: set task.env_slots (e.g. 8) or "
            "task.episode_schedule = 'overlap'"
        )
    if task.env_slots > task.tool_workers:
        raise UserError(
            f"task.env_slots = {task.env_slots} environments step in task.tool_workers = {task.tool_workers} "
            "threads, so some would queue for a thread and not for the tool: set task.tool_workers to at least "
            "task.env_slots"
        )
