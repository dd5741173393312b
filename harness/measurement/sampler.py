"""The memory sampler: a background thread that reads every memory source while a model generates.

Every `interval` seconds (20 ms by default) it records one tick: NVML device used memory and this
process's used memory (NVML's per-process list, matched by pid), torch CUDA allocated and reserved,
the adapter's live `kv_bytes_used` / `kv_bytes_allocated` / `kv_bytes_reserved` (the engine's KV
pool while one lives, 0 between calls), and the process RSS, tagged with the current phase
("task:addition batch:3") and the run's generated-token count so far. It also reads NVML's total-energy
counter at start and on request (`energy_joules`, the delta). A source that cannot be read
here is None in every tick and in its peak, never 0: "no GPU" must not look like "used no GPU memory".

Peaks carry the series' names (`measures`): a run's `rss` peak is the maximum of its `rss` ticks. Where
a source keeps its own exact peak (`Measure.exact`: the torch caching allocator, the adapter's
`kv_bytes_peak` of `kv_bytes_allocated` and `kv_bytes_reserved_peak`) that replaces the sampled
maximum, which could miss a spike shorter than the interval. The sampler times its own ticks, so its
overhead is reported with the run (`overhead()`).

Only torch, psutil and nvidia-ml-py are needed: `loopeval profile` uses this on machines without
lighteval or sqlalchemy.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psutil

from adapters.base import AdapterError, checked_memory, hook
from measures import ADAPTER_PEAKS, ADAPTER_SERIES, PEAK_MEASURES, SERIES_MEASURES, merged_peak

DEFAULT_INTERVAL = 0.02


class _Nvml:
    """NVML readings for one device: device used memory, and this process's used memory on it."""

    def __init__(self, device_index: int | None) -> None:
        import pynvml  # nvidia-ml-py; raises NVMLError (not ImportError) when no driver is present

        pynvml.nvmlInit()
        self._nvml = pynvml
        if device_index is None:
            # CUDA_VISIBLE_DEVICES renumbers devices for CUDA but not for NVML.
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
            device_index = int(visible) if visible.isdigit() else 0
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        self._pid = os.getpid()

    def read(self) -> tuple[int | None, int | None]:
        device = int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        process: int | None = None
        for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle):
            if proc.pid == self._pid:
                process = proc.usedGpuMemory  # None when the driver hides it (some containers)
                break
        else:
            # Absent from the list: truly 0 only if this process has no CUDA context yet.
            process = 0 if not _cuda_initialized() else None
        return device, None if process is None else int(process)

    def energy_millijoules(self) -> int:
        """The device's total energy since the driver loaded (Volta and newer; NVMLError elsewhere)."""
        return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))


def _cuda_initialized() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_initialized()


