"""Tasks: prompt sources with train / held-out splits and their verifier (docs/architecture.md §3).

A task entry is a factory ``make(arg: str | None, options) -> Task`` with an ``Options``
attribute (pydantic model) validated at config load time.
"""

from rollwise.quota import proportional_quota
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
    if cfg.task.train_mix:
        return TrainSubset(task, cfg.task.max_train_prompts, mix_quotas(cfg.task.train_mix, cfg.task.max_train_prompts))
    if cfg.task.max_train_prompts:
        return TrainSubset(task, cfg.task.max_train_prompts)
    return task


def mix_quotas(mix: dict[str, float], n: int) -> dict[str, int]:
    """``task.train_mix``'s shares as prompt counts summing to ``n`` (largest remainders; ties to the
    difficulty named first); a clear error for a mix without ``task.max_train_prompts`` or with shares
    that are not positive or do not sum to 1."""
    if not n:
        raise UserError("task.train_mix needs task.max_train_prompts > 0 (the number of RL prompts it shares out)")
    bad = {d: x for d, x in mix.items() if not x > 0}
    if bad:
        raise UserError(f"task.train_mix shares must be > 0 (got {bad})")
    if abs(sum(mix.values()) - 1.0) > 1e-6:
        raise UserError(f"task.train_mix shares must sum to 1 (got {sum(mix.values()):g} from {mix})")
    return dict(zip(mix, proportional_quota(n, list(mix.values()))))


class TrainSubset:
    """A task whose RL train split is the first ``n`` prompts of ``task``'s (``task.max_train_prompts``)
    or, with ``quotas`` (difficulty -> count, ``task.train_mix``), the first prompts of each difficulty up
    to its count (in the split's order), interleaved evenly; everything else, the warm-start examples and
    the held-out split included, is ``task``'s own."""

    def __init__(self, task, n: int, quotas: dict[str, int] | None = None):
        self._task = task
        if quotas is None:
            self._train = tuple(task.train_prompts()[:n])
            return
        by: dict[str, list] = {d: [] for d in quotas}
        for p in task.train_prompts():
            d = str(p.metadata.get("difficulty"))
            if len(by.get(d, ())) < quotas.get(d, 0):
                by[d].append(p)
        short = {d: quotas[d] - len(ps) for d, ps in by.items() if len(ps) < quotas[d]}
        if short:
            have = sorted({str(p.metadata.get("difficulty")) for p in task.train_prompts()})
            raise UserError(
                f"task.train_mix asks for more prompts of difficulty {sorted(short)} than the train split holds "
                f"(short by {short}; the split's difficulties: {have})"
            )
        # interleaved evenly: a difficulty's i-th prompt sits at (i + 1/2) / its count of the way through, so
        # every stretch of the stream holds the mix (the split's order alone would put the scarce ones first);
        # ties go to the difficulty named first in the mix
        keyed = [((i + 0.5) / quotas[d], j, p) for j, (d, ps) in enumerate(by.items()) for i, p in enumerate(ps)]
        self._train = tuple(p for *_, p in sorted(keyed, key=lambda k: k[:2]))

    def train_prompts(self):
        return self._train

    def __getattr__(self, name):
        return getattr(self._task, name)
