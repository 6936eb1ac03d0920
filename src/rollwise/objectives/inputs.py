"""Extra per-row inputs that some advantage estimators declare (``fn.inputs``), computed from
the batch's rollouts. The batch builder (``rollwise.batches``) first computes the inputs that
need more than the rows, once, into an ``AdvantageContext`` (``advantage_context``: ACE's confidence
shift, POISE's value baseline, and what the controller gives in one ``AdvantageInputs`` record: V0.5's
value prior, MSSR's baseline, Prompt-GDRO's row weights), then calls
``advantage_inputs(fn, rows, context)`` for every estimator; the plain ones declare nothing and get ``{}``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import torch

from rollwise.types import AdvantageContext, AdvantageInputs, Rollout, Services


def sequence_logprob(rows: Sequence[Rollout]) -> torch.Tensor:
    """(B,) mean sampler log-prob of each row's completion tokens (0.0 for an empty completion)."""
    return torch.tensor([sum(r.logprobs) / len(r.logprobs) if r.logprobs else 0.0 for r in rows], dtype=torch.float32)


def tree_paths(rows: Sequence[Rollout]) -> list:
    """Each row's ``Rollout.tree`` (None for a rollout sampled alone), for the ``tree`` advantage."""
    return [getattr(r, "tree", None) for r in rows]


def completion_logprobs(rows: Sequence[Rollout]) -> list[tuple[float, ...]]:
    """Each row's sampler log-probs (one per completion token; their count is the completion length)."""
    return [r.logprobs for r in rows]


def completion_texts(rows: Sequence[Rollout]) -> list[str]:
    """Each row's decoded completion text (uniqueness clustering, ``objectives/uniqueness.py``)."""
    return [r.text for r in rows]


def confidence_shift(rows: Sequence[Rollout], services: Services) -> torch.Tensor:
    """(B,) ``c_i = sum_t (log mu(y_t) - log pi_ref(y_t))`` over each row's loss tokens: the sampler
    (rollout policy, detached) log-probs minus the frozen reference's (ACE, ``objectives/ace.py``).
    Needs the trainer built with a reference model (the assembler does so when the estimator sets
    ``needs_reference``): ``services.policy_and_reference_logprobs``."""
    if not rows:
        return torch.zeros(0)
    batch = _collated(rows, services)
    _, ref = services.policy_and_reference_logprobs(batch)
    diff = (batch.old_logprobs - ref.to(batch.old_logprobs.dtype)) * batch.loss_mask
    return diff.sum(dim=1)


def _collated(rows: Sequence[Rollout], services: Services):
    """The rows as one trainer batch (every completion token in the loss, advantages 0): what the
    trainer's no-grad and per-row passes below read."""
    from rollwise.collate import collate
    from rollwise.types import Advantages

    b = len(rows)
    every_row = Advantages(torch.zeros(b), torch.ones(b, dtype=torch.bool))
    return collate(list(rows), torch.zeros(b), torch.zeros(b, dtype=torch.long), every_row, services.codec.pad_id)


def policy_entropy(rows: Sequence[Rollout], services: Services) -> torch.Tensor:
    """(B, L) the current policy's full-vocabulary entropy at each completion position (L = the longest
    completion, 0-padded), for the rows with hint tokens (``hint_tokens`` > 0) only; the other rows
    stay 0. ADHint's CGM (``objectives/adhint.py``) compares a hint token's entropy with the mean of
    its continuation's: hint tokens were never sampled, so the sampler has no entropy for them and
    both come from one no-grad forward of the trainer (``Trainer.token_entropy``)."""
    hints = hint_tokens(rows)
    width = max((len(r.completion_ids) for r in rows), default=0)
    out = torch.zeros((len(rows), width))
    hinted = [i for i in range(len(rows)) if int(hints[i]) > 0 and rows[i].completion_ids]
    if not hinted:
        return out
    sub = [rows[i] for i in hinted]
    batch = _collated(sub, services)
    ent = services.trainer.token_entropy(batch).float().cpu()
    for k, i in enumerate(hinted):
        p, c = len(sub[k].prompt_ids), len(sub[k].completion_ids)
        out[i, :c] = ent[k, p : p + c]
    return out


def row_scores(rows: Sequence[Rollout], services: Services) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) sequence log-weights ``sum_t (log pi_prox - log mu)`` and (B,) norms of each row's score
    gradient ``|| grad mean_t log pi(y_t) ||`` at the current (pre-update) weights, one forward and
    backward per row (``Trainer.row_scores``): VCPO's OPOB (``objectives/ess.py``)."""
    if not rows:
        return torch.zeros(0), torch.zeros(0)
    return services.trainer.row_scores(_collated(rows, services))


def episodes(rows: Sequence[Rollout]) -> list:
    """Each row's ``Rollout.episode`` (None for a single-turn rollout), for the multi-turn credit
    assignment (``objectives/turn_return.py``, ``objectives/gigpo.py``)."""
    return [getattr(r, "episode", None) for r in rows]