class Sources:
    """Every memory source this process can read, opened once: NVML, the torch CUDA allocator, the process RSS and
    the adapter's own accounting. `unavailable` says why a source cannot be read here; `failure` is set once the
    adapter's `memory()` returns what cannot be stored."""

    def __init__(self, adapter: Any | None, device_index: int | None, spec: str) -> None:
        self.adapter = adapter
        self.spec = spec  # how errors name the adapter
        self.unavailable: dict[str, str] = {}  # source -> why it could not be read
        self.failure: AdapterError | None = None  # the adapter's memory() returned what cannot be stored
        self._process = psutil.Process()
        self._nvml = self._open_nvml(device_index)
        self._cuda = self._open_cuda()

    def _open_nvml(self, device_index: int | None) -> _Nvml | None:
        try:
            return _Nvml(device_index)
        except Exception as exc:  # no driver, no GPU, library missing: every NVML reading is None
            self.unavailable["nvml"] = f"{type(exc).__name__}: {exc}"
            return None

    def _open_cuda(self) -> bool:
        try:
            import torch

            if torch.cuda.is_available():
                return True
            self.unavailable["torch_cuda"] = "torch.cuda.is_available() is False"
        except ImportError as exc:
            self.unavailable["torch_cuda"] = str(exc)
        return False

    def read(self) -> dict[str, int | None]:
        """Every SERIES_MEASURES reading now, None where unavailable."""
        readings: dict[str, int | None] = dict.fromkeys(SERIES_MEASURES)
        readings["rss"] = self._process.memory_info().rss
        if self.adapter is not None:
            accounted = self.accounted()
            for name in ADAPTER_SERIES:
                readings[name] = accounted.get(name)  # None from adapters without such accounting
        if self._cuda:
            import torch

            readings["torch_allocated"] = torch.cuda.memory_allocated()
            readings["torch_reserved"] = torch.cuda.memory_reserved()
        if self._nvml is not None:
            readings["nvml_device"], readings["nvml_process"] = self._nvml.read()
        return readings

    def accounted(self) -> dict[str, int | None]:
        """The adapter's `memory()`, checked (`adapters.base.checked_memory`). Once it returns a value that cannot
        be stored (negative, infinite, a string), it is read no more and `failure` says why: the run fails with
        that reason rather than store it."""
        if self.failure is not None or self.adapter is None:
            return {}
        try:
            return checked_memory(self.spec, hook(self.spec, "memory()", self.adapter.memory))
        except AdapterError as exc:
            self.failure = exc
            return {}

    def reset_peaks(self) -> None:
        """Reset the peaks the sources keep themselves (the adapter's, where it can, and torch's)."""
        reset = None
        if self.adapter is not None:
            reset = hook(self.spec, "reset_memory_peak", getattr, self.adapter, "reset_memory_peak", None)
        if reset is not None:
            hook(self.spec, "reset_memory_peak()", reset)
        if self._cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()

    def exact(self) -> dict[str, int | None]:
        """The values the sources keep themselves, read now, by measure: the adapter's weights and its exact KV
        peaks (`measures.ADAPTER_PEAKS`), torch's allocator peaks. None where the source does not know."""
        exact: dict[str, int | None] = {}
        if self.adapter is not None:
            accounted = self.accounted()
            exact["weights_bytes"] = accounted.get("weights_bytes")
            exact.update({measure: accounted.get(key) for key, measure in ADAPTER_PEAKS.items()})
        if self._cuda:
            import torch

            exact["torch_allocated"] = torch.cuda.max_memory_allocated()
            exact["torch_reserved"] = torch.cuda.max_memory_reserved()
        return exact

    def energy_millijoules(self) -> int | None:
        """NVML's energy counter now, None where there is none (no NVML, a GPU without the counter)."""
        if self._nvml is None:
            return None
        try:
            return self._nvml.energy_millijoules()
        except Exception as exc:  # NVMLError_NotSupported before Volta: unavailable, said once with the run
            self.unavailable["nvml_energy"] = f"{type(exc).__name__}: {exc}"
            return None


