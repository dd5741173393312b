"""The memory sampler on real memory: a known CPU allocation through RSS, live KV bytes from a real adapter."""

from __future__ import annotations

import time

import pytest
import torch

import adapters
from adapters import Sampling
from db.measures import PEAK_MEASURES as MEASURES
from harness.sampler import MemorySampler

MB = 1_000_000


def nvml_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return True
    except Exception:
        return False


def test_rss_sees_a_known_allocation_and_missing_sources_are_none() -> None:
    sampler = MemorySampler(interval=0.005).start()
    time.sleep(0.05)
    before = sampler.ticks[-1]["rss"]
    block = torch.ones(50_000_000, dtype=torch.float32)  # 200 MB, touched so the pages are resident
    time.sleep(0.05)
    sampler.stop()
    del block
    peaks = sampler.peaks()
    assert set(peaks) == set(MEASURES)
    grew = peaks["rss_peak"] - before
    assert 190 * MB <= grew <= 260 * MB, grew
    tagged = [t for t in sampler.ticks if t["rss"] - before >= 190 * MB]
    assert tagged, "some tick must have been taken while the tensor was alive"
    # No adapter: the accounted measures are unknown, not zero.
    assert peaks["weights_bytes"] is None and peaks["kv_bytes_peak"] is None
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: torch and NVML sources are available here")
    assert peaks["torch_allocated_peak"] is None and peaks["torch_reserved_peak"] is None
    assert all(t["torch_allocated"] is None for t in sampler.ticks)
    if not nvml_present():
        assert peaks["nvml_process_peak"] is None and peaks["nvml_device_peak"] is None
        assert all(t["nvml_process"] is None and t["nvml_device"] is None for t in sampler.ticks)
        assert "nvml" in sampler.unavailable


def test_overhead_is_measured_and_small() -> None:
    sampler = MemorySampler(interval=0.01).start()
    time.sleep(0.3)
    sampler.stop()
    overhead = sampler.overhead()
    assert overhead["ticks"] >= 10
    assert 0 < overhead["seconds_per_tick"] < 0.005
    assert 0 < overhead["busy_fraction"] < 0.2


def test_live_kv_bytes_phases_and_token_counts_from_a_real_adapter() -> None:
    adapter = adapters.load("preset:ouro-tiny", loops=2, seed=0)
    sampler = MemorySampler(adapter, interval=0.001).start()
    sampler.set_phase("task:t batch:0")
    generations = adapter.generate(["12+34="] * 4, Sampling(temperature=1.0, top_p=0.7, max_new_tokens=24, n=1, seed=0))
    sampler.add_generated_tokens(sum(g.generated_tokens for g in generations))
    sampler.stop()
    peaks = sampler.peaks()
    final = adapter.memory()
    assert peaks["weights_bytes"] == final["weights_bytes"] > 0
    assert peaks["kv_bytes_peak"] == final["kv_bytes_peak"] > 0
    assert 0 < peaks["kv_bytes_used"] <= peaks["kv_bytes_allocated"] <= peaks["kv_bytes_peak"]
    assert sampler.ticks[0]["phase"] is None and sampler.ticks[-1]["phase"] == "task:t batch:0"
    assert sampler.ticks[-1]["generated_tokens"] == sum(g.generated_tokens for g in generations)


def test_downsampled_series_keeps_every_peak_tick() -> None:
    sampler = MemorySampler(interval=0.001).start()
    blocks = []
    for _ in range(5):
        blocks.append(torch.ones(5_000_000))
        time.sleep(0.02)
    blocks.clear()
    time.sleep(0.05)
    sampler.stop()
    assert len(sampler.ticks) > 40
    series = sampler.series(max_rows=10)
    assert len(series) <= 12
    assert max(t["rss"] for t in series) == sampler.peaks()["rss_peak"]
    assert [t["t"] for t in series] == sorted(t["t"] for t in series)
