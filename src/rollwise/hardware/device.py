"""Where the policy runs (docs/architecture.md §9): ``model.device``, decided once, and the memory arithmetic
checked before a model is placed there.

``resolve_device("auto")`` is ``cuda`` when torch sees a CUDA device, else ``cpu``; ``"cpu"``,
``"cuda"`` and ``"cuda:N"`` are taken as asked (``auto`` and ``cuda`` mean the current CUDA device,
which a torchrun rank has set to its ``LOCAL_RANK``), and a CUDA request on a machine without CUDA (or
an index beyond the devices present) is refused naming ``model.device``. Every other module
follows the model's device (``next(model.parameters()).device``); sampling draws its random
numbers from a CPU generator (``backends/hf.py``), so a seed reproduces on one device.

``training_memory`` is the single-device arithmetic of full fine-tuning or LoRA with AdamW:
weights in ``model.dtype``, a gradient per trainable weight (same dtype), two fp32 Adam moments
per trainable weight, an optional frozen reference copy, plus the share a colocated vLLM engine
reserves (``vllm.gpu_memory_utilization``). Activations and the kept log-prob budget come on top
and scale with the micro-batch, so the check leaves ``HEADROOM`` of the device free for them.
It is arithmetic, not a measurement: ``benchmarks/gpu_check.py`` measures peak memory on a GPU.

``check_activations`` is the host-memory check of one training pass on CPU, where running out of
memory is not an exception but the kernel killing the process with no message: the activations a
pass keeps for its backward, estimated as ``ACTIVATION_FLOATS`` values per token, decoder layer and
hidden unit (with ``train.activation_checkpointing``: each layer's input plus one layer's), against
the memory available when training began (``MemAvailable``, Linux; elsewhere nothing is checked).
Calibrated on SmolLM2-135M in fp32 with LoRA: 0.77-1.02 GB per 560-token row measured (20-27
values), 1.08 GB estimated.
With FSDP (``train.fsdp``, ``shards = W`` ranks; ``rollwise.trainer.fsdp``) the trained weights,
their gradients and moments are divided by W (rounded up), and a whole generation copy of the
weights (the ``hf`` sampler's) is added; the reference copy stays whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from rollwise.registry import UserError

DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
HEADROOM = 0.10  # share of device memory left for activations, the allocator and the CUDA context
GIB = 2**30
CPU_KEEP_LOGITS_BYTES = 512 * 2**20  # the CPU budget of kept fp32 completion log-probs (trainer.token_logprobs)
CUDA_KEEP_LOGITS_SHARE = 0.25  # on CUDA: this share of the free memory, at most CUDA_KEEP_LOGITS_MAX
CUDA_KEEP_LOGITS_MAX = 8 * GIB
ACTIVATION_FLOATS = 28  # values a decoder layer keeps per token and hidden unit for its backward (see above)
ACTIVATION_SHARE = 0.9  # share of the available host memory one training pass's activations may take


def check_setting(setting: str) -> None:
    """Refuse a ``model.device`` value that is not auto / cpu / cuda / cuda:N (config-time)."""
    if not DEVICE_PATTERN.match(setting):
        raise UserError(f"model.device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {setting!r}")


def resolve_device(setting: str, cuda_count: int | None = None) -> torch.device:
    """The ``torch.device`` that ``model.device = setting`` means on this machine. ``cuda_count``
    (the number of CUDA devices) defaults to what torch sees; tests pass it."""
    check_setting(setting)
    if cuda_count is None:
        cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    # "auto" / "cuda": the current CUDA device, which torchrun's ranks set to their LOCAL_RANK
    # (distributed/data_parallel.start runs first), so each rank trains on its own GPU
    current = torch.cuda.current_device() if cuda_count and torch.cuda.is_available() else 0
    if setting == "auto":
        return torch.device("cuda", current) if cuda_count else torch.device("cpu")
    if setting == "cpu":
        return torch.device("cpu")
    index = int(setting.split(":", 1)[1]) if ":" in setting else current
    if cuda_count == 0:
        raise UserError(
            f"model.device = {setting!r} but torch sees no CUDA device on this machine "
            f"(torch {torch.__version__}, built {'with' if torch.version.cuda else 'without'} CUDA); "
            "use model.device = 'cpu' or 'auto'"
        )
    if index >= cuda_count:
        raise UserError(
            f"model.device = {setting!r} but this machine has {cuda_count} CUDA device(s) "
            f"(cuda:0 .. cuda:{cuda_count - 1})"
        )
    return torch.device("cuda", index)


def describe(device: torch.device) -> dict:
    """Facts about ``device`` for the run's log and ledger: type, name, total and free GiB."""
    if device.type != "cuda":
        from rollwise.hardware.precision import cpu_model

        return {"device/type": "cpu", "device/name": cpu_model() or "cpu"}
    free, total = torch.cuda.mem_get_info(device)
    return {
        "device/type": "cuda",
        "device/index": device.index or 0,
        "device/name": torch.cuda.get_device_name(device),
        "device/memory_gib": round(total / GIB, 2),
        "device/free_gib": round(free / GIB, 2),
        "device/capability": ".".join(map(str, torch.cuda.get_device_capability(device))),
    }


