"""Trainer-side pieces (model building, optimizer step, checkpoints, precision, devices).

``rollwise.train(cfg)`` is the public one-call API (``rollwise/__init__.py``); this package is
``rollwise.trainer``."""
