"""The single-process parts of data-parallel training (rollwise.distributed.data_parallel): the
shard split, the refusals (UserError naming the key), gradient buckets, the mismatch meter's
merge and the ledger that writes nothing on ranks > 0. The multi-process equivalences are in
tests/invariants/test_data_parallel.py."""

import pytest
import torch

from rollwise.config import Config, load_config
from rollwise.distributed import data_parallel as dp
from rollwise.registry import UserError

TORCHRUN = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.fixture
def torchrun_env(monkeypatch):
    for k, v in TORCHRUN.items():
        monkeypatch.setenv(k, v)


def test_shards_by_hand():
    # 5 rows on 2 ranks: 5*0//2 = 0, 5*1//2 = 2, 5*2//2 = 5 -> rows 0-1 and 2-4
    assert [list(dp.shard_bounds(5, r, 2)) for r in range(2)] == [[0, 1], [2, 3, 4]]
    # 16 rows on 2 ranks: 8 each (one-process micro-batches of 8 are exactly the shards)
    assert [list(dp.shard_bounds(16, r, 2)) for r in range(2)] == [list(range(8)), list(range(8, 16))]
    # fewer rows than ranks: 1 row on 2 ranks -> rank 0 has none (1*1//2 = 0), rank 1 has row 0
    assert [list(dp.shard_bounds(1, r, 2)) for r in range(2)] == [[], [0]]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shards_cover_every_row_once_in_order_and_differ_by_at_most_one(world):
    for n in range(0, 11):
        shards = [list(dp.shard_bounds(n, r, world)) for r in range(world)]
        assert sum(shards, []) == list(range(n))
        sizes = [len(s) for s in shards]
        assert max(sizes) - min(sizes) <= 1


def test_off_without_torchrun(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = Config()
    assert not dp.enabled(cfg)
    dp.check_config(cfg)  # nothing to refuse
    assert dp.start(cfg) is None


def test_on_under_torchrun_unless_switched_off(torchrun_env):
    assert dp.enabled(Config())
    with pytest.raises(UserError, match="distributed.data_parallel = false"):
        dp.check_config(Config.model_validate({"distributed": {"data_parallel": False}}))


def test_required_without_torchrun_is_refused(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(UserError, match=r"distributed.data_parallel = true needs torchrun.*MASTER_ADDR"):
        dp.check_config(Config.model_validate({"distributed": {"data_parallel": True}}))


@pytest.mark.parametrize(
    "section, key",
    [
        ({"distributed": {"workers": 2}}, "distributed.workers"),
        ({"model": {"backend": "vllm"}}, "model.backend"),
        ({"sampling": {"arrol": {"enabled": True}}}, "sampling.arrol.enabled"),
        ({"sampling": {"latr": {"enabled": True}}}, "sampling.latr.enabled"),
        ({"replay": {"name": "april"}}, "replay.name = 'april'"),
    ],
)
def test_refusals_name_the_key(torchrun_env, section, key):
    from rollwise.compat import check_data_parallel

    with pytest.raises(UserError) as e:
        check_data_parallel(Config.model_validate(section))
    assert key in str(e.value)


def test_load_config_refuses_before_any_model_is_loaded(torchrun_env):
    with pytest.raises(UserError, match="distributed.workers"):
        load_config(overrides=["distributed.workers=1"])


def test_buckets_split_by_size_and_dtype(monkeypatch):
    monkeypatch.setattr(dp, "BUCKET", 6)
    a, b, c = torch.zeros(3), torch.zeros(3), torch.zeros(3)
    # 3 + 3 = 6 fits; the third would make 9 > 6
    assert [[id(t) for t in bk] for bk in dp._buckets([a, b, c])] == [[id(a), id(b)], [id(c)]]
    big, d = torch.zeros(10), torch.zeros(2, dtype=torch.float64)
    # a tensor larger than a bucket is a bucket of its own; a dtype change starts a new bucket
    assert [[id(t) for t in bk] for bk in dp._buckets([a, big, d])] == [[id(a)], [id(big)], [id(d)]]


def test_unflatten_writes_back_in_place():
    a, b = torch.zeros(2, 2), torch.zeros(3)
    dp._unflatten(torch.arange(7.0), [a, b])
    assert a.tolist() == [[0.0, 1.0], [2.0, 3.0]] and b.tolist() == [4.0, 5.0, 6.0]


def test_mismatch_meters_merge_sums_and_max():
    from rollwise.trainer.mismatch import MismatchMeter

    m1, m2 = MismatchMeter(), MismatchMeter()
    # rank 0: d = 0.5 on 2 tokens; rank 1: d = -1.0 on 1 token
    m1.add(torch.tensor([[0.5, 0.5]]), torch.zeros(1, 2), torch.ones(1, 2))
    m2.add(torch.tensor([[-1.0]]), torch.zeros(1, 1), torch.ones(1, 1))
    got = MismatchMeter.merge([m1, m2]).metrics()
    # |d| mean (0.5 + 0.5 + 1) / 3; max 1; k3 = exp(d) - 1 - d summed over the three tokens / 3
    k3 = (2 * (torch.exp(torch.tensor(0.5)) - 1.5) + (torch.exp(torch.tensor(-1.0)) - 1 + 1)).item() / 3
    assert got["mismatch/abs_mean"] == pytest.approx(2 / 3)
    assert got["mismatch/abs_max"] == 1.0
    assert got["mismatch/k3_kl"] == pytest.approx(k3, rel=1e-6)


def test_a_ledger_that_does_not_write_keeps_totals(tmp_path):
    from rollwise.generate.common import StepCost
    from rollwise.ledger import Ledger

    led = Ledger(tmp_path, write=False)
    line = led.record(0, 1, StepCost(generated_tokens=7, rollouts=2), 5, {"train/loss": 0.5})
    led.record_eval(1, {"eval/pass@1": 0.25})
    led.truncate(0)
    led.plot()
    assert line["cost/generated_tokens"] == 7 and led.totals["trained_tokens"] == 5
    assert list(tmp_path.iterdir()) == []
