"""``sapo``: SAPO experience sharing; peers publish their rollouts as text and train on I local + J received groups.

Paper: Gensyn AI Team (Amico et al.) 2025, "Sharing is Caring: Efficient LM Post-Training with
Collective RL Experience Sharing" (Swarm sAmpling Policy Optimization), arXiv 2509.08721; code
github.com/gensyn-ai/rl-swarm (``rgym_exp``); docs/specs/systems.md §8. Works behind any controller
and objective. ``rollwise swarm`` (rollwise.distributed.swarm) starts N peers on this machine.

A swarm is N independent runs ("peers"), each with its own policy, prompt stream (``run.seed``)
and verifier, that share one directory ``swarm_dir``. Weights, log-probs and token ids are never
shared, only text. Per step of a peer:

1. ``mix(fresh, state)``: the training groups are the first ``local`` (I) of this step's kept
   fresh groups (all of them by default), followed by up to ``external`` (J) **received** groups.
   The candidates are the groups the *other* peers published in their newest ``window`` steps
   that this peer has not taken before. They are walked in a uniformly random order drawn from
   ``random.Random(f"sapo-{seed}-{step}")`` (so the choice is a function of the seed, the step
   and the published files), and each is **re-scored by this peer's own verifier**
   (``task.verify``) on the text re-tokenised by this peer's codec. With
   ``drop_zero_advantage`` (the paper's controlled runs, **[recalled]**), a group whose local
   scores are all equal is skipped (it has zero advantage under any group baseline); the first J
   accepted groups are taken, which is a uniform draw without replacement from the accepted
   candidates. A received group then is an ordinary group: its advantages are computed within
   it, by the configured estimator, from the local scores (the loop's advantage stage is a pure
   function of rewards and group ids).
2. ``add(kept)``: this step's kept fresh groups are published, every rollout as text: one JSON
   line per group in ``<swarm_dir>/<peer>/step-<step>.jsonl``, written to a temporary name and
   renamed, so readers see whole files only. A line holds the prompt (id, task, text, reference
   answer, chat messages, metadata), the completions' texts and finish reasons, and the
   publisher's name, step and policy version (``publish_record``); only strings, numbers,
   booleans, null, lists and objects of them.

**Behaviour log-probs.** A received completion has no sampler log-probs on this peer. As in the
paper, it is treated as this peer's own rollout with no importance correction for the foreign
generator: its ``Rollout.logprobs`` (mu) are the current local policy's log-probs of the
re-tokenised text (``Trainer.policy_logprobs``, one no-grad forward, at the sampling
temperature), and its ``policy_version`` is the current one, so the PPO ratio of its tokens
starts at 1 and the clip acts as for a fresh rollout. ``Rollout.entropies`` stay unset.

**Prompts.** A received prompt whose id names a prompt of the local train split with the same
text is that local prompt (peers of one task family with one task seed share splits, and differ
only in their streams). Otherwise it is rebuilt from the published fields (a peer with another
task seed); its id gets the prefix ``<peer>:`` if the local task uses that id for another text.
Received prompts whose text is in the local held-out split are skipped (they would leak into the
evaluation), and so are prompts of another task (``Prompt.task`` not among the local train
split's).

**Equivalence** (tests/unit/replay/test_sapo.py): ``external = 0`` with ``local`` unset trains on
exactly the fresh groups, as ``on_policy`` (same batches, same weights): no file is read, no
forward pass runs, no random number is drawn.

Unit of I and J (**[recalled]** in the spec, ours): a *group* (one question's rollouts). The
paper counts rollouts, but GRPO's advantage needs a group; a received group keeps every
completion its publisher generated for that question (its group size is the publisher's).
Asynchrony: peers do not wait for each other; a peer reads whatever the others have published
when it mixes, so steps need not be aligned, and a peer that is ahead finds fewer unseen
candidates and may train on fewer than J received groups (``sapo/received_groups`` says how
many). A received group is never taken twice by the same peer.

Costs: received rollouts are charged to nobody's ``cost/generated_tokens`` or ``cost/rollouts``
(the publisher paid for them) but counted, cumulatively: ``cost/received_rollouts`` and
``cost/received_tokens`` (their completion tokens after re-tokenising; they are also in
``cost/trained_tokens``). Per step: ``sapo/local_groups``, ``sapo/received_groups``,
``sapo/candidates`` (unseen published groups), ``sapo/rescored_groups`` (re-scored, i.e. taken or
dropped; each of their rollouts is one local verifier call, not in ``cost/verifier_calls``, which
counts training generation), ``sapo/dropped_zero_advantage``, ``sapo/skipped_heldout``,
``sapo/skipped_task``, ``sapo/received_reward_mean`` (local scores), ``sapo/received_age_steps``
(this step minus the publisher's), ``sapo/published_groups`` and ``time/sapo_s`` (reading,
re-scoring and the log-prob forward; not in ``time/train_s``).

Differences from the paper and its code: rl-swarm exchanges rollouts over a peer-to-peer
network (hivemind DHT) and transplants game trees from the previous round; here the transport is
a shared directory (a shared filesystem across machines), and ``window`` = 1 is "the previous
round". Received groups bypass this peer's filters (``filter.names``), except the
zero-advantage rule above, and its controller never observes them. Every kept fresh group is
published, including those ``local`` leaves out of the batch. Not combined with
``reward.ttrl`` (majority-vote rewards replace the verifier that re-scores received groups).

State (checkpointed): the keys of the received groups already taken or dropped, and the
cumulative counters. A resumed peer republishes its steps from the checkpoint on (same names).
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from rollwise.registry import UserError
from rollwise.types import Advantages, Group, Prompt, ReplaySource, Rollout

FORMAT = "rollwise.sapo/1"
PEER_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
_STEP_FILE = re.compile(r"^step-(\d+)\.jsonl$")


class SapoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    swarm_dir: str | None = Field(
        None,
        description="Directory shared by the peers of the swarm (required): each peer publishes "
        "its rollouts as text under <swarm_dir>/<peer>/ and reads the others' from there.",
    )
    peer: str | None = Field(
        None,
        pattern=PEER_NAME,
        description="This peer's name, unique in the swarm (a directory name; default 'seed-<run.seed>').",
    )
    local: int | None = Field(
        None,
        ge=0,
        description="I: local groups per training batch, the first I of the step's kept fresh "
        "groups (default: all of them).",
    )
    external: int | None = Field(
        None,
        ge=0,
        description="J: received groups per training batch, drawn from the other peers' "
        "published groups and re-scored by this peer's verifier (default: as many as the local groups, the "
        "paper's best 4 local / 4 external split; 0 = no sharing, exactly on_policy).",
    )
    drop_zero_advantage: bool = Field(
        True,
        description="Skip received groups whose local scores are all equal (zero advantage) "
        "before drawing J; the paper's controlled runs ([recalled]).",
    )
    window: int = Field(
        1,
        ge=1,
        description="Eligible published steps per peer: each other peer's newest `window` step files "
        "(1 = the previous round, as rl-swarm).",
    )


@dataclass(frozen=True)
class Published:
    """One group as another peer published it (a parsed JSON line)."""

    key: str  # "<peer>/<step>/<index>", unique in the swarm
    peer: str
    step: int
    record: dict


def to_jsonable(x: Any) -> Any:
    """Only JSON text types: str, int, float, bool, None, lists and string-keyed objects of
    them (tuples become lists; anything else, e.g. a tensor, is refused)."""
    if x is None or isinstance(x, (str, bool, int, float)):
        return x
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if isinstance(x, dict) or hasattr(x, "items"):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    raise TypeError(f"SAPO publishes text only; cannot publish a {type(x).__name__}")


def publish_record(group: Group, peer: str, step: int, index: int) -> dict:
    """The text-only record of one group (module docstring): no token ids, log-probs or tensors."""
    p = group.prompt
    return {
        "format": FORMAT,
        "peer": peer,
        "step": step,
        "index": index,
        "policy_version": min((r.policy_version for r in group.rollouts), default=0),
        "prompt": {
            "id": p.id,
            "task": p.task,
            "text": p.text,
            "answer": p.answer,
            "messages": to_jsonable(p.messages),
            "metadata": to_jsonable(dict(p.metadata)),
        },
        "completions": [{"text": r.text, "finish": r.finish} for r in group.rollouts],
    }


class Sapo(ReplaySource):
    """SAPO (arXiv 2509.08721): I local groups plus J groups received from peers as text, re-scored here."""

    Options = SapoOptions

    def __init__(self, cfg, options: SapoOptions | None, seed: int):
        self.opts = options if options is not None else self.Options()
        if self.opts.swarm_dir is None:
            raise UserError("replay.name = 'sapo' needs replay.options.swarm_dir (a directory shared by the peers)")
        self.seed = seed
        self.peer = self.opts.peer or f"seed-{seed}"
        self.dir = Path(self.opts.swarm_dir)
        self.seen: set[str] = set()  # received groups taken or dropped (never drawn again)
        self.totals = {"cost/received_rollouts": 0, "cost/received_tokens": 0}
        self.metrics: dict[str, float] = dict(self.totals)
        self.task = self.codec = self.policy_logprobs = None
        self.max_new_tokens: int | None = None
        self._step, self._version = 0, 0

    @staticmethod
    def check_config(cfg, opts: SapoOptions | None) -> None:
        opts = opts or SapoOptions()
        if opts.swarm_dir is None:
            raise UserError(
                "replay.name = 'sapo' needs replay.options.swarm_dir (a directory shared by the peers; "
                "`rollwise swarm` sets it)"
            )
        probe = Path(opts.swarm_dir).absolute()
        while not probe.exists():  # the nearest existing ancestor must be writable; nothing is created at load
            probe = probe.parent
        if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
            raise UserError(
                f"replay.options.swarm_dir = {opts.swarm_dir!r} cannot be created or written ({probe} is not a "
                "writable directory)"
            )
        if cfg.reward.ttrl.enabled:
            raise UserError(
                "replay.name = 'sapo' re-scores received rollouts with the task's verifier, which reward.ttrl.enabled "
                "replaces by majority votes; turn one of them off"
            )

    def bind(self, services) -> None:
        """The local verifier and prompts, the codec that re-tokenises received text, and the
        trainer's no-grad forward that gives received rollouts their log-probs (``rollwise.types.Services``)."""
        task = services.task
        self.task, self.codec, self.max_new_tokens = task, services.codec, services.max_new_tokens
        self.policy_logprobs = services.policy_logprobs
        train = task.train_prompts()
        self.train_by_id = {p.id: p for p in train}
        self.train_tasks = {p.task for p in train}
        self.heldout_texts = {p.text for p in task.heldout_prompts()}

    # ------------------------------------------------------------ replay protocol
    def mix(self, fresh: list[Group], state) -> list[Group]:
        self._step, self._version = getattr(state, "step", 0), getattr(state, "policy_version", 0)
        local = list(fresh) if self.opts.local is None else list(fresh)[: self.opts.local]
        want = len(local) if self.opts.external is None else self.opts.external
        self.metrics = {**self.totals, "sapo/local_groups": len(local), "sapo/received_groups": 0}
        if want == 0:
            return local
        t0 = time.perf_counter()
        received = self.receive(want)
        self.metrics["time/sapo_s"] = time.perf_counter() - t0
        return local + received

    def add(self, groups: list[Group]) -> None:
        self.publish(groups, self._step)
        self.metrics["sapo/published_groups"] = len(groups)

    def state_dict(self) -> dict:
        return {"seen": sorted(self.seen), "totals": dict(self.totals)}

    def load_state_dict(self, s: dict) -> None:
        self.seen = set(s["seen"])
        self.totals = dict(s["totals"])
        self.metrics = dict(self.totals)

    # ------------------------------------------------------------ publishing
    def publish(self, groups: list[Group], step: int) -> Path:
        """Write this step's groups to ``<swarm_dir>/<peer>/step-<step>.jsonl`` atomically."""
        out = self.dir / self.peer
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"step-{step:08d}.jsonl"
        tmp = out / f".{path.name}.tmp"
        tmp.write_text("".join(json.dumps(publish_record(g, self.peer, step, i)) + "\n" for i, g in enumerate(groups)))
        os.replace(tmp, path)
        return path

    def published(self) -> list[Published]:
        """Every other peer's groups of its newest ``window`` step files, ordered by (peer, step,
        index); partial files (temporary names) are never read."""
        out: list[Published] = []
        if not self.dir.is_dir():
            return out
        for peer_dir in sorted(p for p in self.dir.iterdir() if p.is_dir() and p.name != self.peer):
            steps = sorted((int(m.group(1)), f) for f in peer_dir.iterdir() if (m := _STEP_FILE.match(f.name)))
            for step, f in steps[-self.opts.window :]:
                for i, line in enumerate(f.read_text().splitlines()):
                    if line.strip():
                        out.append(Published(f"{peer_dir.name}/{step}/{i}", peer_dir.name, step, json.loads(line)))
        return out

    # ------------------------------------------------------------ receiving
    def receive(self, want: int) -> list[Group]:
        """Up to ``want`` received groups, re-scored here, with local log-probs (module docstring)."""
        if self.task is None:
            raise RuntimeError("Sapo.bind(services) must run before mix (the assembler, rollwise.components, does it)")
        candidates = [c for c in self.published() if c.key not in self.seen]
        rng = random.Random(f"sapo-{self.seed}-{self._step}")
        order = rng.sample(candidates, len(candidates))
        m = self.metrics
        m.update(
            {
                "sapo/candidates": len(candidates),
                "sapo/rescored_groups": 0,
                "sapo/dropped_zero_advantage": 0,
                "sapo/skipped_heldout": 0,
                "sapo/skipped_task": 0,
            }
        )
        taken: list[tuple[Published, Group]] = []
        for c in order:
            if len(taken) >= want:
                break
            prompt = self.resolve_prompt(c)
            if prompt is None:
                continue
            self.seen.add(c.key)
            group = self.rescore(prompt, c.record["completions"])
            m["sapo/rescored_groups"] += 1
            if self.opts.drop_zero_advantage and group.is_zero_variance():
                m["sapo/dropped_zero_advantage"] += 1
                continue
            taken.append((c, group))
        groups = self.with_logprobs([g for _, g in taken])
        n_rollouts = sum(g.size for g in groups)
        self.totals["cost/received_rollouts"] += n_rollouts
        self.totals["cost/received_tokens"] += sum(len(r.completion_ids) for g in groups for r in g.rollouts)
        scores = [s for g in groups for s in g.verified_rewards()]
        m.update(self.totals)
        m.update(
            {
                "sapo/received_groups": len(groups),
                "sapo/received_rollouts": n_rollouts,
                "sapo/received_reward_mean": sum(scores) / len(scores) if scores else 0.0,
                "sapo/received_age_steps": sum(self._step - c.step for c, _ in taken) / len(taken) if taken else 0.0,
            }
        )
        return groups

    def resolve_prompt(self, c: Published) -> Prompt | None:
        """The local prompt a published record names, a rebuilt one, or None (held-out text,
        another task); counts the skips."""
        p = c.record["prompt"]
        if p["text"] in self.heldout_texts:
            self.metrics["sapo/skipped_heldout"] += 1
            self.seen.add(c.key)
            return None
        if p["task"] not in self.train_tasks:
            self.metrics["sapo/skipped_task"] += 1
            self.seen.add(c.key)
            return None
        local = self.train_by_id.get(p["id"])
        if local is not None and local.text == p["text"]:
            return local
        pid = p["id"] if local is None else f"{c.peer}:{p['id']}"  # the codec caches prompt ids by id
        messages = tuple(dict(m) for m in p["messages"]) if p.get("messages") else None
        return Prompt(pid, p["task"], p["text"], p["answer"], messages, p.get("metadata") or {})

    def rescore(self, prompt: Prompt, completions: list[dict]) -> Group:
        """Re-tokenise each completion with the local codec (EOS appended to a stopped one, cut to
        ``sampling.max_new_tokens``) and score the decoded text with the local verifier. Log-probs
        are placeholders until ``with_logprobs``."""
        pids = self.codec.encode_prompt(prompt)
        eos = sorted(self.codec.eos_ids)[:1]
        rollouts = []
        for comp in completions:
            # a stopped completion ends in this codec's EOS; any other (length, error) is an unfinished text
            finish = "stop" if comp["finish"] == "stop" else "length"
            ids = list(self.codec.encode_text(comp["text"])) + (eos if finish == "stop" else [])
            if len(ids) > self.max_new_tokens:
                ids, finish = ids[: self.max_new_tokens], "length"
            text = self.codec.decode(ids)
            rollouts.append(
                Rollout(
                    prompt.id,
                    tuple(pids),
                    tuple(ids),
                    (0.0,) * len(ids),
                    finish,
                    self._version,
                    text,
                    self.task.verify(prompt, text),
                )
            )
        return Group(prompt, tuple(rollouts))

    def with_logprobs(self, groups: list[Group]) -> list[Group]:
        """Each rollout's ``logprobs`` from the current local policy (one no-grad forward over
        every received row, micro-batched by the trainer)."""
        rows = [r for g in groups for r in g.rollouts]
        if not rows:
            return groups
        from rollwise.collate import collate

        b = len(rows)
        batch = collate(
            rows,
            torch.zeros(b),
            torch.zeros(b, dtype=torch.long),
            Advantages(torch.zeros(b), torch.ones(b, dtype=torch.bool)),
            self.codec.pad_id,
        )
        lp = self.policy_logprobs(batch)
        out, i = [], 0
        for g in groups:
            new = []
            for r in g.rollouts:
                p, c = len(r.prompt_ids), len(r.completion_ids)
                new.append(
                    Rollout(
                        r.prompt_id,
                        r.prompt_ids,
                        r.completion_ids,
                        tuple(lp[i, p : p + c].tolist()),
                        r.finish,
                        r.policy_version,
                        r.text,
                        r.verdict,
                    )
                )
                i += 1
            out.append(Group(g.prompt, tuple(new)))
        return out
