"""SAPO experience sharing (replay/sapo.py, systems.md §8): the four testable properties (J = 0 is
single-node GRPO; received rollouts are re-scored locally with advantages within their own group;
I + J groups per step, deterministic under a seed; a text-only format), plus the zero-advantage
filter, held-out and foreign-task skips, the received rows' log-probs (PPO ratio 1 at the first
forward), checkpoint state and the config refusals."""

import json

import pytest
import torch

import rollwise
from conftest import as_sets, tiny_overrides
from rollwise.collate import flatten
from rollwise.config import load_config
from rollwise.objectives import advantages
from rollwise.registry import UserError
from rollwise.replay.sapo import Sapo, SapoOptions, publish_record, to_jsonable
from rollwise.tasks.arithmetic import make
from rollwise.tokens import Codec
from rollwise.trainer.tiny import char_tokenizer
from rollwise.types import Group, Prompt, Rollout, RunState, Services, Verdict


class FakeTrainer:
    """``policy_logprobs``: -0.01 * (position + 1) at every completion position (so a test can see
    which positions each received rollout got)."""

    def __init__(self):
        self.calls = 0

    def policy_logprobs(self, batch):
        self.calls += 1
        pos = torch.arange(batch.input_ids.shape[1], dtype=torch.float32).expand_as(batch.old_logprobs)
        return torch.where(batch.loss_mask != 0, -0.01 * (pos + 1), torch.zeros_like(pos))


@pytest.fixture(scope="module")
def task():
    return make(None, make.Options(n_train=60, n_heldout=10))


@pytest.fixture(scope="module")
def codec():
    return Codec(char_tokenizer(), use_chat=False)


def _peer(tmp_path, task, codec, name="b", seed=0, trainer=None, **opts):
    s = Sapo(None, SapoOptions(swarm_dir=str(tmp_path / "swarm"), peer=name, **opts), seed)
    s.bind(Services(task, codec, 16, (trainer or FakeTrainer()).policy_logprobs))
    return s


def _group(prompt, texts, scores=None, version=0):
    """A published-side group: ``texts`` with the publisher's (possibly wrong) verdicts."""
    scores = scores or [1.0] * len(texts)
    return Group(
        prompt,
        tuple(
            Rollout(prompt.id, (1, 2), (7, 8, 9), (-0.3, -0.2, -0.1), "stop", version, t, Verdict(s))
            for t, s in zip(texts, scores)
        ),
    )


def _mixed(answer):
    """Completion texts that score [1, 0, 1, 0] against ``answer``."""
    return [answer, str(int(answer) + 1), answer, str(int(answer) + 2)]


def _publish(tmp_path, task, codec, name, prompts, step=0, texts=_mixed):
    pub = _peer(tmp_path, task, codec, name=name)
    pub.publish([_group(p, texts(p.answer)) for p in prompts], step)
    return pub


def _keys(groups):
    return [g.prompt.id for g in groups]


# ------------------------------------------------------------------ property 4: text only


def test_the_published_record_is_text_only(tmp_path, task, codec):
    p = task.train_prompts()[0]
    g = _group(p, ["3", "4"])
    rec = publish_record(g, "a", 5, 0)

    def leaves(x):
        if isinstance(x, dict):
            assert all(isinstance(k, str) for k in x)
            return [v for val in x.values() for v in leaves(val)]
        if isinstance(x, list):
            return [v for val in x for v in leaves(val)]
        return [x]

    assert all(x is None or type(x) in (str, int, float, bool) for x in leaves(rec))
    assert rec["completions"] == [
        {"text": "3", "finish": "stop"},
        {"text": "4", "finish": "stop"},
    ]  # no ids, no log-probs
    assert json.loads(json.dumps(rec)) == rec
    path = _peer(tmp_path, task, codec, name="a").publish([g], 5)
    assert path.name == "step-00000005.jsonl" and [json.loads(x) for x in path.read_text().splitlines()] == [rec]
    assert [f.name for f in path.parent.iterdir()] == [path.name]  # the temporary file was renamed
    with pytest.raises(TypeError, match="text only"):
        to_jsonable({"ids": torch.tensor([1, 2])})


