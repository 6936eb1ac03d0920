"""A trained FAPO judge as a flaw detector: ``reward.fapo.detector = "genrm:<run dir>"``.

Paper: FAPO, arXiv 2510.22543 §3: the flawed-positive penalty asks a generative reward model
(FAPO-GenRM) for the earliest erroneous step of a correct rollout. Here the judge is a rollwise run
of the ``fapo_judge`` task (``rollwise.tasks.fapo_judge``, preset ``configs/fapo_judge.toml``):
its newest checkpoint reads the rollout's working followed by ``?`` and answers, greedily, a step
index or ``none``. An answer that does not parse is "cannot judge" (None: read as not flawed and
counted in ``fapo/undecided_frac``), as the paper counts an unparseable judge output as not flawed.

The run directory is checked when the config loads (:func:`check`): it must exist, be a run of
task ``fapo_judge`` and hold a checkpoint; the model is loaded once, when the detector is built.
"""

from __future__ import annotations

from pathlib import Path

import tomllib
import torch

from rollwise.registry import UserError
from rollwise.types import Prompt


def check(arg: str) -> Path:
    """The judge's run directory, refused (``UserError``) when missing, not a ``fapo_judge`` run, or
    without a checkpoint."""
    from rollwise.trainer import checkpoint

    run_dir = Path(arg).expanduser()
    conf = run_dir / "config.resolved.toml"
    if not conf.is_file():
        raise UserError(f"genrm: {run_dir} is not a run directory (no config.resolved.toml)")
    task = tomllib.loads(conf.read_text()).get("task", {}).get("name")
    if task != "fapo_judge":
        raise UserError(
            f"genrm: {run_dir} is a run of task {task!r}, not a judge (train one with configs/fapo_judge.toml)"
        )
    if not checkpoint.list_steps(run_dir):
        raise UserError(f"genrm: {run_dir} has no checkpoint")
    return run_dir


class GenRMDetector:
    """``(prompt, completion) -> step | -1 | None`` from a trained judge (module docstring)."""

    check = staticmethod(check)

    def __init__(self, arg: str):
        from safetensors.torch import load_model

        from rollwise.export import _policy, resolve_checkpoint

        run_dir = check(arg)
        self.cfg, self.model, self.codec = _policy(run_dir)
        load_model(self.model, str(resolve_checkpoint(run_dir, None, log=lambda m: None) / "model.safetensors"))
        self.model.eval()
        self.max_new = self.cfg.sampling.max_new_tokens or 8
        self.device = next(self.model.parameters()).device

    @torch.no_grad()
    def answer(self, completion: str) -> str:
        """The judge's greedy answer to ``completion`` (its working) followed by ``?``."""
        from rollwise.tasks.fapo_judge import END, NAME

        text = completion.strip() + END
        ids = list(self.codec.encode_prompt(Prompt(id=f"{NAME}/judge/{text}", task=NAME, text=text, answer=None)))
        out: list[int] = []
        for _ in range(self.max_new):
            logits = self.model(torch.tensor([ids + out], device=self.device)).logits[0, -1]
            nxt = int(logits.argmax())
            if nxt in self.codec.eos_ids:
                break
            out.append(nxt)
        return self.codec.decode(out)

    def __call__(self, prompt: Prompt | None, completion: str) -> int | None:
        from rollwise.tasks.fapo_judge import n_steps, parse

        return parse(self.answer(completion), n_steps(completion.strip()))
