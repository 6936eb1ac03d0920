"""Trainer-side pieces (model building, batching, optimizer step, checkpoints).

This package is also callable: ``rollwise.train(cfg)`` runs a training run (it forwards to
``rollwise.loop.train``), so the public one-call API and the package share a name.
"""

import sys
import types


class _CallablePackage(types.ModuleType):
    def __call__(self, cfg, **kwargs):
        from rollwise.loop import train

        return train(cfg, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
