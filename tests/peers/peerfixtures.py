"""Fixtures that load the peers' own loss and advantage code (issue #19): verl 0.9.1 and TRL 1.16.0.

The test modules import these fixtures by name (a ``conftest.py`` here would shadow the
``conftest`` module that other test directories import helpers from).

Both are an optional extra installed by ``make test`` (``--no-deps``, plus the few import-time
dependencies: see the Makefile target ``.installed-test``). Without them every test here skips.

verl: ``import verl`` runs ``verl/__init__.py``, which imports ``verl.protocol`` and with it Ray
(and, further down, tensordict and codetiming), none of which the functions under test use. The
``verl_core`` fixture therefore

1. registers an empty package module ``verl`` whose ``__path__`` is the installed package directory,
   so ``verl.trainer.ppo.core_algos`` and the modules it imports (``verl.utils.torch_functional``,
   ``verl.utils.groupwise``, ``verl.trainer.config``, ``verl.workers.config``, ...) load from the
   installed files, unchanged, without running ``verl/__init__.py``;
2. answers imports of ``ray``, ``tensordict`` and ``codetiming`` -- only if they are not installed
   -- with inert stub modules while ``core_algos`` is imported, then removes the stubs again from
   ``sys.modules`` so nothing else in the session sees them.

The same window loads ``verl.trainer.ppo.rollout_corr_helper`` (TIS / IcePop weights), which
imports ``verl.protocol`` and so Ray. No verl function is copied, patched or wrapped: the tests
call ``core_algos.compute_*``, ``agg_loss``, ``kl_penalty``, ``compute_rewards`` and
``compute_rollout_correction_weights`` as verl's trainer does.

TRL: ``trl.trainer.grpo_trainer`` imports normally. Its loss lives in the method
``GRPOTrainer._compute_loss(self, model, inputs)``; the ``trl_loss`` fixture calls that real method
with a small stand-in for ``self`` that holds the trainer attributes the method reads (loss type,
epsilons, beta, ...) and returns the test's log-probs from ``_get_per_token_logps_and_entropies``
instead of running a model; ``trl_rloo_loss`` does the same for ``RLOOTrainer._compute_loss``.
TRL's advantage code is inline in ``_generate_and_score_completions``
(it needs generation and reward functions) and is not called here; the TRL advantage conventions
are covered by hand-worked unit tests (tests/unit/objectives/test_obj_peer_options.py).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types
from collections import defaultdict
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

_VERL_UNUSED_IMPORTS = ("ray", "tensordict", "codetiming")


class _StubFinder:
    """Meta-path finder answering only the named top-level modules (and their submodules)."""

    def __init__(self, names: set[str]):
        self.names = names

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__ = [], spec
        return module

    def exec_module(self, module):
        pass


@pytest.fixture(scope="session")
def verl_core():
    """verl 0.9.1's ``verl.trainer.ppo.core_algos`` module (skips if verl is not installed)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed (optional peer extra; `make test` installs verl==0.9.1)")
    if "verl.trainer.ppo.core_algos" in sys.modules:
        return sys.modules["verl.trainer.ppo.core_algos"]
    missing = {n for n in _VERL_UNUSED_IMPORTS if importlib.util.find_spec(n) is None}
    finder = _StubFinder(missing)
    sys.meta_path.insert(0, finder)
    if "verl" not in sys.modules:
        package = types.ModuleType("verl")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["verl"] = package
    try:
        core = importlib.import_module("verl.trainer.ppo.core_algos")
        importlib.import_module("verl.trainer.ppo.rollout_corr_helper")  # TIS / IcePop weights (imports Ray)
    finally:
        sys.meta_path.remove(finder)
        for name in [m for m in sys.modules if m.split(".")[0] in missing]:
            del sys.modules[name]
    from importlib.metadata import version

    assert version("verl") == "0.9.1", f"the parity suite is written against verl 0.9.1, found {version('verl')}"
    return core


@pytest.fixture(scope="session")
def verl_rollout_corr(verl_core):
    """verl 0.9.1's ``verl.trainer.ppo.rollout_corr_helper`` (loaded with ``core_algos``)."""
    return sys.modules["verl.trainer.ppo.rollout_corr_helper"]


