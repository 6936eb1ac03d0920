"""The import rules of docs/architecture.md §5, checked with ``ast`` over ``src/rollwise``: every
import counts, including those made inside functions and under ``TYPE_CHECKING``."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
ASSEMBLY = {"rollwise.components", "rollwise.compat", "rollwise.session", "rollwise.loop"}
# the assembly, the commands above it (cli, the Python API, bench, export, swarm, config_doc's `config show`) and the
# config derivation the session runs before assembling (defaults)
MAY_IMPORT_ASSEMBLY = {
    "rollwise",
    "rollwise.cli",
    "rollwise.api",
    "rollwise.loop",
    "rollwise.session",
    "rollwise.components",
    "rollwise.compat",
    "rollwise.bench",
    "rollwise.export",
    "rollwise.distributed.swarm",
    "rollwise.config_doc",
    "rollwise.defaults",
}
# the one exception: ``config.load_config`` ends with ``compat.check`` (a config that loads is one that can run;
# compat imports no config module, so this makes no circle)
ALLOWED = {("rollwise.config", "rollwise.compat")}


def modules(src: Path = SRC) -> dict[str, Path]:
    out = {}
    for path in (src / "rollwise").rglob("*.py"):
        parts = path.relative_to(src).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the rollwise modules it imports anywhere in its body. ``from a import b`` names the
    module ``a.b`` where that is a module, else ``a``; a package's own ancestors are not counted."""

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges = {}
    for mod, path in mods.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (node.level - 1)]
                    base = ".".join(pkg + ([node.module] if node.module else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                t = known(name)
                if t and t != mod and t != "rollwise" and not mod.startswith(t + "."):
                    targets.add(t)
        edges[mod] = targets
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_checker_finds_a_circle_made_by_a_function_level_import(tmp_path):
    pkg = tmp_path / "rollwise"
    (pkg / "stage").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "stage" / "__init__.py").write_text("")
    (pkg / "config.py").write_text("def check():\n    from rollwise.stage import a\n")
    (pkg / "stage" / "a.py").write_text("from rollwise import config\nfrom . import b\n")
    (pkg / "stage" / "b.py").write_text("from ..types import X\n")
    (pkg / "types.py").write_text("X = 1\n")
    edges = imports(modules(tmp_path))
    assert edges["rollwise.stage.a"] == {"rollwise.config", "rollwise.stage.b"}
    assert edges["rollwise.stage.b"] == {"rollwise.types"}
    assert circles(edges) == [["rollwise.config", "rollwise.stage.a"]]


def test_no_import_circles_counting_function_level_imports():
    assert circles(imports(modules())) == []


def test_nothing_below_the_assembler_imports_it():
    bad = sorted(
        f"{m} imports {t}"
        for m, ts in imports(modules()).items()
        for t in ts
        if t in ASSEMBLY
        and m not in MAY_IMPORT_ASSEMBLY
        and not m.startswith("rollwise.bench.")
        and (m, t) not in ALLOWED
    )
    assert bad == []


GROUND = {"rollwise.types", "rollwise.registry", "rollwise.config", "rollwise.tokens", "rollwise.storage"}
# what an engine receives after each optimizer step (docs/architecture.md §8): the vLLM backend reads the
# published weights' format, the one crossing from the generation side into the pools' floor
WEIGHTS = "rollwise.distributed.weights"


def test_the_generation_side_stands_on_its_own_level():
    """Issue #41 item 2. What every generator shares (``generate.common``: step costs, ``merge_groups``)
    sits below the pools, so no backend or generator imports a pool or the trainer; device and precision
    are a package of their own (``rollwise.hardware``) on the ground floor, read by the sampler and the
    trainer alike; the Ray pool imports none of the stages its workers are built from (the assembler
    hands it ``components.worker_engine``)."""
    edges = imports(modules())
    assert {"rollwise.generate.common", "rollwise.hardware.device", "rollwise.hardware.precision"} <= set(edges)
    stage = {m: m.split(".")[1] for m in edges if m.count(".") >= 1}
    below_pools = sorted(
        f"{m} imports {t}"
        for m, ts in edges.items()
        if stage.get(m) in ("backends", "generate")
        for t in ts
        if stage.get(t) in ("distributed", "trainer") and t != WEIGHTS
    )
    assert below_pools == []
    hardware = {t for m, ts in edges.items() if stage.get(m) == "hardware" for t in ts}
    assert hardware - {"rollwise.hardware.device", "rollwise.hardware.precision"} <= GROUND
    ray_pool = edges["rollwise.distributed.ray_pool"]
    assert ray_pool <= GROUND | {
        "rollwise.distributed.local",
        "rollwise.distributed.weights",
        "rollwise.generate.common",
    }


# Rule 2 (docs/architecture.md §5): a strategy imports the ground floor and its own stage. The stage
# folders, and the crossings that are a stage's job (a task's verifier, an environment's task, the
# generators' and pools' backends, the pools' generators, the trainer's objectives), as
# ``../shared/tools/archcheck.py --stages`` counts them.
STAGES = {
    "tasks", "verify", "envs", "control", "value", "backends", "generate", "distributed",
    "filter", "replay", "reward", "batch", "objectives", "trainer", "eval",
}  # fmt: skip
STAGE_JOBS = {
    ("tasks", "verify"), ("envs", "tasks"), ("envs", "verify"), ("generate", "backends"),
    ("distributed", "backends"), ("distributed", "generate"), ("trainer", "objectives"),
}  # fmt: skip
# Every other crossing, module -> module, with the reason it stays. What two stages both use sits on the
# ground floor instead (issue #41 item 3): the batch layout (``rollwise.collate``), the flaw detectors
# (``rollwise.flaws``), the group outcome statistics (``rollwise.outcomes``), the controller contract and
# the task's reference completions (``rollwise.types``); FSDP is the trainer's own (``trainer/fsdp.py``).
CROSSINGS = {
    ("backends.vllm", "distributed.weights"): "the engine reads the published weights' format (§8)",
    ("backends.generation_copy", "distributed.weights"): "the generation copy merges LoRA as published weights do",
    ("control.rounds", "filter.replace"): "dynamic sampling's replace mode refills with the replace filter's gate",
    ("control.gdro", "objectives.common"): "Prompt-GDRO scores each response with the objective's own surrogate",
    ("control.gdro", "trainer.trainer"): "Prompt-GDRO's per-response losses run the trainer's log-prob forward",
    ("reward.shaping", "objectives.common"): "KL in the reward uses the objective's KL estimator, one definition",
    ("reward.shaping", "objectives.dapo"): "DAPO's overlong penalty, written once with DAPO, applied as a reward",
}
# The goal of issue #41: at most this many stage pairs cross beyond a stage's job.
MAX_STAGE_PAIRS = 5
# The ground floor (docs/architecture.md §4), which every stage may import: it imports no stage, so a
# crossing cannot hide behind it.
GROUND_FLOOR = {
    "rollwise.types", "rollwise.registry", "rollwise.config", "rollwise.tokens", "rollwise.storage",
    "rollwise.collate", "rollwise.flaws", "rollwise.outcomes",
}  # fmt: skip
GROUND_FLOOR_PACKAGES = ("rollwise.sections", "rollwise.hardware")


def stage_crossings(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(module, module) imports, without the ``rollwise.`` prefix, from one stage folder into another
    that are not a stage's job."""

    def stage(m: str) -> str | None:
        parts = m.split(".")
        return parts[1] if len(parts) > 1 and parts[1] in STAGES else None

    return {
        (m.split(".", 1)[1], t.split(".", 1)[1])
        for m, ts in edges.items()
        for t in ts
        if stage(m) and stage(t) and stage(m) != stage(t) and (stage(m), stage(t)) not in STAGE_JOBS
    }


def test_the_checker_finds_a_stage_crossing(tmp_path):
    pkg = tmp_path / "rollwise"
    for d in ("reward", "objectives", "tasks", "verify"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "types.py").write_text("X = 1\n")
    (pkg / "reward" / "a.py").write_text("from rollwise.types import X\nfrom rollwise.reward import b\n")
    (pkg / "reward" / "b.py").write_text("def f():\n    from rollwise.objectives.c import g\n")
    (pkg / "objectives" / "c.py").write_text("g = 1\n")
    (pkg / "tasks" / "d.py").write_text("from ..verify import e\n")  # a task's verifier: the stage's job
    (pkg / "verify" / "e.py").write_text("")
    assert stage_crossings(imports(modules(tmp_path))) == {("reward.b", "objectives.c")}


def test_a_strategy_imports_the_ground_floor_and_its_own_stage():
    """Issue #41 item 3: every crossing from one stage into another is a stage's job or listed in
    ``CROSSINGS`` with its reason; a listed crossing that no longer exists leaves the list too."""
    found = stage_crossings(imports(modules()))
    assert sorted(found - set(CROSSINGS)) == []
    assert sorted(set(CROSSINGS) - found) == []
    stage_pairs = {(a.split(".")[0], b.split(".")[0]) for a, b in found}
    assert len(stage_pairs) <= MAX_STAGE_PAIRS, sorted(stage_pairs)


def test_the_allow_list_spans_at_most_the_goal_of_stage_pairs():
    """Listing a new crossing with a reason does not pass either once it makes a sixth stage pair."""
    assert len({(a.split(".")[0], b.split(".")[0]) for a, b in CROSSINGS}) <= MAX_STAGE_PAIRS


def test_the_ground_floor_imports_no_stage():
    edges = imports(modules())
    floor = GROUND_FLOOR | {m for m in edges if m.startswith(GROUND_FLOOR_PACKAGES)}
    assert GROUND_FLOOR <= set(edges)
    stage = {m: m.split(".")[1] for m in edges if m.count(".") >= 1 and m.split(".")[1] in STAGES}
    assert sorted(f"{m} imports {t}" for m in floor for t in edges[m] if t in stage) == []
