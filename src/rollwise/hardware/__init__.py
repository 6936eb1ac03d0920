"""Where the policy runs and in what precision (docs/architecture.md §9): ``device`` (``model.device``,
the memory checks made before a model is placed), ``precision`` (``model.compute_dtype``) and ``fp8``
(``model.rollout_precision``: FP8 rollouts, emulated).

Below the stages: the sampler (``backends/hf.py``, each Ray worker) and the trainer both read them,
so neither imports the other for them (issue #41)."""
