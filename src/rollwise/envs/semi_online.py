"""UI-S1's semi-online replay: training episodes that follow an offline expert trajectory,
conditioned on the policy's own earlier turns (issue #44 item 4; ``task.semi_online``).

Paper: UI-S1, semi-online RL for GUI agents, arXiv 2509.11543 (code: X-PLUG/MobileAgent, ``UI-S1``);
the working specification is the UI-S1 entry of the project's agentic
specifications. Offline RL on expert trajectories trains each step on the expert's history, which
the policy never sees when it acts alone; online RL pays for every environment step and rarely
reaches the late steps of a long task. Semi-online RL rolls out on the expert trajectory but keeps
the policy's own actions in its history:

- at turn t the policy acts after its own earlier turns; when its action **matches** the expert's
  action ``a*_t``, the next observation is the expert's ``o*_t`` (replayed, no tool runs);
- on a **mismatch**, a **patch** substitutes the expert action: the episode goes on from the
  expert's state after ``a*_t``, up to ``task.semi_online.patch_budget`` patches; the next mismatch
  ends the episode (score 0, reason ``semi_online_budget``);
- each turn's reward is 1 for a match and 0 for a mismatch; the last expert turn (the answer) ends the
  episode with the task's own verdict of the policy's answer.

The turn a patch replaced is marked ``Turn.patched``; ``advantage.name = "ui_s1"``
(``rollwise.objectives.ui_s1``) resets the discounted returns there and normalises step returns
within (prompt, turn index). The replay wraps *training* episodes only: evaluation runs the task's
own environment (``rollwise.generate.episodes``).

**Reconstructions** [RECON] (GUI actions are typed and have coordinates; rollwise's are text):

- an action matches when its text equals the expert's after whitespace is collapsed;
- the patch substitutes the expert's action and goes on (the paper's patch variants are not
  reproduced);
- rollwise appends observations and never rewrites the policy's tokens, so a patch is *shown*: the
  observation after a mismatched turn is the expert's action followed by its observation (the
  policy's own action stays in its history, and in the loss, with reward 0);
- a replayed tool output is recorded as a call with outcome ``"replayed"`` (no tool ran; the ledger's
  ``episodes/tool_replayed``), so it is shown in the message role the expert's was;
- every turn's anchor is its turn index: all episodes of a prompt at turn t stand in the expert's
  state after t turns.

The built-in tasks with demonstrations (``calculator``, ``python_math``: ``ToolTask.demonstration``,
declared by ``Compat(demonstrations=True)``) are its data and make its environments
(``ToolTask.replay_environment``); the others are refused at load
(``rollwise.compat.check_episode_transforms``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rollwise.envs.base import StepResult
from rollwise.types import Prompt, ToolCall, Verdict

BUDGET_END = "semi_online_budget"


def same_action(a: str, b: str) -> bool:
    """Whether two actions match (module docstring): equal once whitespace runs are one space.
    Example: "<calc>1+2</calc>\\n" and "<calc>1+2</calc>" -> True; "<calc>1+3</calc>" -> False."""
    return " ".join(a.split()) == " ".join(b.split())


class SemiOnlineEnv:
    """One training episode replaying ``expert`` (``(action, observation, role)`` per turn, the last
    turn the answer); see the module docstring."""

    def __init__(
        self,
        prompt: Prompt,
        expert: Sequence[tuple[str, ...]],
        verify: Callable[[Prompt, str], Verdict],
        patch_budget: int,
    ):
        if not expert:
            raise ValueError(f"prompt {prompt.id!r} has an empty demonstration")
        self.prompt, self.expert, self.verify, self.budget = prompt, tuple(expert), verify, patch_budget
        self.t = self.patches = 0

    def reset(self, seed: int) -> None:
        self.t = self.patches = 0

    def step(self, action: str) -> StepResult:
        t = self.t
        a, obs, role = (*self.expert[t], "user")[:3]
        match = same_action(action, a)
        anchor = str(t)
        if not match:
            if self.patches >= self.budget:
                return StepResult("", 0.0, True, verdict=Verdict(0.0, BUDGET_END), anchor=anchor)
            self.patches += 1
        self.t += 1
        reward = 1.0 if match else 0.0
        if self.t == len(self.expert):  # the expert's answer: the task judges the policy's own
            v = self.verify(self.prompt, action)
            return StepResult("", reward, True, verdict=v, anchor=anchor, info={"patched": not match})
        calls = (ToolCall("replay", a, 0.0, "replayed"),) if role == "tool" else ()
        shown = obs if match else a + obs
        return StepResult(shown, reward, False, calls, anchor=anchor, info={"patched": not match})
