"""The Python API a TRL user recognises (issue #46): a model, a dataset, reward functions, a config.

::

    import rollwise

    def correct(prompts, completions, answer, **kwargs):          # TRL's signature, unchanged
        return [float(c.strip() == str(a)) for c, a in zip(completions, answer)]

    result = rollwise.train(model="smollm2-135m", dataset=rows, reward_funcs=[correct],
                            overrides=["train.steps=40"])         # -> RunResult
    trainer = rollwise.Trainer(model=..., dataset=..., reward_funcs=[...])
    trainer.config.train.steps = 100                              # validated as --set train.steps=100 is
    trainer.train()

- ``model``: a name as ``model.name`` takes it (``"tiny"``, ``"smollm2-135m"``, a Hugging Face
  directory, a ``.gguf`` file), or an already loaded ``transformers`` model with its ``tokenizer``,
  saved once as a Hugging Face directory under the cache (``$ROLLWISE_CACHE/api-models/<digest>``)
  and trained from there: the object passed in is left as it is (TRL trains it in place); the
  trained model is ``result.run_dir / "final"``.
- ``dataset`` (and ``eval_dataset``, the held-out split): rows with a ``prompt`` column, in any form
  ``rollwise.tasks.dataset`` reads; ``reward_funcs`` / ``reward_weights``: as
  ``rollwise.verify.functions`` calls them. The two come together (the run's task becomes
  ``dataset:<handle>``); without them the config's own task runs.
- ``config``: a ``Config`` (``rollwise.load_config(...)``), a TOML path or a dict; ``overrides``:
  ``section.key=value`` strings applied on top, as ``--set``.

Everything is checked before a model loads: the rows and functions when the trainer is made, the
whole config again when ``train()`` starts (a section edited since names its key). Reward
functions are Python objects of this process: Ray rollout workers (``distributed.workers``) are
refused with that reason; asynchrony (``train.async``) generates in a thread of this process and
runs them there.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import tomllib

from rollwise.config import Config, load_config, to_toml
from rollwise.registry import UserError

# The keywords of ``train`` that ``rollwise.train(cfg, ...)`` hands to this API rather than to the loop.
API_ARGUMENTS = frozenset(
    {"model", "dataset", "reward_funcs", "reward_weights", "overrides", "config", "tokenizer", "eval_dataset"}
)


class Trainer:
    """``rollwise.Trainer(model=..., dataset=..., reward_funcs=[...]).train()``: see the module
    docstring. ``config`` is the typed ``Config`` the run will use; edit it before ``train()``."""

    def __init__(
        self,
        model: Any = None,
        dataset: Any = None,
        reward_funcs: Callable | Sequence[Callable] | None = None,
        reward_weights: Sequence[float] | None = None,
        overrides: Sequence[str] | None = None,
        config: Config | str | Path | dict | None = None,
        *,
        tokenizer: Any = None,
        eval_dataset: Any = None,
        log: Callable[[str], None] = print,
    ):
        self.log = log
        self.config = _config(config, list(overrides or []))
        if model is not None:
            self.config.model.name = _model_name(model, tokenizer)
        elif tokenizer is not None:
            raise UserError("tokenizer= goes with a loaded transformers model (model=...); a model name brings its own")
        if (dataset is None) != (reward_funcs is None):
            raise UserError(
                "dataset= and reward_funcs= come together: the reward functions score completions of the "
                "dataset's prompts (without both, the config's task.name runs with its own verifier)"
            )
        if eval_dataset is not None and dataset is None:
            raise UserError("eval_dataset= needs dataset= and reward_funcs=")
        if dataset is not None:
            from rollwise.tasks import dataset as rows
            from rollwise.verify.functions import RewardFunctions

            if self.config.task.name != type(self.config.task).model_fields["name"].default:
                raise UserError(
                    f"task.name = {self.config.task.name!r} and dataset= both say what to train on; give one"
                )
            rewards = RewardFunctions(reward_funcs, reward_weights)
            train = rows.read_rows(dataset, "dataset")
            held = rows.read_rows(eval_dataset, "eval_dataset") if eval_dataset is not None else None
            self.config.task.name = f"dataset:{rows.register(train, held, rewards)}"
        elif reward_weights is not None:
            raise UserError("reward_weights= needs reward_funcs=")
        self.config = check(self.config)

    def train(self, **kwargs):
        """Train and return a ``RunResult`` (``run_dir``, first and last evaluation, totals)."""
        from rollwise.loop import train

        return train(check(self.config), log=self.log, **kwargs)


def train(
    model: Any = None,
    dataset: Any = None,
    reward_funcs: Callable | Sequence[Callable] | None = None,
    reward_weights: Sequence[float] | None = None,
    overrides: Sequence[str] | None = None,
    config: Config | str | Path | dict | None = None,
    **kwargs,
):
    """``Trainer(...).train()`` in one call (``tokenizer``, ``eval_dataset`` and ``log`` as keywords)."""
    return Trainer(model, dataset, reward_funcs, reward_weights, overrides, config, **kwargs).train()


def check(cfg: Config) -> Config:
    """``cfg`` validated again as a whole (``load_config``: every key, strategy name and combination, so
    an assignment to a section since it was made is checked as its ``--set`` would be), plus the
    refusals of a run whose task holds Python objects (``dataset:``)."""
    if not isinstance(cfg, Config):
        raise UserError(f"config must be a rollwise Config (rollwise.load_config(...)), not {type(cfg).__name__}")
    checked = load_config(data=tomllib.loads(to_toml(cfg)))
    if checked.task.name.partition(":")[0] == "dataset" and checked.distributed.workers > 0:
        raise UserError(
            "the dataset and reward functions given to rollwise.train are Python objects of this process, which "
            "a Ray rollout worker does not have; set distributed.workers = 0 (or use task 'jsonl:<path>' / "
            "'hf:<path>' with a verifier import path)"
        )
    return checked


def _config(config: Any, overrides: list[str]) -> Config:
    if config is None or isinstance(config, (str, Path)):
        return load_config(config, overrides)
    if isinstance(config, Config):
        return load_config(data=tomllib.loads(to_toml(config)), overrides=overrides)
    if isinstance(config, dict):
        return load_config(data=config, overrides=overrides)
    raise UserError(
        f"config: give a rollwise Config, a TOML path or a dict, not {type(config).__name__} (a TRL GRPOConfig's "
        "fields map to rollwise keys as docs/migrating-from-trl.md lists)"
    )


def _model_name(model: Any, tokenizer: Any) -> str:
    """``model.name`` for ``model``: a name as it is, a loaded model saved as a Hugging Face directory."""
    if isinstance(model, (str, Path)):
        return str(model)
    if not hasattr(model, "save_pretrained") or not hasattr(model, "state_dict"):
        raise UserError(
            f"model: give a name ('tiny', 'smollm2-135m'), a model directory or a loaded transformers model, "
            f"not {type(model).__name__}"
        )
    if tokenizer is None:
        raise UserError("model= is a loaded transformers model: give its tokenizer too (tokenizer=...)")
    return str(save_model(model, tokenizer))


SAVE_ADDS = ("architectures", "dtype", "torch_dtype", "transformers_version")


def save_model(model: Any, tokenizer: Any) -> Path:
    """``model`` and ``tokenizer`` as a Hugging Face directory under the cache, named by a digest of the
    weights and the config (the same model is written once; a changed one gets its own directory)."""
    from rollwise.storage import cache_root

    conf = json.loads(model.config.to_json_string())
    for k in SAVE_ADDS:  # what save_pretrained writes into the model's config: the same model, the same digest
        conf.pop(k, None)
    h = hashlib.sha256(json.dumps([type(model).__name__, conf], sort_keys=True).encode())
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(dtype=_byte_dtype()).numpy().tobytes())
    out = cache_root() / "api-models" / h.hexdigest()[:16]
    if not (out / "config.json").is_file():
        tmp = out.with_name(out.name + ".tmp")
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tmp.replace(out)
    return out


def _byte_dtype():
    import torch

    return torch.uint8
