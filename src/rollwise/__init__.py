"""rollwise: compute-efficient RL with verifiable rewards for language models.

import rollwise
cfg = rollwise.load_config(overrides=["train.steps=20"])
result = rollwise.train(cfg)          # -> RunResult(run_dir, first/last eval, totals)
result = rollwise.train(model="tiny", dataset=rows, reward_funcs=[my_reward])   # TRL-style (rollwise.api)
"""

__version__ = "0.1.0"


def load_config(*args, **kwargs):
    from rollwise.config import load_config as _load

    return _load(*args, **kwargs)


def evaluate(*args, **kwargs):
    from rollwise.loop import evaluate_run

    return evaluate_run(*args, **kwargs)


def train(cfg=None, **kwargs):
    """Train and return a ``RunResult``: ``train(cfg)`` runs a config (``rollwise.load_config(...)``;
    ``resume``, ``backend``, ``log`` as keywords); ``train(model=..., dataset=..., reward_funcs=[...],
    reward_weights=..., overrides=[...], config=...)`` is the TRL-style API (``rollwise.api``, issue #46).
    The trainer-side modules are the package ``rollwise.trainer``."""
    from rollwise.api import API_ARGUMENTS

    if cfg is not None and not API_ARGUMENTS & kwargs.keys():
        from rollwise.loop import train as _train

        return _train(cfg, **kwargs)
    from rollwise.api import train as _api_train

    return _api_train(**({"config": cfg} if cfg is not None else {}), **kwargs)


def __getattr__(name):
    if name == "Trainer":  # rollwise.Trainer(model=..., dataset=..., reward_funcs=[...]).train()
        from rollwise.api import Trainer

        return Trainer
    raise AttributeError(f"module 'rollwise' has no attribute {name!r}")
