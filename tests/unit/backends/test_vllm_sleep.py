"""vLLM sleep mode's staged order (rollwise.backends.vllm.SleepCycle), on an engine that records its calls."""

import pytest

from rollwise.backends.vllm import SleepCycle


class RecordingEngine:
    def __init__(self):
        self.calls = []

    def sleep(self, level):
        self.calls.append(f"sleep({level})")

    def wake_up(self, tags=None):
        self.calls.append(f"wake({','.join(tags)})")

    def collective_rpc(self, name, kwargs):
        self.calls.append(f"load({','.join(k for k, _ in kwargs['weights_iterator'])})")

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix")


def test_level_1_sleeps_after_generating_and_wakes_weights_load_kv_in_that_order():
    e = RecordingEngine()
    c = SleepCycle(e, level=1)
    c.push({"w": 1})  # the first push: the engine is awake
    c.before_generate(), c.after_generate()  # step 0's rollouts
    c.push({"w": 2})  # after the optimizer step
    assert e.calls == [
        "load(w)",
        "reset_prefix",
        "sleep(1)",
        "wake(weights)",
        "load(w)",
        "wake(kv_cache)",
        "reset_prefix",
    ]


def test_a_generation_that_finds_the_engine_asleep_wakes_it_level_1_restores_level_2_reloads():
    e = RecordingEngine()
    c = SleepCycle(e, level=1)
    c.after_generate()
    c.before_generate()  # e.g. the next step's rollouts after an evaluation: offloaded weights come back
    assert e.calls == ["sleep(1)", "wake(weights)", "wake(kv_cache)"]
    e2 = RecordingEngine()
    c2 = SleepCycle(e2, level=2, weights_source=lambda: {"current": 0})
    c2.after_generate()
    c2.before_generate()  # level 2 freed the weights: the current ones are loaded again
    assert e2.calls == ["sleep(2)", "wake(weights)", "load(current)", "wake(kv_cache)", "reset_prefix"]
    c3 = SleepCycle(RecordingEngine(), level=2)
    c3.after_generate()
    with pytest.raises(RuntimeError, match="no weight source"):
        c3.before_generate()


def test_level_0_never_sleeps():
    e = RecordingEngine()
    c = SleepCycle(e, level=0)
    c.before_generate(), c.after_generate(), c.push({"a": 1})
    assert e.calls == ["load(a)", "reset_prefix"]


def test_sleep_mode_on_a_cpu_run_is_refused_before_the_model_loads():
    import torch

    from rollwise.backends.vllm import check_device
    from rollwise.config import VllmConfig
    from rollwise.registry import UserError

    with pytest.raises(UserError, match=r"model.vllm.sleep_level = 1 needs model.device on a CUDA GPU"):
        check_device(VllmConfig(sleep_level=1), torch.device("cpu"))
    check_device(VllmConfig(sleep_level=0), torch.device("cpu"))
    check_device(VllmConfig(sleep_level=2), torch.device("cuda:0"))
