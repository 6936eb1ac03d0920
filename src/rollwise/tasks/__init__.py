"""Tasks: prompt sources with train / held-out splits and their verifier (docs/architecture.md §3).

A task entry is a factory ``make(arg: str | None, options) -> Task`` with an ``Options``
attribute (pydantic model) validated at config load time.
"""

from rollwise.registry import Registry, UserError, validate_options

REGISTRY = Registry("task")
REGISTRY.register("arithmetic", "rollwise.tasks.arithmetic:make")
REGISTRY.register("reasoning_gym", "rollwise.tasks.reasoning_gym:make", takes_arg=True)
REGISTRY.register("jsonl", "rollwise.tasks.jsonl:make", takes_arg=True)
REGISTRY.register("hf", "rollwise.tasks.hf_dataset:make", takes_arg=True)
REGISTRY.register("dataset", "rollwise.tasks.dataset:make", takes_arg=True)  # the Python API's rows
REGISTRY.register("pyfunc", "rollwise.tasks.pyfunc:make")
REGISTRY.register("humaneval", "rollwise.tasks.humaneval:make")
REGISTRY.register("fapo_judge", "rollwise.tasks.fapo_judge:make")  # FAPO GenRM training (arXiv 2510.22543)
# multi-turn environments (rollwise.envs, docs/architecture.md §11)
REGISTRY.register("guess_number", "rollwise.envs.guess:make")
REGISTRY.register("calculator", "rollwise.envs.calculator:make")
REGISTRY.register("python_math", "rollwise.envs.python_math:make")
REGISTRY.register("frozenlake", "rollwise.envs.text_gym:make_frozenlake")
REGISTRY.register("gym", "rollwise.envs.text_gym:make_gym", takes_arg=True)
REGISTRY.register("textarena", "rollwise.envs.textarena_env:make", takes_arg=True)
REGISTRY.register("gem", "rollwise.envs.gem_env:make", takes_arg=True)
REGISTRY.register("multi_attempt", "rollwise.envs.multi_attempt:make")


def build(cfg):
    """The run's task (``task.name`` / ``task.options``), its splits checked non-empty; with
    ``task.max_train_prompts`` its RL train split cut to that many prompts (``TrainSubset``)."""
    res = REGISTRY.resolve(cfg.task.name)
    task = res.obj(res.arg, validate_options("task", cfg.task.name, res.obj, dict(cfg.task.options)))
    if not task.train_prompts():
        raise UserError(f"task {cfg.task.name!r} has an empty train split")
    if not task.heldout_prompts():
        raise UserError(f"task {cfg.task.name!r} has an empty held-out split")
    if cfg.task.max_train_prompts:
        return TrainSubset(task, cfg.task.max_train_prompts)
    return task


class TrainSubset:
    """A task whose RL train split is the first ``n`` prompts of ``task``'s (``task.max_train_prompts``);
    everything else, the warm-start examples included, is ``task``'s own."""

    def __init__(self, task, n: int):
        self._task, self._train = task, tuple(task.train_prompts()[:n])

    def train_prompts(self):
        return self._train

    def __getattr__(self, name):
        return getattr(self._task, name)
