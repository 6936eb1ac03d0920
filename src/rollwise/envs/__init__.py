"""Environments for multi-turn episodes (docs/architecture.md §11): the protocol (``base``),
tools (``tools``) and the built-in environments. Environment tasks are registered in
``rollwise.tasks.REGISTRY`` like any task; the episode pool (``rollwise.generate.episodes``) runs them."""
