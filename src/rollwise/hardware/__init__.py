"""Where the policy runs and in what precision (docs/architecture.md §9): ``device`` (``model.device``,
the memory checks made before a model is placed) and ``precision`` (``model.compute_dtype``).

Below the stages: the sampler (``backends/hf.py``, each Ray worker) and the trainer both read them,
so neither imports the other for them (issue #41)."""
