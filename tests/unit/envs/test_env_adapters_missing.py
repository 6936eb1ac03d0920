"""textarena:<env_id> and gem:<env_id> without their library: a clear error that names the install. The import fails
for real: a fresh interpreter (python -S) whose path is the site-packages with the library's entries left out."""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[3] / "src"


def run_without(tmp_path, hidden: tuple[str, ...], code: str) -> subprocess.CompletedProcess:
    site = Path(sysconfig.get_paths()["purelib"])
    view = tmp_path / "site"
    view.mkdir()
    for entry in site.iterdir():
        if not entry.name.lower().startswith(hidden) and entry.suffix != ".pth":
            (view / entry.name).symlink_to(entry)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(view)])
    return subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "module,hidden,task,install",
    [
        ("textarena_env", ("textarena",), "textarena:GuessTheNumber-v0", "pip install 'rollwise[textarena]'"),
        ("gem_env", ("gem", "gem_llm"), "gem:game:GuessTheNumber-v0-easy", "pip install 'rollwise[gem]'"),
    ],
)
def test_a_missing_library_names_the_install(tmp_path, module, hidden, task, install):
    name, _, arg = task.partition(":")
    code = (
        f"import importlib.util, sys\nassert importlib.util.find_spec({hidden[0]!r}) is None\n"
        "from rollwise.registry import UserError\n"
        f"from rollwise.envs.{module} import make\n"
        f"try:\n    make({arg!r})\nexcept UserError as e:\n    print('REFUSED', e)\n"
    )
    res = run_without(tmp_path, hidden, code)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"REFUSED task {task!r} needs" in res.stdout and install in res.stdout
