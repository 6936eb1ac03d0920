"""docs/results.md states only figures that a committed file holds (issue #40 item 8).

Every number in a table's cells (the first column names the row and is not checked) must be found,
at the precision it is written with, in a file named by the table's section: a result JSON under
``benchmarks/results/`` (``compare.json``, ``x.json``, ``a*.json``, ``d/{a,b}.json``; a sweep
``x.toml`` or a script ``x.py`` names ``benchmarks/results/x/`` and ``benchmarks/results/x.json``)
or another committed document (``docs/regime.md`` for published figures). ``136k`` is a value that
rounds to 136 thousand, ``41%`` (or 41 in a ``%`` column) also a share 0.41, a number in a
``GFLOP/s`` column a rate in FLOP/s, and a number in a ``÷`` column may also be the ratio of two
numbers of its own row. Prose (figures with decimals, ``k`` or ``%``) is checked the same way in
the sections of ``PROSE_SECTIONS``, with no exception: a figure whose source was not committed is
not stated (the section names the command that would write it). The check is that a figure has a
source, not that it is the right entry of it: a figure found anywhere in the named files passes.
"""

import bisect
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DOC = ROOT / "docs" / "results.md"
RESULTS = ROOT / "benchmarks" / "results"

# sections (their heading starts so) whose prose figures are checked too
PROSE_SECTIONS = ("## Predicting before generating",)

NAME = re.compile(r"[\w./*{},-]+\.(?:json|toml|py|md)\b")
# a figure: digits with optional thousands commas and decimals, then an optional unit that changes
# how it is matched; "a–b<unit>" gives a the unit of b
NUMBER = re.compile(r"(?<![\w.])(\d(?:[\d,]*\d)?(?:\.\d+)?)(?:–(\d(?:[\d,]*\d)?(?:\.\d+)?))?(k|%|×)?")


def _expand(name: str) -> list[str]:
    m = re.match(r"(.*)\{(.*)\}(.*)", name)
    return [m.group(1) + part + m.group(3) for part in m.group(2).split(",")] if m else [name]


def sources(text: str) -> set[Path]:
    """The committed files the names in ``text`` point to."""
    out: set[Path] = set()
    for name in (n for raw in NAME.findall(text) for n in _expand(raw)):
        if name.startswith("/"):  # not a committed file
            continue
        stem = Path(name).stem
        if name.endswith((".toml", ".py")):
            if (RESULTS / stem).is_dir():
                out.update((RESULTS / stem).glob("*.json"))
            out.update(RESULTS.glob(stem + ".json"))
            continue
        for base in (ROOT, ROOT / "benchmarks", RESULTS):
            out.update(p for p in base.glob(name) if p.is_file())
        if "/" not in name:
            out.update(RESULTS.rglob(name))
    return out


