"""How many threads torch computes with: one decision for the engine, the CLI and each Ray worker.

torch's CPU pool splits every op over all its threads, and threads that finish first spin until the
others catch up; when another process holds one of the cores, they wait for a thread that is not
running. Measured on the 2-core machine (docs/benchmarks.md, "Threads and a busy machine"): idle, a
second thread gives a Qwen3-shaped model nothing at batch 1 at any width and helps only batched decoding,
so there is no size where threads start to pay; what decides is the rest of the machine. One thread per
run lets the local executor run a run per core, the default job's fastest way through, and a run of one
thread slows less beside busy processes than a run of two. So the count is, in this order:

- `--threads N` (the CLI passes it as `requested`), else LOOPEVAL_THREADS;
- one thread for models below `SMALL_MODEL_PARAMS` parameters: the bundled tiny and zoo models (up to
  1.2M), which run many to a sweep;
- else every core this process may use (its CPU affinity), never more: a real model (Qwen3-0.6B and
  up) runs one at a time on a machine, with its memory.

A Ray task computes with the CPUs Ray gave it (harness.execution.ray_executor), so runs that share a node
never ask for more cores than it has. `apply` also sets OMP_NUM_THREADS and MKL_NUM_THREADS, which
processes started from this one read when their own OpenMP runtime starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from adapters.base import AdapterError

ENV_VAR = "LOOPEVAL_THREADS"
SMALL_MODEL_PARAMS = 50_000_000  # between the bundled models (1.2M at most) and the smallest public one (0.6B)
MAX_THREADS = 1024
_applied: Threads | None = None


@dataclass(frozen=True)
class Threads:
    """A thread count and why it was chosen (stored with each run, shown once at the start)."""

    count: int
    reason: str

    def __str__(self) -> str:
        return f"{self.count} thread{'' if self.count == 1 else 's'} ({self.reason})"

    def to_dict(self) -> dict[str, int | str]:
        return {"count": self.count, "reason": self.reason}


def cores() -> int:
    """The cores this process may run on (its affinity mask: what a container or taskset allows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def check_count(value: object, source: str) -> int:
    """`value` as a thread count, or an AdapterError naming where it came from."""
    try:
        count = int(str(value).strip())
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_THREADS:
        raise AdapterError(f"{source} must be a whole number of threads from 1 to {MAX_THREADS}, got {value!r}")
    return count


def choose(params: int | None, requested: int | None = None) -> Threads:
    """The thread count for models of up to `params` parameters (None: unknown, treated as large)."""
    available = cores()
    for given, source in ((requested, "--threads"), (os.environ.get(ENV_VAR), ENV_VAR)):
        if given is not None:
            count = check_count(given, source)
            if count > available:
                return Threads(available, f"{source} {count}, capped at the {available} cores this process may use")
            return Threads(count, source)
    if params is not None and params < SMALL_MODEL_PARAMS:
        return Threads(
            1,
            f"a model under {SMALL_MODEL_PARAMS // 1_000_000}M parameters: one run per core; "
            f"--threads or {ENV_VAR} to change",
        )
    return Threads(available, "the cores this process may use")


def apply(threads: Threads) -> Threads:
    """Make torch (and processes started from here) compute with `threads.count` threads."""
    global _applied
    import torch

    torch.set_num_threads(threads.count)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads.count)
    _applied = threads
    return threads


def applied() -> Threads | None:
    """The count applied in this process so far (None before the first `apply`)."""
    return _applied


def ensure(params: int | None) -> Threads:
    """The applied count, deciding it from `params` first when nothing has yet: what loading a model in
    a process that chose no count (a notebook, a script) does."""
    return _applied if _applied is not None else apply(choose(params))
