"""The driver's heartbeat in the ledger: ``runs.beat_at`` moved for the runs a live driver still runs.

Written by ``capture.heartbeat``'s thread on a connection of its own, one short transaction per beat.
A beat is worth nothing late: it waits at most a second for a lock (the recorder may be updating the
same ``runs`` row) and two for the statement, and a beat that cannot be written is skipped, never
queued or retried. It never revives a run: a run that ended (Spark's word) keeps its end.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import text, update
from sqlalchemy.engine import Engine

from offset_ledger.ledger.engine import engine_for
from offset_ledger.ledger.records import utc
from offset_ledger.ledger.tables import runs

if TYPE_CHECKING:
    from offset_ledger.addresses import LedgerAddress

__all__ = ["LedgerBeats", "beat_runs", "open_beats"]


def beat_runs(engine: Engine, run_ids: Sequence[str], at: datetime, every_ms: int) -> int:
    """One beat for ``run_ids`` at ``at`` (the driver's clock): the number of runs it moved."""
    if not run_ids:
        return 0
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SET LOCAL lock_timeout = '1s'"))
            conn.execute(text("SET LOCAL statement_timeout = '2s'"))
        else:  # SQLite: the writer thread may hold the file's write lock for a batch
            conn.exec_driver_sql("PRAGMA busy_timeout = 1000")
        done = conn.execute(update(runs).where(runs.c.run_id.in_(sorted(run_ids)), runs.c.terminated_at.is_(None))
                            .values(beat_at=utc(at), beat_every_ms=every_ms))
        return int(done.rowcount or 0)


class LedgerBeats:
    """The heartbeat's writer: ``beat_runs`` on a one-connection engine of its own; ``close`` disposes it."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def __call__(self, run_ids: Sequence[str], at: datetime, every_ms: int) -> int:
        return beat_runs(self._engine, run_ids, at, every_ms)

    def close(self) -> None:
        self._engine.dispose()


def open_beats(ledger: LedgerAddress) -> LedgerBeats:
    """The ledger at ``ledger`` (the listener's address, resolved once) as a heartbeat's writer."""
    return LedgerBeats(engine_for(ledger))
