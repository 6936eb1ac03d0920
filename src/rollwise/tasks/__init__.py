"""Tasks: prompt sources with train / held-out splits and their verifier (docs/architecture.md §3).

A task entry is a factory ``make(arg: str | None, options) -> Task`` with an ``Options``
attribute (pydantic model) validated at config load time.
"""

from rollwise.registry import Registry

REGISTRY = Registry("task")
REGISTRY.register("arithmetic", "rollwise.tasks.arithmetic:make")
REGISTRY.register("reasoning_gym", "rollwise.tasks.reasoning_gym:make", takes_arg=True)
REGISTRY.register("jsonl", "rollwise.tasks.jsonl:make", takes_arg=True)
REGISTRY.register("hf", "rollwise.tasks.hf_dataset:make", takes_arg=True)
REGISTRY.register("pyfunc", "rollwise.tasks.pyfunc:make")
REGISTRY.register("humaneval", "rollwise.tasks.humaneval:make")
