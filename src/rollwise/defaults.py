"""Defaults that follow the model and the task (issue #32), for the keys the user left unset.

``resolve(cfg)`` runs once at the start of a run (``Run.__init__``), before the strategies are
built. A key counts as set when the user's TOML, ``--set`` or a preset named it (pydantic's
``model_fields_set`` of its section): explicit settings always win, whatever their value. For the
keys left unset:

- ``sampling.max_new_tokens`` comes from the task's reference completions (its warm-start
  targets, else its reference answers): the longest one, in tokens, plus one for the end token,
  times the model profile's ``room``, plus its ``extra`` for reasoning, rounded up to a multiple of
  8 and kept between the profile's ``min_new_tokens`` and ``max_new_tokens_cap``. The built-in
  tiny models' tokens are characters; for a pretrained model (Hugging Face / GGUF) a token is
  counted as ``CHARS_PER_TOKEN`` characters (no tokenizer is loaded for this).
- ``control.prompts_per_step``, ``control.rollouts_per_prompt``, ``train.steps``, ``train.micro_batch``,
  ``eval.n_prompts``, ``eval.every`` and (pretrained models) ``sampling.temperature`` come from the model's profile
  (``PROFILES``): the tiny presets' profile is the schema's defaults; a pretrained model gets a run
  that finishes in reasonable time on a CPU.
- A pretrained model with ``train.lr`` unset trains LoRA adapters (``model.lora.enabled``, when
  the key is unset) at the default 2e-4, as the shipped SmolLM2 presets do; without peft that is
  refused with the install line (issue #40: falling back to a full fine-tune would train the same
  TOML differently on two machines). ``model.lora.enabled = false`` is a full fine-tune at
  ``PRETRAINED_FULL_LR``: one full-weight step at 2e-4 turns
  SmolLM2-135M's 3% truncated completions into 91% (measured on 2 CPU cores).
- ``eval.n_prompts`` is at most the task's held-out split (``warn_eval_prompts`` warns when a set
  value asks for more).
- ``model.warm_start.batch_size`` is at most the train split's size and ``model.warm_start.steps``
  at most ``WARM_EPOCHS`` passes over it (never more than the schema's default), for tasks read from
  data (a task class with ``WARM_START_SIZED = False``, the built-in arithmetic generator, keeps
  the default).

The embedded default (tiny + built-in arithmetic, no settings) derives exactly the schema's
defaults (8 tokens, 1,150 x 64 warm start, 32 x 8 rollouts, 600 steps), so ``resolve`` returns it
unchanged. What was derived, and from what, is logged once and written as comment lines at the
top of ``config.resolved.toml`` (the values themselves are in the file, so a resumed run reads
them as its saved settings, pinned).

``probe(run, line, seconds)`` checks the first step a session trains: more than half of its
rollouts cut at ``max_new_tokens`` (profiles with ``truncation_stop``), or a step time that puts
the remaining steps past ``MAX_HOURS``, stops the run with a ``UserError`` naming the key to
change, unless ``run.force``; a training reward above 0.5 with a held-out pass@1 near 0 at the
start logs a memorisation warning naming the warm-start keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rollwise.registry import UserError

CHARS_PER_TOKEN = 3.0  # a conservative characters-per-token ratio for BPE tokenizers (English and digits: ~3.5-4)
WARM_EPOCHS = 16  # the warm start's passes over the train split at most (5,000 arithmetic rows x 16 / 64 > 1,150)
MAX_HOURS = 24.0  # a run whose measured step time puts the remaining steps past this stops at step 0
TRUNCATION_STOP = 0.5  # share of step-0 rollouts cut at max_new_tokens that stops a run


PRETRAINED_FULL_LR = 1e-6  # full fine-tune of a pretrained model without LoRA (TRL's GRPO default learning rate)


def _has_peft() -> bool:
    import importlib.util

    return importlib.util.find_spec("peft") is not None


@dataclass(frozen=True)
class Profile:
    name: str
    settings: dict = field(default_factory=dict)  # dotted key -> value, for unset keys
    min_new_tokens: int = 8
    room: float = 1.25  # x the longest reference completion
    extra: int = 0  # + tokens of room for reasoning
    max_new_tokens_cap: int | None = None
    truncation_stop: bool = False  # the step-0 probe stops a run with most completions truncated


PROFILES = {
    # the schema's defaults; a tiny model answers in the task's format (the warm start teaches it), and
    # its untrained or briefly warm-started weights ramble to the limit, so truncation only warns there
    "tiny": Profile("tiny"),
    # a pretrained chat model on a CPU: 4 x 8 rollouts, 40 steps, a 32-prompt held-out evaluation
    # (the group size stays the schema's 8: benchmarks/regime_smollm2.toml relies on it), sampled at
    # temperature 0.7 with at least 256 new tokens: SmolLM2-135M-Instruct on short arithmetic questions
    # (examples/arith_qa.jsonl, 16 prompts x 8 samples, 384 tokens) rambles at temperature 1.0 (median
    # 70 tokens, 10% at 256 or more, 8.6% cut at 384, reward 0.08) and answers at 0.7 (median 48,
    # 95th percentile 176, 0.8% cut at 384, reward 0.16): benchmarks/results/pretrained_lengths.json.
    # Training passes of 4 rows: SmolLM2-135M in fp32 keeps 0.8-1.0 GB of activations per 560-token row
    # for its backward (measured, LoRA, sdpa attention), so the schema's 128 rows put a whole 32-rollout
    # step in one pass: textarena:GuessTheNumber-v0 (a ~300-token prompt + 256 episode tokens) was killed
    # for memory at 24 GB; at 8 rows it peaked at 11.9 GB
    "pretrained": Profile(
        "pretrained",
        {
            "train.micro_batch": 4,
            "control.prompts_per_step": 4,
            "train.steps": 40,
            "eval.n_prompts": 32,
            "eval.every": 20,
            "sampling.temperature": 0.7,
        },
        min_new_tokens=256,
        room=2.0,
        extra=64,
        max_new_tokens_cap=512,
        truncation_stop=True,
    ),
}


def profile(model_name: str) -> Profile:
    from rollwise.trainer import tiny

    return PROFILES["tiny" if model_name in tiny.NAMES else "pretrained"]


def is_set(cfg, key: str) -> bool:
    """Whether ``key`` (dotted) was set explicitly: it, or a section above it, is in its parent's
    ``model_fields_set``."""
    node = cfg
    for part in key.split("."):
        name = "async_" if part == "async" else part  # train.async is the field TrainConfig.async_
        if name not in node.model_fields_set:
            return False
        node = getattr(node, name)
    return True


def _get(cfg, key: str):
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def derive(cfg, task) -> dict[str, tuple[object, str]]:
    """``{key: (value, why)}`` for every unset key whose derived value differs from the schema's."""
    from rollwise.compat import declares_episodes
    from rollwise.trainer import tiny

    prof = profile(cfg.model.name)
    out: dict[str, tuple[object, str]] = {}
    for key, value in prof.settings.items():
        if not is_set(cfg, key) and _get(cfg, key) != value:
            out[key] = (value, f"the {prof.name} model profile")
    if prof.name == "pretrained" and not is_set(
        cfg, "train.lr"
    ):  # a full fine-tune at 2e-4 breaks the model in one step
        if not is_set(cfg, "model.lora.enabled"):
            if not _has_peft():  # the same TOML must not train differently where peft is missing
                from rollwise.trainer.hf_models import HF_EXTRA_HINT

                raise UserError(
                    f"model.lora.enabled is unset, so the pretrained model {cfg.model.name!r} trains LoRA adapters "
                    f"at train.lr 2e-4, which needs peft (not installed); install with: {HF_EXTRA_HINT}, or "
                    f"set model.lora.enabled = false for a full fine-tune (train.lr {PRETRAINED_FULL_LR:g} unless set)"
                )
            if not cfg.model.lora.enabled:
                out["model.lora.enabled"] = (
                    True,
                    "the pretrained profile: LoRA (r 16) at train.lr 2e-4, as configs/smollm2_arithmetic.toml",
                )
        elif not cfg.model.lora.enabled:
            out["train.lr"] = (
                PRETRAINED_FULL_LR,
                "the pretrained profile: a full fine-tune (no LoRA) of a pretrained "
                "model at the default 2e-4 breaks it in one step",
            )
    base = getattr(task, "_task", task)  # the warm start uses the whole train split (task.max_train_prompts)
    if not is_set(cfg, "eval.n_prompts"):
        held = len(task.heldout_prompts())
        if held < out.get("eval.n_prompts", (cfg.eval.n_prompts,))[0]:
            out["eval.n_prompts"] = (held, f"the task's held-out split, which has {held} prompts")
    if not is_set(cfg, "sampling.max_new_tokens"):
        refs = references(base, episodes=declares_episodes(cfg))
        if refs:
            builtin = cfg.model.name in tiny.NAMES
            longest = max(len(r) for r in refs)
            need = (longest if builtin else math.ceil(longest / CHARS_PER_TOKEN)) + 1  # + the end token
            n = 8 * math.ceil((need * prof.room + prof.extra) / 8)
            n = max(prof.min_new_tokens, n)
            if prof.max_new_tokens_cap is not None:
                n = min(prof.max_new_tokens_cap, n)
            unit = (
                "characters = tokens"
                if builtin
                else f"characters, ~{need - 1} tokens at {CHARS_PER_TOKEN:g} characters a token"
            )
            why = (
                f"the task's longest reference completion ({longest} {unit}) + 1 end token, x {prof.room:g}"
                + (f" + {prof.extra} for reasoning" if prof.extra else "")
                + f", in [{prof.min_new_tokens}, "
                + f"{prof.max_new_tokens_cap or 'no cap'}] ({prof.name} profile)"
            )
        else:
            n, why = prof.min_new_tokens, f"the {prof.name} profile (the task has no reference completions)"
        if n != cfg.sampling.max_new_tokens:
            out["sampling.max_new_tokens"] = (n, why)
    rows = len(base.train_prompts())
    ws = cfg.model.warm_start
    batch = ws.batch_size
    # a pretrained model is warm-started only on request; a task whose train split is generated (arithmetic's
    # n_train is a knob of its generator, and benchmarks/reuse.toml's 1,000 rows rely on the full warm start) keeps it
    warm = (cfg.model.name in tiny.NAMES or ws.pretrained) and getattr(base, "WARM_START_SIZED", True)
    if warm and not is_set(cfg, "model.warm_start.batch_size") and rows < batch:
        batch = rows
        out["model.warm_start.batch_size"] = (rows, f"the train split's {rows} rows")
    if warm and not is_set(cfg, "model.warm_start.steps") and ws.steps > 0:
        steps = min(ws.steps, math.ceil(WARM_EPOCHS * rows / batch))
        if steps != ws.steps:
            out["model.warm_start.steps"] = (
                steps,
                f"{WARM_EPOCHS} passes over the train split's {rows} rows at {batch} a step (at most {ws.steps:,})",
            )
    return out


