"""Package hygiene: importing rollwise changes nothing in the process environment, and the
sources cite only paths inside the repository (docs/architecture.md §10)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "rollwise"


def module_names() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return names


IMPORT_ALL = r"""
import importlib, json, os, sys
before = dict(os.environ)
import rollwise
after_package = dict(os.environ)
skipped = []
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except ImportError as e:  # an optional extra that is not installed (vllm, ray, ...)
        skipped.append(f"{name}: {e}")
after = dict(os.environ)
changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
print(json.dumps({"package": after_package == before, "changed": changed, "skipped": skipped}))
"""


def test_importing_every_module_sets_no_environment_variable():
    names = module_names()
    assert "rollwise" in names and "rollwise.cli" in names and len(names) > 100
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}  # the one the CLI would set
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, json.dumps(names)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["package"] is True
    assert result["changed"] == [], result
    assert len(result["skipped"]) < len(names) // 4, result["skipped"]  # the test did import most of the package


def test_cli_sets_hf_hub_offline_only_when_unset(monkeypatch, tmp_path):
    from rollwise import cli

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    cli.main(["runs", str(tmp_path)])
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    cli.main(["runs", str(tmp_path)])
    assert os.environ["HF_HUB_OFFLINE"] == "0"  # a user's choice is kept


OUT_OF_REPO = re.compile(r"\.\./shared|/work/|DESIGN\.md|(?<![\w/])(?:specs|notes)/\w+\.md|/home/\w|/Users/\w")
IN_REPO_DOC = re.compile(r"\bdocs/[\w/.-]*\w\.(?:md|png)")
SECTION = re.compile(r"docs/architecture\.md §(\d+)")


def test_sources_cite_only_paths_inside_the_repository():
    repo = SRC.parent
    sections = len(re.findall(r"^## \d+\. ", (repo / "docs" / "architecture.md").read_text(), flags=re.M))
    bad, missing, beyond = [], set(), set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.relative_to(repo)}:{n}"
            if OUT_OF_REPO.search(line):
                bad.append(f"{where}: {line.strip()}")
            missing |= {f"{where}: {m}" for m in IN_REPO_DOC.findall(line) if not (repo / m).exists()}
            beyond |= {f"{where}: §{s}" for s in SECTION.findall(line) if not 1 <= int(s) <= sections}
    assert sections >= 10
    assert bad == [], "\n".join(bad)
    assert not missing, sorted(missing)
    assert not beyond, sorted(beyond)


def test_the_scan_sees_each_kind_of_out_of_repo_citation():
    for text in (
        "../shared/notes/regime.md",
        "DESIGN.md §7",
        "/work/shared/specs",
        "specs/allocation.md §4",
        "notes/regime.md",
        "/home/someone/x.py",
    ):
        assert OUT_OF_REPO.search(text), text
    for text in (
        "docs/specs/allocation.md §4",
        "docs/regime.md",
        "docs/architecture.md §8",
        "~/.cache/rollwise",
        "/tmp/rollwise_pwned_tmp",
    ):
        assert not OUT_OF_REPO.search(text), text
