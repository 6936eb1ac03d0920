import json
import os
import re
from pathlib import Path

import pytest

from leftovers import pytest_configure, pytest_sessionfinish  # noqa: F401  (the session leaves nothing behind)

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def threads_per_worker() -> int:
    """torch threads of a test process: at most 2, and the cores shared out between pytest-xdist's
    workers (``-n``), so that two workers on two cores do not each run two threads."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, min(2, (os.cpu_count() or 1) // workers))


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Warm-start caches go to a per-session temp dir (one per xdist worker), never the user's cache."""
    os.environ["ROLLWISE_CACHE"] = str(tmp_path_factory.mktemp("rollwise-cache"))
    import torch

    torch.set_num_threads(threads_per_worker())
    yield


def tiny_overrides(tmp_path, name="t", steps=3, **extra):
    """Overrides for a fast CPU run of the embedded default."""
    o = {
        "run.dir": str(tmp_path),
        "run.name": name,
        "run.progress": False,
        "run.checkpoint_every": 0,
        "model.name": "tiny-s",
        "model.warm_start.steps": 20,
        "model.warm_start.batch_size": 16,
        "task.options": {"n_train": 200, "n_heldout": 20},
        "train.steps": steps,
        "control.prompts_per_step": 4,
        "control.rollouts_per_prompt": 4,
        "eval.n_prompts": 8,
        "eval.samples": 2,
        "eval.k": [2],
        "eval.every": 0,
    }
    o.update(extra)
    return o


def as_sets(overrides: dict) -> list[str]:
    import json

    return [f"{k}={json.dumps(v) if not isinstance(v, dict) else toml_inline(v)}" for k, v in overrides.items()]


def toml_inline(d: dict) -> str:
    import json

    return "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in d.items()) + "}"


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """``trained(overrides)``: the run directory of ``rollwise.train`` on ``overrides`` (``tiny_overrides``'
    form), trained once per distinct configuration in a test session (in each xdist worker: the
    Makefile keeps a test file on one worker) and shared by the tests that only read it. A test that
    writes into the run directory (a checkpoint of its own, a resume) asks for ``copy_to=`` a
    directory of its own, or keeps its own training. ``run.dir`` and ``run.name`` are not part of
    the key: where a run is written changes nothing it computes."""
    import shutil

    import rollwise
    from rollwise.config import load_config

    runs: dict[str, Path] = {}

    def train(overrides: dict, copy_to: Path | None = None) -> Path:
        key = json.dumps({k: v for k, v in overrides.items() if k not in ("run.dir", "run.name")}, sort_keys=True)
        if key not in runs:
            o = dict(overrides, **{"run.dir": str(tmp_path_factory.mktemp("trained")), "run.name": "run"})
            runs[key] = rollwise.train(load_config(overrides=as_sets(o)), log=lambda m: None).run_dir
        if copy_to is None:
            return runs[key]
        shutil.copytree(runs[key], copy_to)
        return Path(copy_to)

    return train


def scripted_arithmetic(schedule):
    """A scripted backend for the arithmetic task: call ``i`` answers right iff ``schedule(i)``
    (else the sum + 1), so a test fixes every group's rewards by hand."""
    from rollwise.backends.scripted import ScriptedBackend
    from rollwise.trainer.tiny import char_tokenizer

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

    from rollwise.trainer.trainer import Trainer

    seen, real = [], Trainer.optimize

    def spy(self, batch):
        seen.append(torch.bincount(batch.group_index).tolist())
        return real(self, batch)

    monkeypatch.setattr(Trainer, "optimize", spy)
    return seen


class Disk:
    """Real storage faults for tests (root, as CI runs): size-capped tmpfs mounts, filled to a
    given free space, resized, and read-only bind mounts; everything mounted is unmounted at
    teardown. A test is skipped, with the reason, where mounting is impossible."""

    def __init__(self, root):
        self.root, self.mounted = root, []

    def _mount(self, *args):
        import subprocess

        r = subprocess.run(["mount", *map(str, args)], capture_output=True, text=True)
        if r.returncode:
            pytest.skip(
                f"cannot mount ({' '.join(map(str, args))}): {r.stderr.strip() or r.returncode}; needs root "
                "(CAP_SYS_ADMIN), as CI has"
            )

    def tmpfs(self, size: str, name: str = "disk"):
        d = self.root / name
        d.mkdir()
        self._mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", d)
        self.mounted.append(d)
        return d

    def resize(self, d, size: str) -> None:
        self._mount("-o", f"remount,size={size}", d)

    def fill(self, d, leave: int = 0):
        """Fill the file system of ``d`` until ``leave`` bytes are free (a file ``d/filler``)."""
        import os

        st = os.statvfs(d)
        free = st.f_bavail * st.f_frsize
        path = d / "filler"
        try:
            with open(path, "ab") as f:
                f.write(b"\0" * max(0, free - leave))
        except OSError:  # page rounding: full is full
            pass
        return path

    def read_only(self, d) -> None:
        """``d`` read-only from now on (a read-only bind mount over it; files open stay writable)."""
        self._mount("--bind", d, d)
        self.mounted.append(d)
        self._mount("-o", "remount,bind,ro", d)

    def unmount(self, d) -> None:
        import subprocess

        subprocess.run(["umount", "-l", str(d)], capture_output=True)
        self.mounted.remove(d)

    def close(self) -> None:
        for d in reversed(list(self.mounted)):
            self.unmount(d)


@pytest.fixture
def disk(tmp_path):
    d = Disk(tmp_path)
    yield d
    d.close()


def smollm2_shaped_config(**extra):
    """A ``LlamaConfig`` of SmolLM2-135M's shapes (hidden 576, 9 heads over 3 K/V heads, MLP 1536, its
    49,152-word tied vocabulary) with two decoder layers, for random-weight models; ``extra`` sets the
    rest (context length, special token ids)."""
    from transformers import LlamaConfig

    shape = dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=2,
        num_attention_heads=9,
        num_key_value_heads=3,
        tie_word_embeddings=True,
    )
    return LlamaConfig(**shape, **extra)


def skip_without_judge_runs(sweep_path: Path) -> None:
    """Skip a test of a committed sweep whose FAPO judge (``"genrm:<run dir>"``) is a run directory trained
    first (``benchmarks/fapo_judge.py``), not committed, when that directory is absent."""
    root = Path(__file__).resolve().parents[1]
    judges = re.findall(r'"genrm:([^"]+)"', Path(sweep_path).read_text())
    if any(not (root / j).is_dir() for j in judges):
        pytest.skip(f"{Path(sweep_path).name} needs the FAPO judge run {judges} (benchmarks/fapo_judge.py trains it)")
