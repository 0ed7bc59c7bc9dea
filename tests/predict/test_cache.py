"""The predictor's model of a cache: a matrix product's re-read of what the step touched last, the last-level cache
read from a sysfs tree laid out as Linux lays it out, and a calibration that keeps the cache it was fitted with."""
from __future__ import annotations

import os
from pathlib import Path
from typing import List

import pytest
import torch

pytest.importorskip("torch.distributed._tools.mem_tracker", reason="the predictor needs torch >= 2.5 (MemTracker)")

from mtbench.data.synthetic import Synthetic  # noqa: E402
from mtbench.device.caches import cpu_last_level_cache_bytes  # noqa: E402
from mtbench.predict import cache_model, calibration  # noqa: E402
from mtbench.predict.trace import trace_step  # noqa: E402
from mtbench.workload.base import SetupContext, Workload  # noqa: E402

POSITIONS, WIDTH = 8, 64
WEIGHT_BYTES = WIDTH * WIDTH * 4


def test_recent_reads_hold_the_last_bytes_touched_and_drop_the_oldest():
    cache = cache_model.RecentReads(3 * 4096)
    a, b, c, d = (torch.empty(1024) for _ in range(4))  # 4 KiB each
    assert cache.touch([a, b, c]) == 0
    assert cache.touch([a]) == 4096  # still held; now the most recent
    assert cache.touch([d]) == 0  # b, the least recent, goes
    assert cache.touch([b]) == 0
    assert cache_model.RecentReads(0).touch([a, a]) == 0  # no cache: nothing is read from it


def test_a_tensor_is_its_storage_offset_and_size_and_a_freed_storage_is_no_hit():
    cache = cache_model.RecentReads(1 << 30)
    w, x = torch.randn(64, 32), torch.randn(8, 64)
    cache.touch([w, x[0]])
    assert cache.touch([w.t()]) == w.numel() * 4  # a weight and its transpose: the same bytes
    assert cache.touch([x[1]]) == 0 and cache.touch([x[0]]) == 64 * 4  # two rows of one batch: two tensors
    # a freed storage's address may be taken by the next allocation (the allocator's free list; whether it is
    # depends on malloc, so the reuse is made certain here: the held entry is given the new storage's key)
    t = torch.randn(256, 256)
    cache.touch([t])
    held_key = next(reversed(cache.held))
    del t
    fresh = torch.randn(256, 256)
    fresh_key = (fresh.untyped_storage()._cdata, 0, fresh.numel())
    cache.held[fresh_key] = cache.held.pop(held_key)  # as if fresh's storage sat at the freed one's address
    assert cache.held[fresh_key][1]() is None  # the freed storage is gone
    assert cache.touch([fresh]) == 0
    assert cache.touch([fresh]) == fresh.numel() * 4  # now held, alive: a hit


class Decoder(Workload):
    """One weight multiplied at every position, as a decoder run one position at a time does."""

    def __init__(self) -> None:
        self.net = torch.nn.Linear(WIDTH, WIDTH, bias=False)

    def setup(self, ctx: SetupContext) -> None:
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.1)
        self.x = torch.randn(POSITIONS, 1, WIDTH)

    def step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        sum(self.net(self.x[i]) for i in range(POSITIONS)).sum().backward()
        self.optimizer.step()

    def modules(self) -> List[torch.nn.Module]:
        return [self.net]


def test_a_weight_read_again_within_the_cache_counts_once():
    ctx = SetupContext(device=torch.device("cpu"), batch_size=1, data=Synthetic(), seed=0, batches=1)
    none, small, large = (trace_step(Decoder, ctx, cache_bytes=size) for size in (0, 1024, 1 << 20))
    matmul = [t.op_classes["matmul"] for t in (none, small, large)]
    assert 0 <= matmul[0]["bytes"] - matmul[1]["bytes"] < WEIGHT_BYTES  # smaller than the weight: never holds it
    assert matmul[0]["bytes"] - matmul[2]["bytes"] >= (POSITIONS - 1) * WEIGHT_BYTES  # the forward's re-reads
    assert matmul[0]["flops"] == matmul[2]["flops"] and matmul[0]["ops"] == matmul[2]["ops"]
    assert none.bytes_moved == large.bytes_moved  # the step's traffic figure is every byte, as before