def _numbers_of(obj, out: list[float]) -> None:
    if isinstance(obj, bool):
        return
    if isinstance(obj, (int, float)):
        out.append(float(obj))
    elif isinstance(obj, dict):
        for v in obj.values():
            _numbers_of(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _numbers_of(v, out)


def file_values(paths) -> list[float]:
    """Sorted numbers of the files: every number value of a JSON, every figure of a text."""
    out: list[float] = []
    for p in paths:
        if p.suffix == ".json":
            _numbers_of(json.loads(p.read_text()), out)
        else:
            out.extend(float(m.group(1).replace(",", "")) for m in NUMBER.finditer(p.read_text()))
    return sorted(out)


def figures(cell: str) -> list[tuple[str, str]]:
    """(number as written, unit) of each figure in ``cell``; seed counts ``2/3`` are not figures."""
    cell = re.sub(r"\d+/\d+", "", cell)
    out = []
    for m in NUMBER.finditer(cell):
        out.append((m.group(1), m.group(3) or ""))
        if m.group(2):
            out.append((m.group(2), m.group(3) or ""))
    return out


def _has(values: list[float], lo: float, hi: float) -> bool:
    i = bisect.bisect_left(values, lo)
    return i < len(values) and values[i] <= hi


def found(written: str, unit: str, values: list[float], scale: float = 1.0, row: list[float] = ()) -> bool:
    """Whether a value rounds to the figure ``written`` (at its own decimals) times ``scale``."""
    x = float(written.replace(",", ""))
    decimals = len(written.split(".")[1]) if "." in written else 0
    half = 0.5 * 10**-decimals + 1e-9
    if unit == "k":
        x, half = x * 1000, half * 1000
    ranges = [(x * scale - half * scale, x * scale + half * scale)]
    if unit == "%":
        ranges.append((x / 100 - half / 100, x / 100 + half / 100))
    if any(_has(values, lo, hi) for lo, hi in ranges):
        return True
    return any(abs(a / b - x) <= half for a in row for b in row if b)


def tables(lines: list[str]):
    """(first line index, header cells, rows of cells) of each table."""
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            cells = [[c.strip() for c in row.strip().strip("|").split("|")] for row in [lines[i], *lines[i + 2 : j]]]
            yield i, cells[0], cells[1:]
            i = j
        else:
            i += 1


def sections(lines: list[str]) -> list[tuple[int, int, str]]:
    """(start, end, heading) of each heading's span, up to the next heading of any level; lines of
    fenced code blocks are not headings."""
    starts, fenced = [], False
    for i, line in enumerate(lines):
        fenced ^= line.startswith("```")
        if line.startswith("#") and not fenced:
            starts.append(i)
    return [(s, e, lines[s]) for s, e in zip(starts, [*starts[1:], len(lines)])]


def section_text(lines: list[str], at: int) -> str:
    """The text of the heading span holding line ``at``, with the headings it sits under (a sweep
    named in a ``##`` heading is the source of its subsections' tables)."""
    spans = [s for s in sections(lines) if s[0] <= at]
    if not spans:
        return ""
    start, end, heading = spans[-1]
    level = len(heading) - len(heading.lstrip("#"))
    parents = []
    for _, _, h in reversed(spans[:-1]):
        if len(h) - len(h.lstrip("#")) < level:
            parents.append(h)
            level = len(h) - len(h.lstrip("#"))
    return "\n".join([*parents, *lines[start:end]])


def table_misses(text: str) -> list[str]:
    lines = text.splitlines()
    misses = []
    for at, header, rows in tables(lines):
        context = section_text(lines, at)
        values = file_values(sources(context))
        for row in rows:
            numbers = [float(w.replace(",", "")) for c in row[1:] for w, _ in figures(c)]
            for col, cell in enumerate(row[1:], start=1):
                head = header[col] if col < len(header) else ""
                scale = 1e9 if "GFLOP/s" in head else 1.0
                ratios = numbers if "÷" in head else []
                for written, unit in figures(cell):
                    unit = unit or ("%" if "%" in head else "")  # a "% of ..." column
                    if not found(written, unit, values, scale, ratios):
                        misses.append(f"line {at + 1}, row {row[0]!r}, column {head!r}: {written}{unit}")
    return misses


def prose_misses(text: str) -> list[str]:
    """Figures with decimals, a ``k`` or a ``%`` in the prose of ``PROSE_SECTIONS`` that the files
    named in the section do not hold."""
    lines = text.splitlines()
    misses = []
    for start, end, heading in sections(lines):
        if not heading.startswith(PROSE_SECTIONS):
            continue
        values = file_values(sources("\n".join(lines[start:end])))
        body = [ln for ln in lines[start + 1 : end] if not ln.startswith("|")]
        for ln in body:
            for written, unit in figures(ln):
                if ("." in written or unit in ("k", "%")) and not found(written, unit, values):
                    misses.append(f"{heading[:40]!r}: {written}{unit} in {ln[:60]!r}")
    return misses


def test_every_table_figure_is_in_a_file_its_section_names():
    misses = table_misses(RESULTS_DOC.read_text())
    assert not misses, "figures in docs/results.md tables with no committed source:\n" + "\n".join(misses)


def test_prose_figures_of_the_checked_sections_are_in_their_files():
    misses = prose_misses(RESULTS_DOC.read_text())
    assert not misses, "figures in docs/results.md prose with no committed source:\n" + "\n".join(misses)


def test_grpo_roc_token_figures_are_the_runs_own():
    """RoC's runs generated more tokens than GRPO's on the same budget (the last step overshoots it):
    the doc gives each arm's range from runs.json, not "the same tokens"."""
    runs = json.loads((RESULTS / "episodes_roc" / "runs.json").read_text())["runs"]
    text = RESULTS_DOC.read_text()
    block = text[text.index("**GRPO-RoC against trajectory GRPO") :]
    block = block[: block.index("**Waiting on tools")]
    for arm in ("roc", "grpo"):
        tokens = [r["generated_tokens"] for name, r in runs.items() if name.startswith(arm + "-")]
        assert f"{round(min(tokens) / 1000)}–{round(max(tokens) / 1000)}k" in block, arm
    assert "same tokens" not in block


# ------------------------------------------------------------- the checker itself, on made-up text


def test_checker_finds_a_figure_with_no_source_and_accepts_sourced_ones():
    doc = (
        "## Sweep: `arith_quick.toml`\n\n"
        "| arm | tokens to target | final pass@1 | pass@4 |\n|---|---|---|---|\n"
        "| uniform | 136k (79k–140k) | 0.556 | 0.999 |\n"
    )
    assert table_misses(doc) == ["line 3, row 'uniform', column 'pass@4': 0.999"]


def test_checker_units():
    values = sorted([0.41, 135_800.0, 1.0017e11, 64.8, 105.1])
    assert found("41", "%", values) and found("136", "k", values) and found("100", "", values, scale=1e9)
    assert not found("42", "%", values) and not found("137", "k", values)
    assert found("1.62", "", values, row=[64.8, 105.1]) and not found("1.70", "", values, row=[64.8, 105.1])
    assert figures("87–88%, 3/5") == [("87", "%"), ("88", "%")]
    assert figures("68,423, 69,226") == [("68,423", ""), ("69,226", "")]


def test_prose_checker_finds_unsourced_figures_in_paragraphs_and_bullets():
    doc = (
        "## Predicting before generating: `arith_quick.toml`\n\n"
        "Uniform ends at 0.556.\n\n"
        "- a bullet with an unsourced 0.123\n\n"
        "A later paragraph with 0.456.\n"
    )
    misses = prose_misses(doc)
    assert len(misses) == 2 and ": 0.123 in " in misses[0] and ": 0.456 in " in misses[1]
