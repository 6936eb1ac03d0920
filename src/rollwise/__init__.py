"""rollwise: compute-efficient RL with verifiable rewards for language models.

    import rollwise
    cfg = rollwise.load_config(overrides=["train.steps=20"])
    result = rollwise.train(cfg)          # -> RunResult(run_dir, first/last eval, totals)
"""

import types

__version__ = "0.1.0"


def load_config(*args, **kwargs):
    from rollwise.config import load_config as _load

    return _load(*args, **kwargs)


def evaluate(*args, **kwargs):
    from rollwise.loop import evaluate_run

    return evaluate_run(*args, **kwargs)


class _CallablePackage(types.ModuleType):
    """``rollwise.train`` is the trainer package *and* the public ``train(cfg)`` call."""

    def __call__(self, cfg, **kwargs):
        from rollwise.loop import train as _train

        return _train(cfg, **kwargs)


from rollwise import train  # noqa: E402  (light: the package's __init__ imports nothing)

train.__class__ = _CallablePackage
