"""The write API of the results store, plus the run summary that `loopeval results` prints.

`Store` is one results database; its calls come from its parts, one job each:

- `runs.Runs`: runs stored, updated, closed and read back (with the evaluation set id, hashed once here);
- `leases.Leases`: which process holds a run (resume, pool workers, Ray retries);
- `samples.Samples`: samples committed as they are generated, then scored;
- `measurements.Measurements`: metrics, memory ticks and peaks, profile points, probe values;
- `summaries.Summaries`: one plain dict per run for `loopeval results`.

Each call is one short transaction (`base.Transactions`). The store takes and returns plain values (dicts, ints,
detached rows); harness types stay in the harness.
"""

from __future__ import annotations

from db.session import open_engine, open_existing
from db.store.leases import Leases
from db.store.measurements import Measurements
from db.store.runs import Runs
from db.store.samples import Samples
from db.store.summaries import Summaries
from db.stored import hide_damaged


class Store(Runs, Leases, Samples, Measurements, Summaries):
    """One results database. `Store.open(url)` validates, creates or migrates it first; `Store.read(url)`
    opens an existing one (for a read command, or `--resume` with `write`) and never creates anything.

    A run holding a damaged value (`db.stored`) is refused by name where one run is asked for (`get_run`,
    `sweep_runs`), left out where runs are compared (`finished_run_keys`), and hidden from every read of a
    read command's store by `hide_damaged`."""

    @classmethod
    def open(cls, url: str | None = None) -> Store:
        return cls(open_engine(url))

    @classmethod
    def read(cls, url: str | None = None, write: bool = False) -> Store:
        return cls(open_existing(url, write))

    def hide_damaged(self) -> list[str]:
        """Leave the runs holding a damaged value out of every later read (`db.stored.hide_damaged`): for a
        store that only reads. Returns one line per run left out, for the command to print."""
        return hide_damaged(self.engine)
