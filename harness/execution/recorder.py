"""A run's record: its `runs` row, then its measurements as they happen (kill -9 loses at most the last second).

`run_row` is the one way a run of any kind (eval, probe, profile) starts its row: the facts every
kind shares, each run's package versions and host among them; what is particular to a kind (samples,
probe values, profile points) is stored after it under the run's id.

Samples are committed as they finish (the bridge's sink); this thread does the same for the rest,
once per `FLUSH_SECONDS`: the memory ticks taken since the last flush (thinned to `ROWS_PER_FLUSH`,
each series' peak kept), the peaks so far merged with those already stored (a resumed run keeps its
earlier stretches'), the wall and generate times so far, and the run's lease. The lease says which
process runs the run; a second process that tries to resume it is refused while the lease holds,
and a killed holder's lease passes on at once when it lived on this machine, else when it expires.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from adapters.threads import applied
from db.record import PlannedRun
from harness.errors import UserError

if TYPE_CHECKING:
    from db.store import Store
    from harness.measurement.sampler import MemorySampler

FLUSH_SECONDS = 1.0
LEASE_SECONDS = 30.0  # how long a holder that stopped renewing (a lost machine) keeps its run
ROWS_PER_FLUSH = 8  # memory rows stored per flush: a few per second, whatever the sampling interval


def package_versions() -> dict[str, str]:
    """The versions a run is stored with; read once per process (importlib.metadata parses every package's
    metadata file, and a sweep stores dozens of runs)."""
    return dict(_package_versions())


@functools.cache
def _package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in ("loopeval", "torch", "transformers", "lighteval", "sqlalchemy", "alembic", "nvidia-ml-py", "psutil"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def host_info() -> dict[str, Any]:
    """Where the run happened: host, CPU, memory, and the GPU (from torch, else NVML) if any."""
    import psutil

    threads = applied()
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "gpu": None,
        "threads": None if threads is None else threads.to_dict(),
    }
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            info["gpu"] = {"name": props.name, "memory_bytes": props.total_memory, "cuda": torch.version.cuda}
    except ImportError:
        pass
    return info


def new_sweep_id() -> str:
    """The id that groups a sweep's runs (all seeds of a sweep file, all Ray tasks of one submission)."""
    return uuid.uuid4().hex[:12]


def run_row(
    kind: str, run: PlannedRun, *, model_config: Mapping[str, Any] | None = None, status: str = "running"
) -> dict[str, Any]:
    """The `runs` row a run of any kind starts as, for `Store.create_run(s)`: what was run (`run`'s columns), how,
    where and with what.

    `run.spec` holds what else the kind needs to read the run back (an eval run's RunSpec, which `--resume`
    rebuilds with the sampling stored beside it; a profile's settings); `run.sampling` is empty for a run that sampled
    nothing (a probe). A run without a sweep (a probe, a profile) gets a sweep id of its own.
    """
    return {
        **run.columns(),
        "sweep_id": run.sweep_id or new_sweep_id(),
        "kind": kind,
        "adapter": run.model.partition(":")[0],
        "model_config": dict(model_config or {}),
        "versions": package_versions(),
        "host": host_info(),
        "status": status,
    }


class RunBusy(UserError):
    """The run is leased to another live process."""


def lease_owner() -> str:
    """This process, as a lease holder: host, pid and a token (pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def holder_is_gone(holder: str) -> bool:
    """Whether a lease holder was a process of this machine that no longer exists (killed or crashed)."""
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class RunRecorder:
    """Writes one run's memory trace, peaks, timings and lease every second on a thread; `stop()` writes the last."""

    def __init__(
        self, store: Store, run_id: int, sampler: MemorySampler, timed: Any, previous: Any | None = None
    ) -> None:
        self.store, self.run_id, self.sampler, self.timed = store, run_id, sampler, timed
        self.owner = lease_owner()
        self._offset = (previous.wall_seconds or 0.0) if previous is not None else 0.0  # seconds of earlier stretches
        self._generate = (previous.generate_seconds or 0.0) if previous is not None else 0.0
        self._energy = (
            previous.energy_joules if previous is not None else None
        )  # joules of earlier stretches (None: unknown)
        self._written = 0  # ticks already stored
        self._began = time.perf_counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        """Take the run's lease; UserError when another live process holds it."""
        holder = self.store.take_lease(self.run_id, self.owner, LEASE_SECONDS, holder_is_gone)
        if holder is not None:
            raise RunBusy(f"run {self.run_id} is being run by {holder}; two processes never run one run at once")

    def start(self) -> RunRecorder:
        self._began = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, name="loopeval-run-recorder", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and write what is left; the lease stays held until `release`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.flush()

    def release(self) -> None:
        """Let the run go: after its final status is stored, so a process waiting for it (a second `--resume` of
        the sweep) or taking it over never sees it unheld and still "running"."""
        self.store.release_lease(self.run_id, self.owner)

    @property
    def wall_seconds(self) -> float:
        return self._offset + time.perf_counter() - self._began

    @property
    def energy_joules(self) -> float | None:
        """GPU energy of the run so far, its earlier stretches' added; None while neither stretch could read a counter."""
        now = self.sampler.energy_joules()
        return self._energy if now is None else (self._energy or 0.0) + now

    def _loop(self) -> None:
        while not self._stop.wait(FLUSH_SECONDS):
            try:
                self.flush()
            except (
                Exception
            ):  # a store error (a full disk): `stop()` flushes again on the main thread and raises it there
                return

    def flush(self) -> None:
        """Store the ticks since the last flush, the peaks and the times so far, and renew the lease."""
        end = len(self.sampler.ticks)
        rows = self.sampler.series(self._written, end, ROWS_PER_FLUSH)
        self._written = end
        self.store.add_memory_samples(self.run_id, [{**tick, "t": tick["t"] + self._offset} for tick in rows])
        self.store.merge_memory_peaks(self.run_id, self.sampler.peaks())
        self.store.update_run(
            self.run_id,
            wall_seconds=self.wall_seconds,
            generate_seconds=self._generate + self.timed.generate_seconds,
            energy_joules=self.energy_joules,
        )
        self.store.take_lease(self.run_id, self.owner, LEASE_SECONDS, holder_is_gone)