# ------------------------------------------------------------------ property 2: re-scored here, advantages in-group


def test_received_rollouts_are_rescored_by_the_local_verifier(tmp_path, task, codec):
    p = task.train_prompts()[3]
    _publish(tmp_path, task, codec, "a", [p])  # the publisher marked all four correct
    b = _peer(tmp_path, task, codec, external=1)
    fresh = [_group(q, _mixed(q.answer), [1.0, 0.0, 1.0, 0.0]) for q in task.train_prompts()[10:12]]
    batch = b.mix(fresh, RunState(step=0, policy_version=4))
    assert batch[:2] == fresh and len(batch) == 3
    got = batch[2]
    assert got.prompt is task.train_prompts()[3]  # the local prompt, found by id and text
    assert got.rewards() == [1.0, 0.0, 1.0, 0.0]  # the local verifier's scores, not the publisher's [1, 1, 1, 1]
    r = got.rollouts[0]
    eos = codec.tokenizer.eos_token_id
    assert r.completion_ids == tuple(codec.encode_text(p.answer)) + (eos,) and r.prompt_ids == codec.encode_prompt(p)
    assert r.policy_version == 4 and r.finish == "stop"
    # log-probs from the local policy: FakeTrainer gives -0.01 * (position + 1) on completion tokens
    start = len(r.prompt_ids)
    assert r.logprobs == pytest.approx([-0.01 * (start + i + 1) for i in range(len(r.completion_ids))])
    assert b.metrics["cost/received_rollouts"] == 4 and b.metrics["sapo/received_groups"] == 1


def test_advantages_of_a_received_group_are_computed_within_it(tmp_path, task, codec):
    p = task.train_prompts()[3]
    _publish(tmp_path, task, codec, "a", [p])
    b = _peer(tmp_path, task, codec, external=1)
    fresh = [_group(q, ["x", "y"], [1.0, 1.0]) for q in task.train_prompts()[10:11]]  # a local group of two 1s
    rows, rewards, gidx = flatten(b.mix(fresh, RunState()))
    assert gidx.tolist() == [0, 0, 1, 1, 1, 1]
    adv = advantages.grpo(rewards, gidx, advantages.grpo.Options()).values
    # received group r = [1, 0, 1, 0]: mean 0.5, unbiased std sqrt(1/3) -> A = +-0.5 / 0.57735 = +-0.866;
    # the local group [1, 1] is constant -> 0 (the received rewards do not enter its baseline)
    assert adv.tolist() == pytest.approx([0.0, 0.0, 0.866, -0.866, 0.866, -0.866], abs=1e-3)


# ------------------------------------------------------------------ property 3: I + J, deterministic


def test_the_batch_has_i_local_and_j_received_groups_drawn_by_the_seed(tmp_path, task, codec):
    train = task.train_prompts()
    _publish(tmp_path, task, codec, "a", train[0:6])
    _publish(tmp_path, task, codec, "c", train[6:12])
    fresh = [_group(q, _mixed(q.answer)) for q in train[20:24]]

    def draw(seed, name="b"):
        b = _peer(tmp_path, task, codec, name=name, seed=seed, local=2, external=3)
        batch = b.mix(fresh, RunState(step=7))
        assert batch[:2] == fresh[:2] and len(batch) == 2 + 3
        return _keys(batch[2:])

    first = draw(0)
    assert draw(0) == first  # same seed, step and files: the same groups
    assert len(set(first)) == 3 and set(first) <= {p.id for p in train[0:12]}
    assert any(draw(s) != first for s in (1, 2, 3))  # another seed draws others (3 of 12: P(same) = 1/1320 each)
    # the own directory is never read: a peer named "a" receives only c's groups
    assert set(draw(0, name="a")) <= {p.id for p in train[6:12]}