def completion_ids(rows: Sequence[Rollout]) -> list[tuple[int, ...]]:
    """Each row's completion token ids (HGPO's histories and SALT's step graph compare turns by them,
    ``objectives/hgpo.py``, ``objectives/salt.py``)."""
    return [r.completion_ids for r in rows]


def completion_lengths(rows: Sequence[Rollout]) -> torch.Tensor:
    """(B,) float: each row's completion length in tokens."""
    return torch.tensor([float(len(r.completion_ids)) for r in rows], dtype=torch.float32)


def hint_tokens(rows: Sequence[Rollout]) -> torch.Tensor:
    """(B,) long: each row's hint length (``Verdict.details["hint_tokens"]``, set by the ``adhint``
    controller on hinted rollouts; 0 for the others)."""
    return torch.tensor(
        [int((r.verdict.details or {}).get("hint_tokens", 0)) if r.verdict is not None else 0 for r in rows],
        dtype=torch.long,
    )


def sft_rows(rows: Sequence[Rollout]) -> torch.Tensor:
    """(B,) bool: the rows marked ``Verdict.details["sft"]`` (Cog-Rethinker's re-templated outputs,
    ``control/cog_rethinker.py``); False for the others."""
    return torch.tensor(
        [bool((r.verdict.details or {}).get("sft", False)) if r.verdict is not None else False for r in rows],
        dtype=torch.bool,
    )


def named_rewards(rows: Sequence[Rollout]) -> dict[str, torch.Tensor]:
    """name -> (B,) float from each row's ``Verdict.rewards`` (GDPO, ``objectives/gdpo.py``); every
    row must carry the same names. ``{}`` for an empty batch."""
    out: dict[str, list[float]] = {}
    for i, r in enumerate(rows):
        named = r.verdict.rewards if r.verdict is not None else None
        if not named:
            raise ValueError(
                f"rollout of prompt {r.prompt_id!r} has no named rewards (Verdict.rewards); "
                "this advantage needs a task that returns them"
            )
        if i and set(named) != set(out):
            raise ValueError(f"rollout of prompt {r.prompt_id!r} has rewards {sorted(named)}, others {sorted(out)}")
        for k, v in named.items():
            out.setdefault(k, []).append(float(v))
    return {k: torch.tensor(v, dtype=torch.float32) for k, v in out.items()}


def completion_entropies(rows: Sequence[Rollout]) -> list[tuple[float, ...] | None]:
    """Each row's sampler entropies (``Rollout.entropies``, one per completion token; None where the
    backend did not record them). ETTRL / MSSR / ECHO read them with ``entropy = "sampler"``."""
    return [r.entropies for r in rows]


def prompt_baseline(given: AdvantageInputs, controller) -> torch.Tensor:
    """(B,) the controller's per-prompt value baseline of each row (MSSR's Beta tracker,
    ``control/mssr.py``), read from the record it gave (``Controller.advantage_inputs``); refused
    for a controller that gives none."""
    if given.baselines is None:
        raise ValueError(
            f"this advantage needs a controller with a per-prompt baseline (control.name = 'mssr'), "
            f"got {type(controller).__name__}"
        )
    return given.baselines


_INPUTS = {
    "seq_logprob": sequence_logprob,
    "tree_paths": tree_paths,
    "completion_logprobs": completion_logprobs,
    "completion_texts": completion_texts,
    "completion_lengths": completion_lengths,
    "completion_ids": completion_ids,
    "hint_tokens": hint_tokens,
    "sft_rows": sft_rows,
    "named_rewards": named_rewards,
    "completion_entropies": completion_entropies,
    "episodes": episodes,
}


def value_prior(given: AdvantageInputs, controller) -> torch.Tensor:
    """(B,) this step's value prior of each row's prompt (V0.5, ``control/v05.py``), read from the
    record the controller gave (``Controller.advantage_inputs``); refused for a controller that gives
    none."""
    if given.priors is None:
        raise ValueError(
            f"advantage 'v05' needs control.name = 'v05' (the value prior), got {type(controller).__name__}"
        )
    return given.priors


def row_keys(rows: Sequence[Rollout], groups: torch.Tensor) -> list[str]:
    """A stable key per row (the same in a later step and after a resume): a digest of its prompt,
    policy version, position among the rows of its group (``groups``: (B,) group index) and tokens.
    The position keeps two equal completions of one group apart."""
    seen: dict[int, int] = {}
    out = []
    for r, g in zip(rows, groups.tolist()):
        pos = seen[g] = seen.get(g, -1) + 1
        text = repr((r.prompt_id, r.policy_version, pos, tuple(r.prompt_ids), tuple(r.completion_ids)))
        out.append(hashlib.blake2b(text.encode(), digest_size=12).hexdigest())
    return out


