"""The ``distributed`` section: Ray rollout workers and data-parallel training (``rollwise.distributed``)."""

from __future__ import annotations

from pydantic import Field

from rollwise.sections import Section


class DistributedConfig(Section):
    workers: int = Field(
        0,
        ge=0,
        description="Rollout workers as Ray actors, each with its own model.backend (0 = generate in "
        "this process, the local pool; > 0 needs pip install 'rollwise[ray]'; rollwise.distributed.ray_pool).",
    )
    address: str | None = Field(
        None,
        description="Ray cluster to join, 'host:port' or 'ray://host:port' (None = start Ray "
        "locally with this machine's CPUs).",
    )
    cpus_per_worker: int = Field(1, ge=1, description="CPUs reserved for each rollout worker (its torch threads).")
    gpus_per_worker: float = Field(
        0.0,
        ge=0.0,
        description="GPUs Ray reserves for each rollout worker (0 = none: the worker generates on its CPUs; "
        "1 = a GPU of its own, where its hf model or vLLM engine runs; a fraction shares one GPU between "
        "workers). Refused before the model loads when the cluster has fewer GPUs than workers x this.",
    )
    request_seeds: bool = Field(
        False,
        description="Seed each request's rollouts from (run.seed, policy version, prompt id, request "
        "index) and generate request by request, so results do not depend on how a plan is split "
        "across workers; always on when workers > 0 (set it with workers = 0 to compare with the "
        "local pool).",
    )
    data_parallel: bool | None = Field(
        None,
        description="Data-parallel training with torch.distributed, started by torchrun "
        "(torchrun --nproc_per_node N -m rollwise.cli train ...): every process generates and "
        "trains on a share of each step, gradients are summed, rank 0 writes the run "
        "(rollwise.distributed.data_parallel). None = on when torchrun starts more than one "
        "process (WORLD_SIZE > 1); true = refuse to run without torchrun; false = refuse to run "
        "under it.",
    )