def test_a_received_group_is_taken_once_and_fewer_than_j_when_the_swarm_has_fewer(tmp_path, task, codec):
    train = task.train_prompts()
    _publish(tmp_path, task, codec, "a", train[0:5])
    b = _peer(tmp_path, task, codec, external=3)
    seen = []
    for step in range(3):
        got = b.mix([], RunState(step=step))
        seen.append(_keys(got))
    assert [len(s) for s in seen] == [3, 2, 0]  # 5 published: 3, then the 2 left, then none
    assert sorted(seen[0] + seen[1]) == sorted(p.id for p in train[0:5])
    assert b.metrics["sapo/received_groups"] == 0 and b.metrics["cost/received_rollouts"] == 5 * 4


def test_window_limits_the_steps_read_per_peer(tmp_path, task, codec):
    train = task.train_prompts()
    pub = _peer(tmp_path, task, codec, name="a")
    pub.publish([_group(p, _mixed(p.answer)) for p in train[0:3]], 0)
    pub.publish([_group(p, _mixed(p.answer)) for p in train[3:6]], 1)
    newest = _peer(tmp_path, task, codec, external=10)
    assert set(_keys(newest.mix([], RunState(step=2)))) == {p.id for p in train[3:6]}
    both = _peer(tmp_path, task, codec, name="d", external=10, window=2)
    assert set(_keys(both.mix([], RunState(step=2)))) == {p.id for p in train[0:6]}
    assert newest.metrics["sapo/received_age_steps"] == 1.0  # step 2 - published at step 1


def test_local_unset_and_external_unset_take_as_many_received_as_local(tmp_path, task, codec):
    train = task.train_prompts()
    _publish(tmp_path, task, codec, "a", train[0:6])
    b = _peer(tmp_path, task, codec)
    fresh = [_group(q, _mixed(q.answer)) for q in train[20:24]]
    batch = b.mix(fresh, RunState())
    assert batch[:4] == fresh and len(batch) == 8  # the paper's 4 local / 4 external


# ------------------------------------------------------------------ filters and skips


def test_zero_advantage_groups_are_skipped_unless_asked_not_to(tmp_path, task, codec):
    train = task.train_prompts()
    pub = _peer(tmp_path, task, codec, name="a")
    all_right = [_group(p, [p.answer] * 4) for p in train[0:4]]  # zero advantage under the local verifier
    mixed = [_group(p, _mixed(p.answer)) for p in train[4:6]]
    pub.publish(all_right + mixed, 0)
    b = _peer(tmp_path, task, codec, external=4)
    got = b.mix([], RunState())
    assert set(_keys(got)) == {p.id for p in train[4:6]}  # only the two with a signal, though J = 4
    assert b.metrics["sapo/dropped_zero_advantage"] == 4 and b.metrics["sapo/rescored_groups"] == 6
    keep = _peer(tmp_path, task, codec, name="d", external=4, drop_zero_advantage=False)
    assert len(keep.mix([], RunState())) == 4


def test_held_out_and_foreign_task_prompts_are_never_trained_on(tmp_path, task, codec):
    held = task.heldout_prompts()[0]
    foreign = Prompt("other/1", "other_task", "1+1=", "2")
    _peer(tmp_path, task, codec, name="a").publish([_group(held, _mixed(held.answer)), _group(foreign, ["2", "3"])], 0)
    b = _peer(tmp_path, task, codec, external=5)
    assert b.mix([], RunState()) == []
    assert b.metrics["sapo/skipped_heldout"] == 1 and b.metrics["sapo/skipped_task"] == 1


def test_a_prompt_from_another_task_seed_is_rebuilt_and_its_colliding_id_renamed(tmp_path, task, codec):
    local = task.train_prompts()[0]
    clash = Prompt(local.id, local.task, "2+2=", "4")  # same id, another text
    new = Prompt("arithmetic/3+3=", local.task, "3+3=", "6", metadata={"level": 1})
    _peer(tmp_path, task, codec, name="a").publish([_group(clash, ["4", "5"]), _group(new, ["6", "7"])], 0)
    got = {g.prompt.text: g for g in _peer(tmp_path, task, codec, external=2).mix([], RunState())}
    assert got["2+2="].prompt.id == f"a:{local.id}" and got["2+2="].rewards() == [1.0, 0.0]
    assert got["3+3="].prompt.id == new.id and got["3+3="].prompt.metadata == {"level": 1}
    assert got["3+3="].rewards() == [1.0, 0.0]


