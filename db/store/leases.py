"""Leases: which process holds a run, so that `--resume`, a pool's workers and Ray's retries never run one run twice.

A holder renews its lease while it runs (`harness.execution.recorder`); a lease passes on when it has expired or its
holder is known to be gone.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update

from db.models import Run, utcnow
from db.store.base import Transactions
from db.stored import require_intact


def _aware(moment: datetime | None) -> datetime | None:
    """SQLite hands timezone-aware columns back naive; they were written in UTC."""
    return moment.replace(tzinfo=UTC) if moment is not None and moment.tzinfo is None else moment


class Leases(Transactions):
    """Taking, reading and releasing a run's lease (`runs.lease_owner`, `runs.lease_until`)."""

    def take_lease(self, run_id: int, owner: str, seconds: float, lapsed: Callable[[str], bool]) -> str | None:
        """Hold run `run_id` for `owner` for `seconds`; returns None, or the other owner holding it.

        A lease passes to a new owner when it has expired or `lapsed(holder)` says its holder is gone
        (a killed process on this machine). Done in one write transaction, so two processes racing for
        one run cannot both win.
        """
        now = utcnow()
        with self._write() as session:
            run = session.get(Run, run_id, with_for_update=True)
            if run is None:
                raise KeyError(f"no run {run_id}")
            holder, until = run.lease_owner, _aware(run.lease_until)
            if holder and holder != owner and until is not None and until > now and not lapsed(holder):
                return holder
            run.lease_owner, run.lease_until = owner, now + timedelta(seconds=seconds)
        return None

    def lease_holder(self, run_id: int, lapsed: Callable[[str], bool]) -> str | None:
        """Who holds run `run_id` now (an unexpired lease whose holder is not `lapsed`), or None; DamagedRun when
        the run holds a damaged value."""
        require_intact(self.engine, run_id)
        with self._read() as session:
            row = session.execute(select(Run.lease_owner, Run.lease_until).where(Run.id == run_id)).first()
        if row is None:
            return None
        holder, until = row[0], _aware(row[1])
        if not holder or until is None or until <= utcnow() or lapsed(holder):
            return None
        return holder

    def release_lease(self, run_id: int, owner: str) -> None:
        with self._write() as session:
            session.execute(
                update(Run).where(Run.id == run_id, Run.lease_owner == owner).values(lease_owner=None, lease_until=None)
            )
