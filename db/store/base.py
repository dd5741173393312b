"""What every part of the store shares: one engine, and short transactions that hold Ctrl-C until they end.

Each call of the store is one short transaction, so a run commits samples as they finish and several processes
can share one SQLite file (db.session serialises writers with `BEGIN IMMEDIATE` and a busy timeout) or, across
machines, one Postgres database.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from db.session import display_url, session_factory


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM until the block ends, then deliver them as they came.

    Python raises KeyboardInterrupt at whatever line runs when the signal lands. Inside SQLAlchemy's
    transaction and pool bookkeeping that can leave a connection checked out with SQLite's write lock
    held, so the process's next write (storing its run as interrupted) waits on itself until the busy
    timeout and the sweep ends "database is locked" (seen in 2 of 3,000 random interrupts of a progress read).
    A block lasts one short transaction, at most the busy timeout. Only the main thread handles
    signals; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    held = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not None]  # None: set outside Python
    previous = {s: signal.signal(s, lambda signum, _frame: received.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for signum in received[:1]:  # one is enough: the handler stops the work in hand
            signal.raise_signal(signum)


class Transactions:
    """The database a store's parts share, and their two kinds of session (`_read`, `_write`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._session = session_factory(engine)

    @contextmanager
    def _read(self) -> Iterator[Session]:
        """A session for reads, with interrupts held until it is closed (`interrupts_held`)."""
        with interrupts_held(), self._session() as session:
            yield session

    @contextmanager
    def _write(self) -> Iterator[Session]:
        """One transaction, committed at the end of the block, with interrupts held until it ends."""
        with interrupts_held(), self._session.begin() as session:
            yield session

    @property
    def url(self) -> str:
        return display_url(self.engine.url)

    def close(self) -> None:
        self.engine.dispose()
