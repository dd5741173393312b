"""A running run's measurements, written as they happen: kill -9 loses at most the last second.

Samples are committed as they finish (the bridge's sink); this thread does the same for the rest,
once per `FLUSH_SECONDS`: the memory ticks taken since the last flush (thinned to `ROWS_PER_FLUSH`,
each series' peak kept), the peaks so far merged with those already stored (a resumed run keeps its
earlier stretches'), the wall and generate times so far, and the run's lease. The lease says which
process runs the run; a second process that tries to resume it is refused while the lease holds,
and a killed holder's lease passes on at once when it lived on this machine, else when it expires.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from harness.errors import UserError

if TYPE_CHECKING:
    from db.store import Store
    from harness.sampler import MemorySampler

FLUSH_SECONDS = 1.0
LEASE_SECONDS = 30.0  # how long a holder that stopped renewing (a lost machine) keeps its run
ROWS_PER_FLUSH = 8  # memory rows stored per flush: a few per second, whatever the sampling interval


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

    def __init__(self, store: Store, run_id: int, sampler: MemorySampler, timed: Any, previous: Any | None = None) -> None:
        self.store, self.run_id, self.sampler, self.timed = store, run_id, sampler, timed
        self.owner = lease_owner()
        self._offset = (previous.wall_seconds or 0.0) if previous is not None else 0.0  # seconds of earlier stretches
        self._generate = (previous.generate_seconds or 0.0) if previous is not None else 0.0
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
        """Stop the thread, write what is left, and release the lease."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.flush()
        self.store.release_lease(self.run_id, self.owner)

    @property
    def wall_seconds(self) -> float:
        return self._offset + time.perf_counter() - self._began

    def _loop(self) -> None:
        while not self._stop.wait(FLUSH_SECONDS):
            try:
                self.flush()
            except Exception:  # a store error (a full disk): `stop()` flushes again on the main thread and raises it there
                return

    def flush(self) -> None:
        """Store the ticks since the last flush, the peaks and the times so far, and renew the lease."""
        end = len(self.sampler.ticks)
        rows = self.sampler.series(self._written, end, ROWS_PER_FLUSH)
        self._written = end
        self.store.add_memory_samples(self.run_id, [{**tick, "t": tick["t"] + self._offset} for tick in rows])
        self.store.merge_memory_peaks(self.run_id, self.sampler.peaks())
        self.store.update_run(self.run_id, wall_seconds=self.wall_seconds,
                              generate_seconds=self._generate + self.timed.generate_seconds)
        self.store.take_lease(self.run_id, self.owner, LEASE_SECONDS, holder_is_gone)
