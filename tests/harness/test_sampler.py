"""The memory sampler on real memory: a known CPU allocation through RSS, live KV bytes from a real adapter."""

from __future__ import annotations

import itertools
import sqlite3
import time
from pathlib import Path

import pytest
import torch

import adapters
from adapters import Sampling
from adapters.base import Request
from adapters.testing import save_tiny_qwen3
from measures import PEAK_MEASURES as MEASURES
from db.store import Store
from harness.measurement.sampler import MemorySampler

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
    grew = peaks["rss"] - before
    assert 190 * MB <= grew <= 260 * MB, grew
    tagged = [t for t in sampler.ticks if t["rss"] - before >= 190 * MB]
    assert tagged, "some tick must have been taken while the tensor was alive"
    # No adapter: the accounted measures are unknown, not zero.
    assert peaks["weights_bytes"] is None and peaks["kv_bytes_allocated"] is None
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: torch and NVML sources are available here")
    assert peaks["torch_allocated"] is None and peaks["torch_reserved"] is None
    assert all(t["torch_allocated"] is None for t in sampler.ticks)
    if not nvml_present():
        assert peaks["nvml_process"] is None and peaks["nvml_device"] is None
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
    assert (
        peaks["kv_bytes_allocated"] == final["kv_bytes_peak"] > 0
    )  # the adapter's exact peak replaces the sampled one
    assert (
        0 < peaks["kv_bytes_used"] <= max(t["kv_bytes_allocated"] for t in sampler.ticks) <= peaks["kv_bytes_allocated"]
    )
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
    assert max(t["rss"] for t in series) == sampler.peaks()["rss"]
    assert [t["t"] for t in series] == sorted(t["t"] for t in series)


def test_reserved_series_shows_each_tasks_pool_and_its_exact_peak_is_stored(tmp_path: Path) -> None:
    """Two tasks through the continuous-batching scheduler, each with its own block pool (the second
    workload is larger, so its pool is): the stored ticks show used <= allocated <= reserved, the pool
    of the task running and 0 between tasks, and the stored peak is the larger pool's bytes."""
    adapter = adapters.load("preset:ouro-tiny", loops=2, seed=0, max_batch=4, block_size=8)
    sampling = Sampling(temperature=1.0, top_p=0.7, max_new_tokens=16, n=2, seed=0)
    pools: dict[str, set[int]] = {}
    sampler = MemorySampler(adapter, interval=0.001).start()
    for task, prompts in (("small", ["1+2="]), ("large", ["1+2=", "17*3=51; 4*4=", "abcdefghij"])):
        sampler.set_phase(f"task:{task}")
        pool = pools.setdefault(task, set())
        adapter.generate_requests(
            [Request(p, sampling) for p in prompts],
            lambda done, pool=pool: pool.add(adapter.meter.live.k.nbytes + adapter.meter.live.v.nbytes),
        )  # ouro: no latent
        sampler.set_phase(None)
        time.sleep(0.05)
    sampler.stop()
    small, large = (pools[task].pop() for task in ("small", "large"))
    assert 0 < small < large

    store = Store.open(str(tmp_path / "r.sqlite"))
    run_id = store.create_run(sweep_id="s", model_spec="preset:ouro-tiny", adapter="preset", suite="synthetic")
    store.add_memory_samples(run_id, sampler.series())
    store.merge_memory_peaks(run_id, sampler.peaks())
    conn = sqlite3.connect(tmp_path / "r.sqlite")
    ticks = conn.execute(
        "SELECT phase, kv_bytes_used, kv_bytes_allocated, kv_bytes_reserved FROM memory_samples "
        "WHERE run_id = ? ORDER BY t",
        (run_id,),
    ).fetchall()
    (peak,) = conn.execute(
        "SELECT value FROM memory_peaks WHERE run_id = ? AND measure = 'kv_bytes_reserved'", (run_id,)
    ).fetchone()
    conn.close()
    assert len(ticks) == len(sampler.ticks)
    assert all(used <= allocated <= reserved for _, used, allocated, reserved in ticks)
    assert {reserved for phase, *_, reserved in ticks if phase is None} == {0}
    assert {reserved for phase, *_, reserved in ticks if phase == "task:small"} - {0} == {
        small
    }  # 0 before the pool is made
    assert {reserved for phase, *_, reserved in ticks if phase == "task:large"} - {0} == {large}
    assert [held for held, _ in itertools.groupby(reserved > 0 for *_, reserved in ticks)] == [
        False,
        True,
        False,
        True,
        False,
    ]
    assert peak == large


def test_an_adapter_without_a_reserved_reading_gives_none_not_zero(tmp_path: Path) -> None:
    adapter = adapters.load(f"transformers:{save_tiny_qwen3(tmp_path)}", device="cpu")
    with MemorySampler(adapter, interval=0.001) as sampler:
        adapter.generate(["12+34="], Sampling(temperature=0.0, max_new_tokens=8))
    assert all(tick["kv_bytes_reserved"] is None for tick in sampler.ticks)
    assert sampler.peaks()["kv_bytes_reserved"] is None and sampler.peaks()["kv_bytes_allocated"] > 0