class MemorySampler:
    """Samples memory on a thread between `start()` and `stop()` (or as a context manager).

    The main thread calls `set_phase()` and `add_generated_tokens()`; both are single attribute
    writes, safe to read from the sampler thread under the GIL.
    """

    def __init__(
        self,
        adapter: Any | None = None,
        interval: float = DEFAULT_INTERVAL,
        device_index: int | None = None,
        spec: str = "the adapter",
    ) -> None:
        if interval <= 0:
            raise ValueError(f"sampler interval must be > 0 seconds, got {interval}")
        self.sources = Sources(adapter, device_index, spec)
        self.interval = interval
        self.phase: str | None = None
        self.generated_tokens = 0
        self.ticks: list[dict[str, Any]] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._t0 = 0.0
        self._wall = 0.0
        self._busy = 0.0
        self._running: dict[str, int | None] = dict.fromkeys(SERIES_MEASURES)  # sampled maxima, updated every tick
        self._final: dict[str, int | None] = {}
        self._energy_began: int | None = None  # the device's energy counter at start(), millijoules

    @property
    def unavailable(self) -> dict[str, str]:
        """Source -> why it could not be read here."""
        return self.sources.unavailable

    @property
    def failure(self) -> AdapterError | None:
        """Why the adapter's memory() is read no more (it returned what cannot be stored), else None."""
        return self.sources.failure

    def read(self) -> dict[str, Any]:
        """One tick: every SERIES_MEASURES reading (None where unavailable) plus phase and token count."""
        tick: dict[str, Any] = dict.fromkeys(SERIES_MEASURES)
        tick["t"] = time.perf_counter() - self._t0
        tick["phase"] = self.phase
        tick["generated_tokens"] = self.generated_tokens
        tick.update(self.sources.read())
        return tick

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> MemorySampler:
        """Reset peaks (adapter and torch), take a first tick, and start the thread."""
        self.sources.reset_peaks()
        self._t0 = time.perf_counter()
        self._energy_began = self.sources.energy_millijoules()
        self._tick()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="loopeval-memory-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, take a last tick, and read the exact peaks the sources keep themselves."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self._tick()
        self._wall = time.perf_counter() - self._t0
        self._final = self.sources.exact()

    def __enter__(self) -> MemorySampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._tick()

    def _tick(self) -> None:
        began = time.perf_counter()
        tick = self.read()
        for series in SERIES_MEASURES:
            self._running[series] = merged_peak(series, self._running[series], tick[series])
        self.ticks.append(tick)
        self._busy += time.perf_counter() - began

    def set_phase(self, phase: str | None) -> None:
        self.phase = phase

    def add_generated_tokens(self, n: int) -> None:
        self.generated_tokens += n

    # --- results ------------------------------------------------------------------------------

    def peaks(self) -> dict[str, int | None]:
        """Every PEAK_MEASURES name -> bytes, None where the source was unavailable during the whole run: the
        source's own value where it keeps one (`Sources.exact`), else the sampled maximum.

        While the sampler runs this is the peak so far (a run's recorder stores it every second).
        """
        peaks: dict[str, int | None] = dict.fromkeys(PEAK_MEASURES)
        peaks.update(self._running)
        for measure, value in (self._final or self.sources.exact()).items():
            if value is not None:
                peaks[measure] = value
        return peaks

    def energy_joules(self) -> float | None:
        """GPU energy since `start()` (the device's, so other processes on it count too), None where unavailable:
        'no counter' must not read as 'used no energy'."""
        now = None if self._energy_began is None else self.sources.energy_millijoules()
        return None if now is None or self._energy_began is None else (now - self._energy_began) / 1000

    def overhead(self) -> dict[str, float]:
        """The sampler's own cost: ticks taken, mean seconds per tick, and busy time over wall time."""
        wall = self._wall or (time.perf_counter() - self._t0)
        n = len(self.ticks)
        return {
            "ticks": float(n),
            "seconds_per_tick": self._busy / n if n else 0.0,
            "busy_fraction": self._busy / wall if wall > 0 else 0.0,
            "wall_seconds": wall,
        }

    def series(self, start: int = 0, end: int | None = None, max_rows: int | None = None) -> list[dict[str, Any]]:
        """The ticks `start:end`, evenly thinned to about `max_rows` (None: all), always keeping each
        series' peak tick, so stored traces stay small while their maxima stay exact."""
        return thinned(self.ticks[start:end], max_rows)


def thinned(ticks: list[dict[str, Any]], max_rows: int | None) -> list[dict[str, Any]]:
    """`ticks` evenly thinned to about `max_rows` (None: all), each series' peak tick kept."""
    if max_rows is None or len(ticks) <= max_rows:
        return ticks
    step = len(ticks) / max_rows
    keep = {int(i * step) for i in range(max_rows)} | {len(ticks) - 1}
    for series in SERIES_MEASURES:
        values = [(tick[series], i) for i, tick in enumerate(ticks) if tick[series] is not None]
        if values:
            keep.add(max(values)[1])
    return [ticks[i] for i in sorted(keep)]
