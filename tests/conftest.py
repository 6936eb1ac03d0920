import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Warm-start caches go to a per-session temp dir, never the user's cache."""
    os.environ["ROLLWISE_CACHE"] = str(tmp_path_factory.mktemp("rollwise-cache"))
    import torch

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    yield


def tiny_overrides(tmp_path, name="t", steps=3, **extra):
    """Overrides for a fast CPU run of the embedded default."""
    o = {
        "run.dir": str(tmp_path), "run.name": name, "run.progress": False, "run.checkpoint_every": 0,
        "model.name": "tiny-s", "model.warm_start.steps": 20, "model.warm_start.batch_size": 16,
        "task.options": {"n_train": 200, "n_heldout": 20}, "train.steps": steps,
        "control.prompts_per_step": 4, "control.rollouts_per_prompt": 4,
        "eval.n_prompts": 8, "eval.samples": 2, "eval.k": [2], "eval.every": 0,
    }
    o.update(extra)
    return o


def as_sets(overrides: dict) -> list[str]:
    import json

    return [f"{k}={json.dumps(v) if not isinstance(v, dict) else toml_inline(v)}" for k, v in overrides.items()]


def toml_inline(d: dict) -> str:
    import json

    return "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in d.items()) + "}"


def scripted_arithmetic(schedule):
    """A scripted backend for the arithmetic task: call ``i`` answers right iff ``schedule(i)``
    (else the sum + 1), so a test fixes every group's rewards by hand."""
    from rollwise.backends.scripted import ScriptedBackend
    from rollwise.train.tiny import char_tokenizer

    tok = char_tokenizer()

    def respond(seq, i):
        text = tok.decode(seq, skip_special_tokens=True)
        a, b = text.rstrip("=").replace("-", "+-").split("+")[:2]
        ans = int(a) + int(b)
        return tok.encode(str(ans if schedule(i) else ans + 1))

    return ScriptedBackend(respond, tok.eos_token_id)


@pytest.fixture
def trainer_batches(monkeypatch):
    """Group sizes of every batch the trainer receives."""
    import torch

    from rollwise.train.trainer import Trainer

    seen, real = [], Trainer.optimize

    def spy(self, batch):
        seen.append(torch.bincount(batch.group_index).tolist())
        return real(self, batch)

    monkeypatch.setattr(Trainer, "optimize", spy)
    return seen