@pytest.fixture(scope="session")
def verl_actor_config(verl_core):
    """``ActorConfig(**kw)`` with verl's own defaults (clip_ratio_c = 3.0, ...) for the policy losses."""
    from verl.workers.config import ActorConfig

    def make(global_batch_info: dict, **kw):
        return ActorConfig(
            strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, global_batch_info=global_batch_info, **kw
        )

    return make


@pytest.fixture(scope="session")
def trl_grpo():
    """TRL 1.16.0's ``GRPOTrainer`` class (skips if TRL is not installed)."""
    pytest.importorskip("trl", reason="trl is not installed (optional peer extra; `make test` installs trl==1.16.0)")
    from importlib.metadata import version

    assert version("trl") == "1.16.0", f"the parity suite is written against trl 1.16.0, found {version('trl')}"
    from trl.trainer.grpo_trainer import GRPOTrainer

    return GRPOTrainer


def _accelerator() -> SimpleNamespace:
    return SimpleNamespace(
        num_processes=1, gather=lambda x: x, gather_for_metrics=lambda x: x, reduce=lambda x, reduction="sum": x
    )


@pytest.fixture(scope="session")
def trl_rloo_loss(trl_grpo):
    """``trl_rloo_loss(new, old, mask, advantages, epsilon=0.2) -> loss``: TRL's real
    ``RLOOTrainer._compute_loss`` (sequence ratio ``exp(sum_t new - old)``, mean over rows)."""
    from trl.trainer.rloo_trainer import RLOOTrainer

    def run(new, old, mask, advantages, *, epsilon=0.2, epsilon_high=None):
        B, T = new.shape
        trainer = SimpleNamespace(
            _get_per_token_logps_and_entropies=lambda *a, **k: (new, torch.zeros_like(new), None),
            aux_loss_enabled=False,
            epsilon_low=epsilon,
            epsilon_high=epsilon if epsilon_high is None else epsilon_high,
            model=SimpleNamespace(training=True),
            accelerator=_accelerator(),
            _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        )
        inputs = {
            "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
            "prompt_mask": torch.ones(B, 1, dtype=torch.long),
            "completion_ids": torch.zeros(B, T, dtype=torch.long),
            "completion_mask": mask.to(new.dtype),
            "advantages": advantages,
            "old_logps": (old * mask).sum(dim=1),
        }
        return RLOOTrainer._compute_loss(trainer, None, inputs)

    return run


@pytest.fixture(scope="session")
def trl_loss(trl_grpo):
    """``trl_loss(new, old, mask, advantages, loss_type=..., **settings) -> loss``: runs TRL's real
    ``GRPOTrainer._compute_loss`` on these tensors (one process, no gradient accumulation)."""

    def run(
        new,
        old,
        mask,
        advantages,
        *,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=None,
        beta=0.0,
        ref=None,
        use_bias_correction_kl=False,
        importance_sampling_level="token",
        max_completion_length=512,
        delta=None,
    ):
        B, T = new.shape
        accelerator = _accelerator()
        trainer = SimpleNamespace(
            _get_per_token_logps_and_entropies=lambda *a, **k: (new, torch.zeros_like(new), None),
            top_entropy_quantile=1.0,
            off_policy_mask_threshold=None,
            importance_sampling_level=importance_sampling_level,
            beta=beta,
            loss_type=loss_type,
            epsilon_low=epsilon,
            epsilon_high=epsilon if epsilon_high is None else epsilon_high,
            args=SimpleNamespace(use_bias_correction_kl=use_bias_correction_kl, delta=delta, steps_per_generation=1),
            use_vllm=False,
            model=SimpleNamespace(training=True),
            current_gradient_accumulation_steps=1,
            accelerator=accelerator,
            _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
            _entropy_bonus_enabled=False,
            aux_loss_enabled=False,
            max_completion_length=max_completion_length,
        )
        inputs = {
            "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
            "prompt_mask": torch.ones(B, 1, dtype=torch.long),
            "completion_ids": torch.zeros(B, T, dtype=torch.long),
            "completion_mask": mask.to(new.dtype),
            "advantages": advantages,
            "old_per_token_logps": old,
            "num_items_in_batch": mask.sum(),
        }
        if ref is not None:
            inputs["ref_per_token_logps"] = ref
        return trl_grpo._compute_loss(trainer, None, inputs)

    return run