def value_baseline(rows: Sequence[Rollout], services, groups: torch.Tensor) -> torch.Tensor:
    """(B,) POISE's baseline (``objectives/poise.py``). A row seen for the first time gets the value the
    trajectory probe, as it stood before this batch, gives *another* row of its group (``groups``: the
    batch's group index, ``poise.cross_rollout``), its prompt's state-zero prediction when it is alone;
    the probe then learns the new rows. With a replay source that trains rows again (``replays_rows``,
    rollout replay) that baseline is frozen with the value model (``ValueModel.freeze``) and a replayed
    row gets the same one, since every later prediction comes from probes that have learned the row's
    own outcome (issue #40). Needs ``value.enabled`` (``services.value``)."""
    from rollwise.objectives.poise import cross_rollout

    if services is None or services.value is None:
        raise ValueError("advantage 'poise' needs the pass-rate predictor: set value.enabled = true")
    if groups.shape != (len(rows),):
        raise ValueError(f"value_baseline needs one group index per row: {len(rows)} rows, {tuple(groups.shape)}")
    value = services.value
    keys = row_keys(rows, groups)
    out = torch.tensor([value.frozen.get(key, math.nan) for key in keys], dtype=torch.float64)
    new = torch.isnan(out).nonzero().flatten().tolist()
    if new:
        fresh = [rows[k] for k in new]
        version = fresh[0].policy_version
        prompts = {r.prompt_id: value.prompt_of(r.prompt_id) for r in fresh}
        zero = value.predict(list(prompts.values()), version)
        trajectory = value.trajectory_values(fresh, version)  # predicted before the probe learns them
        alone = torch.tensor([zero[r.prompt_id] for r in fresh], dtype=trajectory.dtype)
        out[new] = cross_rollout(trajectory, groups[new], alone).to(out.dtype)
        value.freeze([keys[k] for k in new], out[new].tolist())
    return out


_CONTEXT_INPUTS = (  # AdvantageContext fields
    "confidence_shift",
    "value_prior",
    "prompt_baseline",
    "value_baseline",
    "policy_entropy",
    "seq_log_weights",
    "score_norms",
)


def declared_inputs(fn, options=None) -> tuple[str, ...]:
    """The inputs ``fn`` declares for ``options``: ``fn.inputs_for(options)`` where an estimator's
    inputs depend on its options (an input that costs a forward pass, needed only when an option is
    on: ADHint's CGM), else ``fn.inputs``."""
    inputs_for = getattr(fn, "inputs_for", None)
    return tuple(inputs_for(options) if callable(inputs_for) else getattr(fn, "inputs", ()))


def advantage_context(
    fn,
    rows: Sequence[Rollout],
    services: Services | None = None,
    controller=None,
    groups: torch.Tensor | None = None,
    options=None,
) -> AdvantageContext:
    """The inputs of ``fn`` that need more than the rows (``_CONTEXT_INPUTS``: the trainer's
    reference log-probs through ``services``, the ``controller``'s prior or baseline, POISE's value
    baseline over the batch's group index ``groups``) and the controller's row weights (Prompt-GDRO),
    computed before the estimator. The controller gives its part as one record
    (``Controller.advantage_inputs(rows, fn.inputs)``). ``options``: the estimator's
    (``declared_inputs``)."""
    needs = declared_inputs(fn, options)
    given = controller.advantage_inputs(rows, needs) if controller is not None else AdvantageInputs()
    fields = {}
    for name in needs:
        if name == "confidence_shift" and services is not None:
            fields[name] = confidence_shift(rows, services)
        elif name == "value_prior" and controller is not None:
            fields[name] = value_prior(given, controller)
        elif name == "prompt_baseline" and controller is not None:
            fields[name] = prompt_baseline(given, controller)
        elif name == "value_baseline":
            if groups is None:
                raise ValueError("advantage input 'value_baseline' needs the batch's group index (groups=)")
            fields[name] = value_baseline(rows, services, groups)
        elif name == "policy_entropy" and services is not None:
            fields[name] = policy_entropy(rows, services)
        elif name in ("seq_log_weights", "score_norms") and services is not None and name not in fields:
            fields["seq_log_weights"], fields["score_norms"] = row_scores(rows, services)
    return AdvantageContext(**fields, weights=given.weights)


def advantage_inputs(
    fn, rows: Sequence[Rollout], context: AdvantageContext | None = None, options=None
) -> dict[str, torch.Tensor]:
    """Keyword inputs an estimator declares (``declared_inputs(fn, options)``) beyond (rewards, group
    ids), computed from the batch's rows (the ``rows`` of ``collate.flatten``) and, for the inputs in
    ``_CONTEXT_INPUTS``, read from ``context`` (``advantage_context``); ``{}`` for the others."""
    out = {}
    for name in declared_inputs(fn, options):
        if name in _CONTEXT_INPUTS:
            value = getattr(context, name) if context is not None else None
            if value is None:
                raise ValueError(
                    f"advantage input {name!r} needs the run (its trainer or controller): "
                    "advantage_inputs(fn, rows, advantage_context(fn, rows, services, controller))"
                )
            out[name] = value
        else:
            out[name] = _INPUTS[name](rows)
    return out