def test_an_in_place_ops_write_of_what_it_has_just_read_is_no_hit():
    cache, t = cache_model.RecentReads(1 << 20), torch.randn(32, 32)
    assert cache.touch([t, 0.9, t]) == 0  # mul_: read and written back, held by no earlier op
    assert cache.touch([t, 0.9, t]) == t.numel() * 4  # the next op on it: held, one hit


class Momentum(Decoder):
    """The same layer under SGD with momentum: the update reads the momentum buffer, then the parameter, again."""

    def setup(self, ctx: SetupContext) -> None:
        super().setup(ctx)
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9, foreach=False)


def test_an_update_re_reading_its_parameter_and_state_within_the_cache_counts_them_once():
    ctx = SetupContext(device=torch.device("cpu"), batch_size=1, data=Synthetic(), seed=0, batches=1)
    none, small, large = (trace_step(Momentum, ctx, cache_bytes=size) for size in (0, 1024, 1 << 20))
    update = [t.op_classes["optimizer"] for t in (none, small, large)]
    assert update[0]["bytes"] == update[1]["bytes"]  # smaller than the weight: never holds it
    # the buffer's mul_ then add_ (the buffer again, and the gradient the backward wrote), the parameter's add_ (the
    # buffer again): at least three of the weight's sizes read again
    assert update[0]["bytes"] - update[2]["bytes"] >= 3 * WEIGHT_BYTES
    assert update[0]["ops"] == update[2]["ops"] and none.bytes_moved == large.bytes_moved


def _index(root: Path, n: int, level: int, kind: str, size: str) -> None:
    folder = root / f"index{n}"
    folder.mkdir(parents=True)
    for name, value in (("level", str(level)), ("type", kind), ("size", size)):
        (folder / name).write_text(value + "\n")


def test_the_last_level_cache_is_the_largest_data_or_unified_one_in_sysfs(tmp_path: Path):
    # /sys/devices/system/cpu/cpu0/cache of an AMD EPYC VM: L1d, L1i, L2, L3
    for n, (level, kind, size) in enumerate([(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"),
                                             (3, "Unified", "32768K")]):
        _index(tmp_path, n, level, kind, size)
    assert cpu_last_level_cache_bytes(str(tmp_path)) == 32 << 20
    # an instruction cache never counts; a planted link is not read (regular_files refuses it)
    _index(tmp_path, 4, 4, "Instruction", "1G")
    _index(tmp_path, 5, 4, "Unified", "16K")
    os.remove(tmp_path / "index5" / "size")
    os.symlink(tmp_path / "elsewhere", tmp_path / "index5" / "size")
    (tmp_path / "elsewhere").write_text("512M\n")
    assert cpu_last_level_cache_bytes(str(tmp_path)) == 32 << 20
    assert cpu_last_level_cache_bytes(str(tmp_path / "missing")) is None


def test_a_prediction_traces_with_the_cache_its_calibration_was_fitted_with(tmp_path: Path, monkeypatch):
    from mtbench.predict.predictor import Predictor

    monkeypatch.setenv(calibration.ENV_DIR, str(tmp_path))
    assert Predictor(target_name="none", device="cpu").calibration is None
    here = Predictor(target_name="none", device="cpu").cache_bytes  # this host's (0 where sysfs has none)
    cal = calibration.Calibration(key="none-cpu", target="none", device_type="cpu", device_name="x", source="s",
                                  runs=2, created="2026-12-03T00:00:00Z", cache_bytes=3 << 20)
    calibration.save(cal)
    assert Predictor(target_name="none", device="cpu").cache_bytes == 3 << 20
    assert Predictor(target_name="none", device="cpu", stored_calibration=False).cache_bytes == here
    cal.cache_bytes = None  # a calibration made before the cache was modelled was fitted without one
    calibration.save(cal)
    assert Predictor(target_name="none", device="cpu").cache_bytes == 0