def references(task, *, episodes: bool) -> list[str]:
    """The task's reference completions (a sample of up to 256; 32 demonstrations of an environment
    task, ``episodes``, whose actions are the references: ``types.reference_completions``)."""
    from rollwise.types import reference_completions

    return reference_completions(task, 32 if episodes else 256, episodes=episodes)[0]


def warn_eval_prompts(cfg, task, log) -> None:
    """Evaluation takes the first ``eval.n_prompts`` held-out prompts: say so when the split has fewer."""
    held = len(task.heldout_prompts())
    if held < cfg.eval.n_prompts:
        log(
            f"warning: evaluation uses {held} held-out prompts, not eval.n_prompts = {cfg.eval.n_prompts}: the task's "
            f"held-out split has only {held} (pass@1 is then coarse: steps of {1 / max(1, held):.3f})"
        )


def resolve(cfg, log=print):
    """``cfg`` with the derived defaults filled in (the same object when nothing is derived)."""
    from rollwise import tasks
    from rollwise.config import Config

    task = tasks.build(cfg)
    if is_set(cfg, "eval.n_prompts"):  # unset, it follows the held-out split (derive)
        warn_eval_prompts(cfg, task, log)
    derived = derive(cfg, task)
    if not derived:
        return cfg
    data = cfg.model_dump(mode="json", exclude_none=True)
    for key, (value, _) in derived.items():
        node = data
        *head, last = key.split(".")
        for part in head:
            node = node.setdefault(part, {})
        node[last] = value
    out = Config.model_validate(data)
    out._derived = {k: f"{v!r} from {why}" for k, (v, why) in derived.items()}
    log(
        "defaults for "
        + f"{cfg.model.name} / {cfg.task.name} (keys you did not set; --set KEY=VALUE overrides): "
        + "; ".join(f"{k} = {v!r} ({why})" for k, (v, why) in derived.items())
    )
    return out


