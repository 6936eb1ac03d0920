"""rollwise: compute-efficient RL with verifiable rewards for language models.

    import rollwise
    cfg = rollwise.load_config(overrides=["train.steps=20"])
    result = rollwise.train(cfg)          # -> RunResult(run_dir, final eval, ...)
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may download at run time

__version__ = "0.1.0"


def load_config(*args, **kwargs):
    from rollwise.config import load_config as _load

    return _load(*args, **kwargs)


def evaluate(*args, **kwargs):
    from rollwise.loop import evaluate_run

    return evaluate_run(*args, **kwargs)


def __getattr__(name):
    if name == "train":  # rollwise.train is also a package; see rollwise/train/__init__.py
        import rollwise.train as mod

        return mod
    raise AttributeError(name)