def summary(info: dict) -> str:
    """One log line from ``describe``'s facts."""
    if info.get("device/type") == "cuda":
        return (
            f"device: cuda:{info['device/index']} {info['device/name']} ({info['device/memory_gib']:.1f} GiB, "
            f"{info['device/free_gib']:.1f} GiB free, compute capability {info['device/capability']})"
        )
    return f"device: cpu ({info.get('device/name', 'cpu')})"


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes a training run holds on its device before activations (see the module docstring)."""

    weights: int
    gradients: int
    optimizer: int
    reference: int
    engine: int  # a colocated vLLM engine's reservation
    generation: int = 0  # FSDP: the sampler's whole copy of the weights
    shards: int = 1  # FSDP ranks the weights, gradients and moments are divided over

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.reference + self.engine + self.generation

    def explain(self) -> str:
        per = f" (1/{self.shards})" if self.shards > 1 else ""
        parts = [
            ("weights" + per, self.weights),
            ("gradients" + per, self.gradients),
            ("AdamW moments (fp32)" + per, self.optimizer),
            ("reference copy", self.reference),
            ("generation copy", self.generation),
            ("colocated vLLM", self.engine),
        ]
        return " + ".join(f"{name} {b / GIB:.2f}" for name, b in parts if b) + f" = {self.total / GIB:.2f} GiB"


def training_memory(
    n_params: int,
    trainable: int,
    dtype_bytes: int,
    reference: bool,
    engine_share: float = 0.0,
    device_bytes: int = 0,
    shards: int = 1,
) -> MemoryPlan:
    """The arithmetic: ``n_params`` weights of ``dtype_bytes`` each, ``trainable`` of them with a
    gradient (same dtype) and two fp32 AdamW moments, a frozen reference copy when ``reference``,
    and ``engine_share`` of ``device_bytes`` for a colocated engine. With ``shards = W > 1`` (FSDP)
    weights, gradients and moments are ``ceil(count / W)`` per rank, plus a whole generation copy."""
    per = -(-n_params // shards)
    per_trainable = -(-trainable // shards)
    return MemoryPlan(
        weights=per * dtype_bytes,
        gradients=per_trainable * dtype_bytes,
        optimizer=per_trainable * 8,
        reference=n_params * dtype_bytes if reference else 0,
        engine=int(engine_share * device_bytes),
        generation=n_params * dtype_bytes if shards > 1 else 0,
        shards=shards,
    )


def check_fits(plan: MemoryPlan, device_bytes: int, where: str) -> None:
    """Refuse, with the arithmetic, a plan that leaves less than ``HEADROOM`` of ``device_bytes``."""
    budget = int(device_bytes * (1 - HEADROOM))
    if plan.total > budget:
        raise UserError(
            f"the model does not fit {where}: {plan.explain()} needed before activations, but {device_bytes / GIB:.2f} "
            f"GiB x {1 - HEADROOM:.2f} (headroom for activations) = {budget / GIB:.2f} GiB is available. Use "
            "model.lora.enabled = true (gradients and moments for the adapters only), model.dtype = 'bfloat16', "
            "reward.kl.coef = 0 (no reference copy), a smaller vllm.gpu_memory_utilization, train.fsdp = true "
            "under torchrun (weights, gradients and moments sharded across the ranks), or a larger device"
        )


def check_model_fits(
    model,
    device: torch.device,
    dtype_bytes: int,
    lora: bool,
    reference: bool,
    engine_share: float = 0.0,
    shards: int = 1,
) -> MemoryPlan | None:
    """``training_memory`` of a loaded (CPU) ``model`` against ``device``'s memory, before it moves
    there; None on CPU (host memory is not checked). With ``lora`` the adapters' gradients and
    moments are left out (well under 1% of the weights); ``shards``: FSDP ranks (``train.fsdp``)."""
    if device.type != "cuda":
        return None
    n = sum(p.numel() for p in model.parameters())
    total = torch.cuda.get_device_properties(device).total_memory
    plan = training_memory(n, 0 if lora else n, dtype_bytes, reference, engine_share, total, shards)
    check_fits(plan, total, f"{device} ({torch.cuda.get_device_name(device)})")
    return plan


def keep_logits_bytes(device: torch.device, free_bytes: int | None = None) -> int:
    """The budget of fp32 completion log-probs a training micro-batch keeps for its backward
    (``trainer/head.py``): 512 MiB on CPU; on CUDA a quarter of the free memory, at most 8 GiB."""
    if device.type != "cuda":
        return CPU_KEEP_LOGITS_BYTES
    if free_bytes is None:
        free_bytes = torch.cuda.mem_get_info(device)[0]
    return int(min(CUDA_KEEP_LOGITS_MAX, CUDA_KEEP_LOGITS_SHARE * free_bytes))


def peak_memory(device: torch.device) -> dict:
    """Peak allocated GiB since the last call (CUDA; resets the counter), for the per-step ledger line."""
    if device.type != "cuda":
        return {}
    peak = torch.cuda.max_memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    return {"device/peak_memory_gib": round(peak / GIB, 3)}


def activation_bytes(hidden: int, layers: int, rows: int, tokens: int, elem_bytes: int, checkpointing: bool) -> int:
    """Estimated bytes of activations a training pass of ``rows`` x ``tokens`` keeps for its backward:
    ``ACTIVATION_FLOATS * hidden`` values a token in each of ``layers`` decoder layers, or, with
    activation checkpointing, each layer's input (``hidden`` values) plus one layer's worth."""
    layer = ACTIVATION_FLOATS * hidden
    per_token = layers * hidden + layer if checkpointing else layers * layer
    return rows * tokens * per_token * elem_bytes


def available_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes; None where there is none (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_activations(
    model, device: torch.device, rows: int, tokens: int, elem_bytes: int, checkpointing: bool, available: int | None
) -> None:
    """Refuse, naming the keys, a CPU training pass whose estimated activations (``activation_bytes``)
    exceed ``ACTIVATION_SHARE`` of ``available`` bytes: out of host memory, the kernel kills the run
    without a word. Nothing is checked on CUDA (an out-of-memory error is raised there), for a model
    without ``hidden_size`` / ``num_hidden_layers`` in its config, or when ``available`` is None."""
    config = getattr(model, "config", None)
    hidden, layers = getattr(config, "hidden_size", None), getattr(config, "num_hidden_layers", None)
    if device.type != "cpu" or available is None or not hidden or not layers:
        return
    need = activation_bytes(hidden, layers, rows, tokens, elem_bytes, checkpointing)
    if need > ACTIVATION_SHARE * available:
        fix = "lower train.micro_batch" + ("" if checkpointing else ", or set train.activation_checkpointing = true")
        raise UserError(
            f"a training pass of {rows} rows x {tokens} tokens keeps about {need / GIB:.1f} GiB of activations for "
            f"its backward ({layers} layers x {hidden} hidden x {ACTIVATION_FLOATS} values a token, estimated), but "
            f"{available / GIB:.1f} GiB of memory was available when training began: {fix} (train.micro_batch = "
            f"{rows} rows a pass here)"
        )
