"""Compute precision: bf16 autocast with fp32 master weights where it is the faster choice.

``model.compute_dtype`` (config) chooses the dtype matrix products run in while the weights, the
optimizer state and every log-softmax stay in ``model.dtype`` (fp32 by default):

* ``"float32"``: no autocast;
* ``"bfloat16"``: ``torch.autocast(<device>, torch.bfloat16)`` around the policy's forward passes
  (generation, scoring, training);
* ``"auto"``: the faster of the two on the machine the run is on (``decide_compute_dtype``):

  - **CPU: measured**, not read off a CPU flag. ``avx512_bf16`` without AMX was found to make bf16
    autocast *slower* end to end than fp32 (issue #33: 18.1 s vs 14.1 s for the embedded default,
    30.1 vs 18.5 s/step for SmolLM2), and without ``avx512_bf16`` bf16 is emulated and slower still.
    The first run times the model's own matrix products (``MatmulShapes``, read from its config:
    hidden, intermediate, key/value and vocabulary sizes, each weighted by how often one pass
    through the model runs it) forward and backward in fp32 and under bf16 autocast, with fp32
    weights cast inside each timed call as in a real forward (``measure_pass_seconds``: about 0.5 s
    for the tiny default, 1.5-4 s for SmolLM2-135M on a loaded 2-core Xeon).
    bf16 is chosen only when it is at least ``BF16_MIN_SPEEDUP`` times as fast (``choose``). The
    timings are cached per CPU model, CPU flags, torch version, torch thread count and model shapes
    in ``<cache root>/compute_dtype.json`` (cache root: ``$ROLLWISE_CACHE`` or
    ``~/.cache/rollwise``), so later runs reuse them; delete that file to measure again.
    **A doubtful measurement is measured again before it is cached** (``trust``, issue #40):
    other work on the CPU skews the ratio (``benchmarks/results/compute_dtype_auto.json`` holds the
    same SmolLM2 products on one CPU at 0.27x and 0.61x), and a cached number is reused for good. So the 1-minute load
    average per core (``load_per_core``) is read before each measurement and stored with it; a
    measurement taken at more than ``MAX_LOAD_PER_CORE`` or whose speed-up lies within
    ``NEAR_THRESHOLD`` of ``BF16_MIN_SPEEDUP`` (either side) is measured again, up to
    ``MEASURE_TRIES`` times, each dtype's fastest timing kept (the least disturbed). The result is
    cached either way, so every run on the machine writes the same decision and ratio (a resumed
    run's ledger lines read as an uninterrupted run's), with the doubt in the log; but an entry
    measured only under load whose speed-up lies within ``LOAD_SKEW`` of the threshold (where load
    could have flipped the decision) is measured again, once, by the first run that finds the CPU quiet.
  - **CUDA: capability, not a flag** (``cuda_choice``): bf16 where the GPU has bf16 tensor cores,
    compute capability 8.0 (Ampere) and later, and torch reports bf16 support; fp32 otherwise. On
    V100 (7.0) and T4 (7.5) ``torch.cuda.is_bf16_supported()`` can be true by emulation, which is
    slower than fp32. fp16 is not chosen there: its range needs loss scaling (a gradient scaler)
    that the trainer does not do, and its 5-bit exponent overflows logits that bf16 and fp32 hold
    (issue #40). Nothing is measured on GPUs.
  - other devices: fp32.

  Weights that are already bf16 (``model.dtype = "bfloat16"``) run in bf16 regardless; auto then
  says bf16 without measuring.

An explicit ``"float32"`` or ``"bfloat16"`` always wins. The run logs the decision and its reason
once at the start and writes ``Precision.ledger_fields()`` (``precision/compute_dtype``,
``precision/bf16_speedup``, ``precision/reason``) on every ``metrics.jsonl`` line.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

SETTINGS = ("auto", "float32", "bfloat16")
BF16_MIN_SPEEDUP = 1.10  # auto picks bf16 on CPU only when it is at least this much faster than fp32
MEASURE_ROWS = 64  # token rows per timed product: between a decode step's batch and a training micro-batch
MEASURE_BUDGET_S = 1.5  # no timed round starts after this many seconds (one always runs)
MIN_ROUNDS = 2  # timed rounds of every product in each dtype (after one untimed warm-up round) ...
MIN_MEASURE_S = 0.25  # ... and at least this many seconds of them, up to MAX_ROUNDS (small models)
MAX_ROUNDS = 20
MAX_TIMED_OUT = 8192  # a wider product (the LM head) is timed on this many output columns and scaled up
CACHE_FILE = "compute_dtype.json"
CACHE_VERSION = 2  # bump when what is measured changes: older entries are then measured again (2: load recorded)
MAX_LOAD_PER_CORE = 0.75  # a measurement started above this 1-minute load average per core is not cached as is
NEAR_THRESHOLD = 1.25  # nor one whose speed-up is within this factor of BF16_MIN_SPEEDUP (0.88x-1.375x)
LOAD_SKEW = 3.0  # how far load can move a measured speed-up (the committed SmolLM2 products: 0.27x and 0.61x)
MEASURE_TRIES = 2  # measurements at most before an untrustworthy decision is used uncached
BF16_MIN_CAPABILITY = (8, 0)  # CUDA compute capability with bf16 tensor cores (Ampere)


@dataclass(frozen=True)
class Precision:
    """What ``model.compute_dtype`` resolved to, and why."""

    dtype: torch.dtype
    setting: str  # the configured value: "auto", "float32" or "bfloat16"
    reason: str  # "configured", "measured", "cuda capability", "bf16 weights", "no rule for device"
    detail: str  # one sentence for the run's log
    bf16_speedup: float | None = None  # fp32 seconds / bf16 seconds of the measured products (> 1: bf16 faster)
    fp32_s: float | None = None  # measured seconds of one pass through the model's products
    bf16_s: float | None = None
    cached: bool = False  # the timings came from the cache (measured by an earlier run on this machine)
    load_per_core: float | None = None  # the CPU's load when the timings were taken (None: unknown)

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def ledger_fields(self) -> dict:
        """The decision as ``metrics.jsonl`` fields (``Ledger.facts``). They do not say whether the
        timings were cached (the log does), so every run on one machine writes the same fields and
        a resumed run's lines read as an uninterrupted run's."""
        speedup = None if self.bf16_speedup is None else round(self.bf16_speedup, 4)
        return {
            "precision/compute_dtype": self.name,
            "precision/bf16_speedup": speedup,
            "precision/reason": self.reason,
        }

    def describe(self) -> str:
        """The log line: ``compute dtype: float32 (model.compute_dtype = 'auto'; measured: ...)``."""
        return f"compute dtype: {self.name} (model.compute_dtype = {self.setting!r}; {self.reason}: {self.detail})"


# ----------------------------------------------------------------------------- the rule (pure)


def choose(fp32_s: float, bf16_s: float, min_speedup: float = BF16_MIN_SPEEDUP) -> tuple[torch.dtype, float]:
    """The faster dtype from measured seconds of the same work: ``(bfloat16, speedup)`` when bf16
    is at least ``min_speedup`` times as fast as fp32, else ``(float32, speedup)``; speedup =
    ``fp32_s / bf16_s``."""
    if not (fp32_s > 0 and bf16_s > 0):
        raise ValueError(f"measured times must be positive, got fp32 {fp32_s!r} s and bf16 {bf16_s!r} s")
    speedup = fp32_s / bf16_s
    return (torch.bfloat16 if speedup >= min_speedup else torch.float32), speedup


def trust(speedup: float, load_per_core: float | None) -> str | None:
    """Why a CPU measurement with bf16 speed-up ``speedup``, taken at ``load_per_core`` (1-minute
    load average per core; None where unknown), should not be cached, or None when it may be: the
    CPU was loaded (above ``MAX_LOAD_PER_CORE``), or the speed-up is within ``NEAR_THRESHOLD`` of
    ``BF16_MIN_SPEEDUP``, where a disturbed measurement flips the decision."""
    if load_per_core is not None and load_per_core > MAX_LOAD_PER_CORE:
        return f"the CPU was loaded ({load_per_core:.2f} per core > {MAX_LOAD_PER_CORE:g})"
    lo, hi = BF16_MIN_SPEEDUP / NEAR_THRESHOLD, BF16_MIN_SPEEDUP * NEAR_THRESHOLD
    if lo < speedup < hi:
        return f"the speed-up {speedup:.2f}x is within {lo:.2f}x-{hi:.2f}x of the {BF16_MIN_SPEEDUP:.2f}x threshold"
    return None


def cuda_choice(capability: tuple[int, int], bf16_supported: bool) -> tuple[torch.dtype, str]:
    """``auto`` on a CUDA device of compute ``capability`` where torch reports ``bf16_supported``:
    ``(bfloat16, why)`` from capability 8.0 on when torch agrees, else ``(float32, why)`` (module
    docstring: emulated bf16 before Ampere; no fp16 without loss scaling)."""
    cap = f"{capability[0]}.{capability[1]}"
    if tuple(capability) >= BF16_MIN_CAPABILITY and bf16_supported:
        return torch.bfloat16, f"compute capability {cap} has bf16 tensor cores (not measured on GPUs)"
    if tuple(capability) >= BF16_MIN_CAPABILITY:
        return torch.float32, f"compute capability {cap}, but torch reports no bf16 support"
    return torch.float32, (
        f"compute capability {cap} < 8.0 has no bf16 tensor cores (bf16 would be emulated; "
        "fp16 would need loss scaling): fp32"
    )


# ----------------------------------------------------------------------------- the model's matrix shapes


@dataclass(frozen=True)
class MatmulShapes:
    """The matrix products of one pass through a decoder-only transformer, from its config."""

    hidden: int
    intermediate: int
    kv: int  # output width of the key and value projections (grouped-query attention: < hidden)
    vocab: int
    layers: int

    @classmethod
    def of(cls, config) -> MatmulShapes:
        """Read the sizes from a Hugging Face model config (Llama/Qwen/Mistral names, GPT-2 names as
        a fallback); a ``ValueError`` names what is missing."""

        def get(*names, default=None):
            for n in names:
                v = getattr(config, n, None)
                if v is not None:
                    return int(v)
            if default is not None:
                return default
            raise ValueError(
                f"model config {type(config).__name__} has none of {', '.join(names)}: "
                "cannot measure its matrix products (set model.compute_dtype to float32 or bfloat16)"
            )

        hidden = get("hidden_size", "n_embd", "d_model")
        heads = get("num_attention_heads", "n_head", default=1)
        kv_heads = get("num_key_value_heads", default=heads)
        return cls(
            hidden=hidden,
            intermediate=get("intermediate_size", "n_inner", "ffn_dim", default=4 * hidden),
            kv=hidden * kv_heads // max(1, heads),
            vocab=get("vocab_size"),
            layers=get("num_hidden_layers", "n_layer", "num_layers"),
        )

    def products(self) -> list[tuple[int, int, int]]:
        """``(in features, out features, times per pass)`` of each distinct linear layer: query and
        output projections, key and value, MLP gate and up, MLP down, the LM head."""
        h, i, kv, n = self.hidden, self.intermediate, self.kv, self.layers
        out = {(h, h): 2 * n}
        out[(h, kv)] = out.get((h, kv), 0) + 2 * n
        out[(h, i)] = out.get((h, i), 0) + 2 * n
        out[(i, h)] = out.get((i, h), 0) + n
        out[(h, self.vocab)] = out.get((h, self.vocab), 0) + 1
        return [(a, b, c) for (a, b), c in out.items()]


# ----------------------------------------------------------------------------- measurement (times things)


def _product_seconds(w: torch.Tensor, x: torch.Tensor, dtype: torch.dtype, clock: Callable[[], float]) -> float:
    """One forward and backward of ``x @ w.T`` under ``autocast(dtype)``, fp32 leaf weights (cast
    inside the call, as a forward pass casts them)."""
    w.grad = x.grad = None
    t0 = clock()
    with autocast(dtype, "cpu"):
        y = torch.nn.functional.linear(x, w)
    y.float().sum().backward()
    return clock() - t0


def measure_pass_seconds(
    shapes: MatmulShapes,
    rows: int = MEASURE_ROWS,
    budget_s: float = MEASURE_BUDGET_S,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, float]:
    """Seconds of one pass through ``shapes``' products (forward + backward, ``rows`` token rows) in
    fp32 and under bf16 autocast on this CPU: ``(fp32_s, bf16_s)``. Each round times every product
    in both dtypes back to back, alternating which goes first; a product's time is its fastest
    round (the least disturbed by other load), weighted by how often a pass runs it. A product wider than
    ``MAX_TIMED_OUT`` outputs (the LM head of a large vocabulary) is timed on that many and scaled by its width: its
    time is linear in the width, which keeps the measurement to a few seconds."""
    gen = torch.Generator().manual_seed(0)
    tensors = []
    for i, o, count in shapes.products():
        timed = min(o, MAX_TIMED_OUT)
        tensors.append(
            (
                torch.randn(timed, i, generator=gen).mul_(0.02).requires_grad_(),
                torch.randn(rows, i, generator=gen).requires_grad_(),
                count * o / timed,
            )
        )
    dtypes = (torch.float32, torch.bfloat16)
    best = {d: [float("inf")] * len(tensors) for d in dtypes}
    with torch.enable_grad():
        for d in dtypes:  # warm-up: kernels chosen, caches and allocator primed
            for w, x, _ in tensors:
                _product_seconds(w, x, d, clock)
        t0, rounds = clock(), 0
        while True:
            for k, (w, x, _) in enumerate(tensors):  # both dtypes of a product back to back: the same load
                for d in dtypes if (rounds + k) % 2 == 0 else dtypes[::-1]:
                    best[d][k] = min(best[d][k], _product_seconds(w, x, d, clock))
            rounds += 1
            elapsed = clock() - t0
            if rounds >= MAX_ROUNDS or elapsed >= budget_s or (rounds >= MIN_ROUNDS and elapsed >= MIN_MEASURE_S):
                break
    return tuple(sum(t * c for t, (_, _, c) in zip(best[d], tensors)) for d in dtypes)


# ----------------------------------------------------------------------------- CPU identity and the cache


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` text (empty where it cannot be read)."""
    for line in (_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` where that is missing)."""
    for line in (_cpuinfo() if cpuinfo is None else cpuinfo).splitlines():
        if line.lower().startswith("model name"):
            return line.split(":", 1)[1].strip()
    import platform

    return platform.processor() or platform.machine() or "unknown"


def machine_key(
    shapes: MatmulShapes,
    cpu: str | None = None,
    flags: frozenset[str] | None = None,
    torch_version: str | None = None,
    threads: int | None = None,
) -> dict:
    """What a measured decision depends on: the cache entry's key (defaults: this machine)."""
    flags = cpu_flags() if flags is None else flags
    return {
        "version": CACHE_VERSION,
        "cpu": cpu_model() if cpu is None else cpu,
        "cpu_flags_sha": hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16],
        "torch": torch.__version__ if torch_version is None else torch_version,
        "threads": torch.get_num_threads() if threads is None else threads,
        "shapes": asdict(shapes),
        "rows": MEASURE_ROWS,
    }


def _digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def default_cache_path() -> Path:
    from rollwise.storage import cache_root

    return cache_root() / CACHE_FILE


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock beside ``path`` (processes starting together on one machine, such as
    rollout workers or data-parallel ranks, measure once and the others read the result); a no-op
    where no lock can be taken."""
    try:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path.with_name(path.name + ".lock"), "a")
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield
    finally:
        f.close()  # releases the lock


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    entries = data.get("entries") if isinstance(data, dict) else None
    return entries if isinstance(entries, dict) else {}


def _write_cache(path: Path, entries: dict) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"entries": entries}, indent=1, sort_keys=True))
    os.replace(tmp, path)


def load_per_core() -> float | None:
    """The 1-minute load average per core this process may run on (None where the platform has no
    load average)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return load / max(1, cores)


def measured_cpu_decision(
    shapes: MatmulShapes,
    *,
    cache_path: Path | None = None,
    measure: Callable[[MatmulShapes], tuple[float, float]] | None = None,
    key: dict | None = None,
    log: Callable[[str], None] | None = None,
    load: Callable[[], float | None] | None = None,
) -> Precision:
    """``auto`` on a CPU: bf16 or fp32 from timings of ``shapes``' products, read from the cache
    entry for ``key`` (default: this machine, ``machine_key``) or measured (``measure``, default
    ``measure_pass_seconds``; ``load()``, default ``load_per_core``, read before each measurement)
    and stored there (module docstring: while ``trust`` doubts them, up to ``MEASURE_TRIES``
    measurements, the fastest timing of each dtype kept; an entry measured only under load is
    measured again by the first run that finds the CPU quiet). A cache that cannot be read is
    measured over; one that cannot be written is reported through ``log`` and the decision still
    made."""
    measure = measure_pass_seconds if measure is None else measure
    load = load_per_core if load is None else load
    key = machine_key(shapes) if key is None else key
    path = default_cache_path() if cache_path is None else Path(cache_path)
    digest = _digest(key)
    doubt = None
    with _locked(path):
        entry = _read_cache(path).get(digest)
        cached = (
            isinstance(entry, dict)
            and entry.get("key") == key
            and _positive(entry.get("fp32_s"))
            and _positive(entry.get("bf16_s"))
        )
        now = None
        if cached and _loaded(entry.get("load_per_core")) and _could_flip(entry["fp32_s"] / entry["bf16_s"]):
            now = load()
            cached = _loaded(now) or now is None  # measured under load, and the CPU is quiet now: measure again
        if cached:
            fp32_s, bf16_s = float(entry["fp32_s"]), float(entry["bf16_s"])
            busy = entry.get("load_per_core")
        else:
            fp32_s = bf16_s = busy = float("inf")
            for i in range(MEASURE_TRIES):
                at = now if i == 0 and now is not None else load()
                f, b = measure(shapes)
                fp32_s, bf16_s = min(fp32_s, f), min(bf16_s, b)  # the least disturbed of the measurements
                busy = None if at is None or busy is None else min(busy, at)
                doubt = trust(fp32_s / bf16_s, busy)
                if doubt is None:
                    break
            entries = _read_cache(path)
            entries[digest] = {
                "key": key,
                "fp32_s": fp32_s,
                "bf16_s": bf16_s,
                "load_per_core": busy,
                "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            try:
                _write_cache(path, entries)
            except OSError as e:
                if log is not None:
                    log(
                        f"warning: could not cache the compute-dtype measurement in {path} ({e}); the next run "
                        "measures again"
                    )
            if doubt is not None and log is not None:
                again = "a run that finds the CPU quieter measures again" if _loaded(busy) else "cached as it is"
                log(f"note: compute-dtype measurement doubtful after {MEASURE_TRIES} measurements ({doubt}); {again}")
    dtype, speedup = choose(fp32_s, bf16_s)
    verdict = "bf16 is" if dtype == torch.bfloat16 else f"bf16 needs >= {BF16_MIN_SPEEDUP:.2f}x; fp32 is"
    where = f"cached in {path}" if cached else f"measured now, cached in {path}"
    if doubt is not None:
        where += f"; doubtful: {doubt}"
    at = "" if busy is None else f", load {busy:.2f} per core"
    detail = (
        f"the model's matrix products on {key['cpu']} ({key['threads']} threads, torch {key['torch']}{at}) took "
        f"{fp32_s * 1e3:.2f} ms in fp32 and {bf16_s * 1e3:.2f} ms under bf16 autocast per pass, "
        f"bf16 speed-up {speedup:.2f}x: {verdict} faster here ({where})"
    )
    return Precision(dtype, "auto", "measured", detail, speedup, fp32_s, bf16_s, cached, busy)


def _could_flip(speedup: float) -> bool:
    """Whether load could have put a speed-up on the wrong side of ``BF16_MIN_SPEEDUP``: within
    ``LOAD_SKEW`` of it. Farther, the decision stands whatever the load, and the cached entry with it
    (so the runs on a machine keep writing the same ratio)."""
    return BF16_MIN_SPEEDUP / LOAD_SKEW <= speedup <= BF16_MIN_SPEEDUP * LOAD_SKEW


def _loaded(load_per_core) -> bool:
    return _positive(load_per_core) and load_per_core > MAX_LOAD_PER_CORE


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


# ----------------------------------------------------------------------------- resolution (the one entry point)


def decide_compute_dtype(
    setting: str,
    device: torch.device | str = "cpu",
    model_config=None,
    *,
    weights_dtype: torch.dtype | None = None,
    cache_path: Path | None = None,
    measure: Callable[[MatmulShapes], tuple[float, float]] | None = None,
    log: Callable[[str], None] | None = None,
    load: Callable[[], float | None] | None = None,
) -> Precision:
    """What ``setting`` ("auto" / "float32" / "bfloat16") means for a model with config
    ``model_config`` on ``device`` (module docstring). On a CPU ``auto`` needs ``model_config``
    (its matrix shapes are what is timed)."""
    if setting not in SETTINGS:
        raise ValueError(f"model.compute_dtype must be 'auto', 'float32' or 'bfloat16', got {setting!r}")
    if setting != "auto":
        return Precision(getattr(torch, setting), setting, "configured", "set explicitly, not measured")
    if weights_dtype == torch.bfloat16:
        return Precision(
            torch.bfloat16, setting, "bf16 weights", "model.dtype is bfloat16, so products run in bf16 anyway"
        )
    dev = torch.device(device)
    if dev.type == "cuda":  # the one CUDA query; the rule is cuda_choice
        dtype, why = cuda_choice(torch.cuda.get_device_capability(dev), torch.cuda.is_bf16_supported())
        return Precision(dtype, setting, "cuda capability", why)
    if dev.type != "cpu":
        return Precision(
            torch.float32, setting, "no rule for device", f"auto has no bf16 rule for {dev.type!r} devices"
        )
    if model_config is None:
        raise ValueError("compute_dtype 'auto' on CPU times the model's matrix products: pass its config")
    return measured_cpu_decision(
        MatmulShapes.of(model_config), cache_path=cache_path, measure=measure, log=log, load=load
    )


def resolve_compute_dtype(setting: str, device: torch.device | str = "cpu", model_config=None, **kw) -> torch.dtype:
    """The dtype ``decide_compute_dtype`` picks (for callers that need no reason)."""
    return decide_compute_dtype(setting, device, model_config, **kw).dtype


def autocast(dtype: torch.dtype | None, device: torch.device | str = "cpu", cache_enabled: bool = True):
    """``torch.autocast`` to ``dtype`` on ``device``, or a no-op for None / float32. ``cache_enabled``
    False: no cache of the weights' casts (a CUDA graph capture needs it off)."""
    if dtype is None or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype, cache_enabled=cache_enabled)