# ---------------------------------------------------------------- the step-0 probe


def probe(run, line: dict, seconds: float) -> None:
    """Checks on the first step a session trains (see the module docstring)."""
    cfg, log = run.cfg, run.log
    force = cfg.run.force
    cut = line.get("length/truncated_frac", 0.0)
    if cut > TRUNCATION_STOP:
        msg = (
            f"{100 * cut:.0f}% of step {run.state.step}'s completions were cut at sampling.max_new_tokens = "
            f"{cfg.sampling.max_new_tokens}: the run cannot learn the task's answers. Raise sampling.max_new_tokens "
            f"(--set sampling.max_new_tokens=N)"
        )
        if profile(cfg.model.name).truncation_stop and not force:
            raise UserError(msg + ", or set run.force=true to train anyway")
        log("warning: " + msg)
    left = cfg.train.steps - run.state.step - 1
    hours = seconds * left / 3600
    if hours > MAX_HOURS:
        msg = (
            f"step {run.state.step} took {seconds:.0f} s, so the {left:,} steps left would take about {hours:.0f} h: "
            f"lower train.steps, control.prompts_per_step x control.rollouts_per_prompt = "
            f"{cfg.control.prompts_per_step} x {cfg.control.rollouts_per_prompt}, or sampling.max_new_tokens = "
            f"{cfg.sampling.max_new_tokens}"
        )
        if not force:
            raise UserError(msg + " (or set run.force=true to train anyway)")
        log("warning: " + msg)
    first = run.evals[0] if run.evals else None
    reward = line.get("reward/mean", 0.0)
    if (
        first is not None
        and first.get("step") == run.state.step
        and reward > 0.5
        and first.get("eval/pass@1", 1.0) < 0.05
    ):
        log(
            f"warning: training reward {reward:.2f} but held-out pass@1 {first['eval/pass@1']:.3f} at the start: the "
            f"model has memorised its train split (the warm start: model.warm_start.steps = "
            f"{cfg.model.warm_start.steps}, model.warm_start.batch_size = {cfg.model.warm_start.batch_size}; fewer "
            "steps, or more data)"
        )
