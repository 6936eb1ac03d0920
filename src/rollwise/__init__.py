"""rollwise: compute-efficient RL with verifiable rewards for language models.

import rollwise
cfg = rollwise.load_config(overrides=["train.steps=20"])
result = rollwise.train(cfg)          # -> RunResult(run_dir, first/last eval, totals)
"""

__version__ = "0.1.0"


def load_config(*args, **kwargs):
    from rollwise.config import load_config as _load

    return _load(*args, **kwargs)


def evaluate(*args, **kwargs):
    from rollwise.loop import evaluate_run

    return evaluate_run(*args, **kwargs)


def train(cfg, **kwargs):
    """Train ``cfg`` (``rollwise.load_config(...)``) and return a ``RunResult``; the trainer-side
    modules are the package ``rollwise.trainer``."""
    from rollwise.loop import train as _train

    return _train(cfg, **kwargs)
