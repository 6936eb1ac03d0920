"""Package hygiene: importing rollwise changes nothing in the process environment, and the
sources cite only paths inside the repository (docs/architecture.md §8)."""

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
    out = subprocess.run([sys.executable, "-c", IMPORT_ALL, json.dumps(names)], env=env, capture_output=True,
                         text=True, timeout=600, check=True)
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
