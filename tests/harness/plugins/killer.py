"""A test adapter plugin (prefix `killer`): an engine preset that kills its own process with SIGKILL at
a chosen point of a run, so tests can check what a `kill -9` leaves behind and what `--resume` makes of it.

`LOOPEVAL_KILL_AT` picks the point: `load` (the run's first describe() after planning), `generate:N`
(as the N-th generate call starts), `scoring` (the first memory reading after the last generate call
of the run returned, while LightEval scores). Unset: it never kills. The prefix `killer-workload`
takes whole workloads (`generate_requests`, two sequences at a time) and also dies at `finished:N`,
as the N-th group of finished samples arrives, before the bridge stores it. Each generate call sleeps
`LOOPEVAL_KILL_DELAY` seconds first (default `DELAY`), so a run lasts long enough for its recorder to
write some of its trace before the kill.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import adapters
from harness.execution.recorder import FLUSH_SECONDS

KILL_AT = os.environ.get("LOOPEVAL_KILL_AT", "")
# `generate:3`, the earliest kill after which a test expects stored timings, comes after two delays: 1.5 flush
# periods, so the recorder's first flush (one period in) has half a period to land even on a busy machine
# (at two delays of exactly one period, a flush slowed by a second job beside the tests lost the race).
DELAY = float(os.environ.get("LOOPEVAL_KILL_DELAY", str(0.75 * FLUSH_SECONDS)))
BATCHES = int(os.environ.get("LOOPEVAL_KILL_BATCHES", "0"))  # generate calls in one run, for `scoring`


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class Killer:
    """Delegates to an engine adapter; counts calls and dies where LOOPEVAL_KILL_AT says."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.spec = inner.spec.replace("preset:", "killer:")
        self.tokenizer, self.max_context = inner.tokenizer, inner.max_context
        self.describes = self.generates = 0
        self.generated_all = False  # the run's last generate call has returned: LightEval is scoring

    @property
    def loops(self) -> int:
        return self.inner.loops

    @loops.setter
    def loops(self, value: int) -> None:
        self.inner.loops = value
        self.generates, self.generated_all = 0, False

    def describe(self) -> dict[str, Any]:
        self.describes += 1
        if KILL_AT == "load" and self.describes == 2:
            _die()
        return self.inner.describe()

    def generate(self, prompts: Any, sampling: Any) -> Any:
        self.generates += 1
        if KILL_AT == f"generate:{self.generates}":
            _die()
        time.sleep(DELAY)
        generations = self.inner.generate(prompts, sampling)
        self.generated_all = self.generates == BATCHES
        return generations

    def memory(self) -> dict[str, int | None]:
        if KILL_AT == "scoring" and self.generated_all:
            _die()
        return self.inner.memory()

    def forward_logits(self, input_ids: Any) -> Any:
        return self.inner.forward_logits(input_ids)

    def reset_memory_peak(self) -> None:
        self.inner.reset_memory_peak()


@adapters.register("killer", "an engine preset that kills its own process at LOOPEVAL_KILL_AT (tests only)")
def load_killer(name: str, **overrides: Any) -> Killer:
    return Killer(adapters.load(f"preset:{name}", **overrides))


class WorkloadKiller(Killer):
    """A Killer that takes whole workloads, as the engine does, and counts groups of finished samples."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.spec = inner.spec.replace("preset:", "killer-workload:")
        self.groups = 0

    def generate_requests(self, requests: Any, on_finished: Any) -> None:
        def counted(done: Any) -> None:
            self.groups += 1
            if KILL_AT == f"finished:{self.groups}":
                _die()
            time.sleep(DELAY / 4)
            on_finished(done)

        self.inner.generate_requests(requests, counted)


@adapters.register(
    "killer-workload", "an engine preset taking whole workloads that kills its process at LOOPEVAL_KILL_AT (tests only)"
)
def load_workload_killer(name: str, **overrides: Any) -> WorkloadKiller:
    return WorkloadKiller(adapters.load(f"preset:{name}", **{"max_batch": 2, **overrides}))