def test_unfinished_completions_get_no_eos_and_long_ones_are_cut(tmp_path, task, codec):
    p = task.train_prompts()[0]
    g = Group(
        p,
        (
            Rollout(p.id, (1,), (5,), (-1.0,), "length", 0, "12345678901234567890", Verdict(0.0)),
            Rollout(p.id, (1,), (5,), (-1.0,), "length", 0, "12", Verdict(0.0)),
        ),
    )
    _peer(tmp_path, task, codec, name="a").publish([g], 0)
    (got,) = _peer(tmp_path, task, codec, external=1, drop_zero_advantage=False).mix([], RunState())
    long, short = got.rollouts
    assert len(long.completion_ids) == 16 and long.finish == "length"  # cut to sampling.max_new_tokens (16 here)
    assert short.completion_ids == tuple(codec.encode_text("12")) and short.finish == "length"


# ------------------------------------------------------------------ log-probs of the local policy


def test_received_rows_carry_the_local_policys_logprobs_so_the_ratio_starts_at_1(tmp_path, task, codec):
    from types import SimpleNamespace

    from rollwise.collate import collate
    from rollwise.objectives import grpo
    from rollwise.trainer.tiny import build_tiny
    from rollwise.trainer.trainer import Trainer

    torch.manual_seed(0)
    model, _ = build_tiny("tiny-s", seed=0)
    cfg = SimpleNamespace(
        lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, warmup_steps=0, micro_batch=3, max_grad_norm=1.0
    )
    trainer = Trainer(model, grpo.loss, grpo.Options(), cfg, temperature=1.0)
    train = task.train_prompts()
    _publish(tmp_path, task, codec, "a", train[0:2])
    b = _peer(tmp_path, task, codec, external=2, trainer=trainer)
    rows, rewards, gidx = flatten(b.mix([], RunState()))
    adv = advantages.grpo(rewards, gidx, advantages.grpo.Options())
    batch = collate(rows, rewards, gidx, adv, codec.pad_id)
    new = trainer.policy_logprobs(batch)  # what the first training forward computes (other micro-batching)
    on = batch.loss_mask != 0
    assert on.sum() == sum(len(r.completion_ids) for r in rows) and (batch.old_logprobs[on] < 0).all()
    assert torch.allclose(new[on], batch.old_logprobs[on], atol=1e-5)  # ratio exp(new - mu) = 1


# ------------------------------------------------------------------ state, config


def test_state_keeps_taken_groups_and_counters(tmp_path, task, codec):
    _publish(tmp_path, task, codec, "a", task.train_prompts()[0:4])
    b = _peer(tmp_path, task, codec, external=2)
    first = _keys(b.mix([], RunState(step=0)))
    resumed = _peer(tmp_path, task, codec, external=2)
    resumed.load_state_dict(json.loads(json.dumps(b.state_dict())))  # JSON-safe, too
    assert resumed.metrics["cost/received_rollouts"] == 8
    second = _keys(resumed.mix([], RunState(step=1)))
    assert len(second) == 2 and not set(first) & set(second)
    assert resumed.metrics["cost/received_rollouts"] == 16


def test_config_refusals_name_the_key(tmp_path):
    with pytest.raises(UserError, match=r"replay\.options\.swarm_dir"):
        load_config(overrides=["replay.name=sapo"])
    with pytest.raises(UserError, match=r"replay\.options\.peer"):
        load_config(overrides=["replay.name=sapo", f'replay.options={{swarm_dir = "{tmp_path}", peer = "a/b"}}'])
    with pytest.raises(UserError, match=r"reward\.ttrl"):
        load_config(
            overrides=["replay.name=sapo", f'replay.options.swarm_dir="{tmp_path}"', "reward.ttrl.enabled=true"]
        )
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UserError, match=r"replay\.options\.swarm_dir = .* cannot be created"):
        load_config(overrides=["replay.name=sapo", f'replay.options.swarm_dir="{blocker / "x"}"'])
    cfg = load_config(overrides=["replay.name=sapo", f'replay.options.swarm_dir="{tmp_path / "new" / "dir"}"'])
    assert cfg.replay.name == "sapo" and not (tmp_path / "new").exists()  # loading creates nothing


