"""Trainer-side pieces (model building, batching, optimizer step, checkpoints).

``rollwise.train(cfg)`` also works as a call (the package is made callable in
``rollwise/__init__.py``), so the one-call public API and this package share a name.
"""
