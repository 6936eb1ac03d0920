"""Guess the number: the built-in multi-turn environment task (docs/architecture.md §11, issue #30).

A secret integer in 1..``high`` (default 16, small enough for the tiny character model to learn a
binary search). The prompt says the range; each turn the policy writes a number, and the
environment answers ``" higher:"`` or ``" lower:"`` (the secret is higher / lower than the guess),
or ends the episode on the right number. Anything else (no number, out of range) is a turn too,
answered ``" 1-16?:"``. Reward: 1 on the turn that guesses the secret (so the trajectory reward
is 1 when it is found within ``task.max_turns``, else 0); the final verdict says so.

A transcript in plain form (the tiny model: printable ASCII, no newlines) reads::

    guess 1-16:  8 higher:12 lower:10 lower:9<eos>

Splits: a prompt is a (secret, seed) pair; train and held-out prompts have disjoint seeds (train
``0..n_train-1``, held-out from ``1_000_000``), secrets drawn uniformly by the task's ``seed``.
``env.reset(seed)`` needs nothing from the seed: the game is deterministic given the secret.

**Anchor** (GiGPO's step groups, ``objectives/gigpo.py``): the state a guess is made in is what the
feedback so far says about the secret, the interval ``lo-hi`` of the numbers it still allows
(``"1-16"`` before the first guess), not the guess just made. Feedback only narrows the interval
(an invalid guess, or one outside the interval, leaves it as it was), so two episodes of one
prompt that were told the same thing share a step group whatever they guessed to get there
(``8 lower:`` and ``10 lower: 8 lower:`` both reach ``1-7``), and episodes with different intervals
never do. As in GiGPO (arXiv 2505.10978), a state is keyed without the turn at which it is reached.

``verify(prompt, completion)`` reads a whole transcript (or a single completion, a one-guess
transcript): 1 when its last number is the secret, else 0. The episode pool does not call it
(the environment judges episodes); it serves parts that re-score text.

``episode_examples`` are binary-search demonstrations played against the environment itself
(so observations are exactly what the pool would append), with probability ``demo_noise`` of a
random guess in the still-possible range at each turn: the warm start's episodes.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from rollwise.envs.base import StepResult
from rollwise.registry import Compat, UserError
from rollwise.tasks._common import coerce_options, sample_prompts
from rollwise.types import Prompt, Verdict

NAME = "guess_number"
HELDOUT_SEED0 = 1_000_000
_INT = re.compile(r"-?\d+")


class GuessEnv:
    """One episode: the secret of its prompt, and the interval ``lo..hi`` the feedback so far
    leaves for it (the anchor, module docstring)."""

    forkable = True  # its whole state is (secret, lo, hi): envs/base.py, "Forking"

    def __init__(self, secret: int, high: int):
        self.secret, self.high = secret, high
        self.lo, self.hi = 1, high

    def reset(self, seed: int) -> None:
        self.lo, self.hi = 1, self.high  # deterministic given the secret

    def fork(self) -> GuessEnv:
        twin = GuessEnv(self.secret, self.high)
        twin.lo, twin.hi = self.lo, self.hi
        return twin

    def step(self, action: str) -> StepResult:
        anchor = f"{self.lo}-{self.hi}"  # the state this guess is made in
        text = action.strip()
        guess = int(text) if re.fullmatch(r"\d+", text) else None
        if guess is None or not 1 <= guess <= self.high:
            return StepResult(f" 1-{self.high}?:", reward=0.0, anchor=anchor)
        if guess == self.secret:
            return StepResult("", reward=1.0, done=True, verdict=Verdict(1.0, "correct"), anchor=anchor)
        if self.secret > guess:
            self.lo = max(self.lo, guess + 1)
            return StepResult(" higher:", reward=0.0, anchor=anchor)
        self.hi = min(self.hi, guess - 1)
        return StepResult(" lower:", reward=0.0, anchor=anchor)


class GuessTask:
    """See the module docstring."""

    name = NAME
    WARM_START_SIZED = False  # generated split: the warm start keeps model.warm_start.steps

    def __init__(self, options):
        self.options = o = options
        rng = random.Random(f"rollwise-guess-{o.seed}")
        self._train = tuple(self._prompt(rng.randint(1, o.high), s) for s in range(o.n_train))
        self._heldout = tuple(self._prompt(rng.randint(1, o.high), HELDOUT_SEED0 + s) for s in range(o.n_heldout))

    def _prompt(self, secret: int, seed: int) -> Prompt:
        return Prompt(
            id=f"{NAME}/{secret}/{seed}",
            task=NAME,
            text=f"guess 1-{self.options.high}: ",
            answer=str(secret),
            metadata={"secret": secret, "seed": seed, "difficulty": 1},
        )

    def train_prompts(self) -> Sequence[Prompt]:
        return self._train

    def heldout_prompts(self) -> Sequence[Prompt]:
        return self._heldout

    def environment(self, prompt: Prompt) -> GuessEnv:
        return GuessEnv(int(prompt.metadata["secret"]), self.options.high)

    def verify(self, prompt: Prompt, completion: str) -> Verdict:
        found = _INT.findall(completion)
        if not found:
            return Verdict(0.0, "no_answer")
        ok = int(found[-1]) == int(prompt.metadata["secret"])
        return Verdict(1.0 if ok else 0.0, "correct" if ok else "wrong", {"answer": found[-1]})

    def sft_examples(self, n: int, seed: int):
        raise NotImplementedError("guess_number trains from episode_examples (multi-turn demonstrations)")

    def episode_examples(self, n: int, seed: int) -> list[tuple[Prompt, tuple[tuple[str, str], ...]]]:
        """``n`` noisy binary-search games on train prompts drawn by ``seed`` (module docstring)."""
        rng = random.Random(f"rollwise-guess-demo-{seed}")
        out = []
        for p in sample_prompts(self._train, n, seed):
            env, steps = self.environment(p), []
            while True:  # the environment keeps the still-possible interval env.lo..env.hi
                lo, hi = env.lo, env.hi
                guess = rng.randint(lo, hi) if rng.random() < self.options.demo_noise else (lo + hi) // 2
                res = env.step(str(guess))
                steps.append((str(guess), res.observation))
                if res.done:
                    break
            out.append((p, tuple(steps)))
        return out


def make(arg: str | None, options=None) -> GuessTask:
    """Task factory: ``guess_number`` (no argument)."""
    if arg:
        raise UserError(f"task {NAME!r} takes no argument (got '{NAME}:{arg}')")
    return GuessTask(coerce_options(make.Options, options, NAME))


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    high: int = Field(default=16, ge=2, le=10_000, description="the secret is in 1..high")
    n_train: int = Field(default=512, ge=1, le=1_000_000, description="number of train games (prompts)")
    n_heldout: int = Field(default=64, ge=1, le=100_000, description="number of held-out games (prompts)")
    seed: int = Field(default=0, ge=0, description="fixes the secrets of both splits")
    demo_noise: float = Field(
        default=0.1, ge=0.0, le=1.0, description="warm-start demonstrations: chance of a random guess at each turn"
    )


make.Options = _Options
# an environment task: rollwise.compat checks the episode keys from the config alone; its episodes fork
# (GuessEnv.forkable; sampling.branching, rollwise.generate.branching)
make.compat = Compat(episodes=True, forkable=GuessEnv.forkable)