# ------------------------------------------------------------------ property 1: J = 0 is single-node GRPO


def _stable(path):
    return [
        {
            k: v
            for k, v in json.loads(x).items()
            if k != "wall_s" and not k.startswith(("time/", "sapo/", "cost/received"))
        }
        for x in path.read_text().splitlines()
    ]


def _weights(run_dir):
    from safetensors.torch import load_file

    (f,) = (run_dir / "final").glob("*.safetensors")
    return load_file(str(f))


def test_external_zero_is_exactly_on_policy_in_the_loop(tmp_path, trained):
    common = {"eval.at_start": False, "run.threads": 1}
    # the on-policy run only read: shared (tests/conftest.py ``trained``, also test_rollout_replay's reference)
    out = {"on_policy": trained(tiny_overrides(tmp_path, steps=3, **common))}
    sapo = {"replay.name": "sapo", "replay.options": {"swarm_dir": str(tmp_path / "swarm"), "external": 0}}
    o = tiny_overrides(tmp_path, name="sapo_j0", steps=3, **common, **sapo)
    out["sapo_j0"] = rollwise.train(load_config(overrides=as_sets(o)), log=lambda m: None).run_dir
    assert _stable(out["sapo_j0"] / "metrics.jsonl") == _stable(out["on_policy"] / "metrics.jsonl")
    a, b = _weights(out["on_policy"]), _weights(out["sapo_j0"])
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    lines = [json.loads(x) for x in (out["sapo_j0"] / "metrics.jsonl").read_text().splitlines()]
    assert [x["cost/received_rollouts"] for x in lines] == [0, 0, 0] and lines[0]["sapo/published_groups"] > 0
    assert sorted(f.name for f in (tmp_path / "swarm" / "seed-0").iterdir()) == [
        f"step-{s:08d}.jsonl" for s in range(3)
    ]


def test_a_peer_trains_on_what_an_earlier_peer_published(tmp_path):
    """Peer a runs 2 steps alone and publishes; peer b (window 2: both of a's steps) then receives
    a's groups from its first step: they are trained on (more trained tokens than b alone) and
    charged to no generation."""
    swarm = {
        "replay.name": "sapo",
        "replay.options": {"swarm_dir": str(tmp_path / "swarm"), "drop_zero_advantage": False},
    }
    common = {"eval.at_start": False, "run.threads": 1}

    def run(name, seed, extra):
        o = tiny_overrides(tmp_path, name=name, steps=2, **common, **{"run.seed": seed}, **extra)
        return [
            json.loads(x)
            for x in (rollwise.train(load_config(overrides=as_sets(o)), log=lambda m: None).run_dir / "metrics.jsonl")
            .read_text()
            .splitlines()
        ]

    run("a", 0, {**swarm, "replay.options": {**swarm["replay.options"], "peer": "a", "external": 0}})
    alone = run("b_alone", 1, {})
    b = run("b", 1, {**swarm, "replay.options": {**swarm["replay.options"], "peer": "b", "window": 2}})
    assert b[0]["sapo/received_groups"] == 4 and b[0]["cost/received_rollouts"] == 4 * 4  # J = I = 4 groups of 4
    assert b[0]["cost/generated_tokens"] == alone[0]["cost/generated_tokens"]  # step 0: same weights, same generation
    assert b[0]["cost/rollouts"] == alone[0]["cost/rollouts"]
    assert b[0]["cost/trained_tokens"] == alone[0]["cost/trained_tokens"] + b[0]["cost/received_tokens"]
    assert b[1]["cost/received_rollouts"] == 2 * 4 * 4  # a's 8 published groups, 4 per step, none taken twice
