"""What the listener's writer writes to (a ``Store``: the ledger's ``Recorder``, a fake in unit tests) and
the health counters it reports there."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from offset_ledger.ledger.engine import engine_for, ensure_schema
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.records import Record, RecordOutcome

if TYPE_CHECKING:
    from offset_ledger.addresses import LedgerAddress


class Store(Protocol):
    """What the writer needs from the ledger (``Recorder`` in production, fakes in unit tests)."""

    def record(self, records: list[Record]) -> RecordOutcome: ...

    def report_health(self, listener_id: str, pipeline: str | None, host: str,
                      counters: dict[str, int], last_error: str | None) -> None: ...


@dataclass(frozen=True)
class ListenerHealth:
    """Cumulative counters of one listener (events, not rows)."""

    queued: int          # events handed to the in-memory queue
    written: int         # events durably recorded
    retried: int         # write attempts repeated after a retriable database error
    spilled: int         # events appended to the spool file because the queue was full
    failed: int          # events dead-lettered: malformed, or rejected by the ledger for good (never dropped)
    skipped: int         # events of queries with neither a pipeline nor a name
    pending: int         # events accepted but not yet settled
    last_error: str | None
    last_written_at: datetime | None
    callback_p99_ms: float | None = None  # per callback, incl. the py4j fetch of the JSON (last 1024)
    mirror: dict[str, Any] | None = None  # the Kafka consumer-group mirror's counters (commit_to_kafka)
    heartbeat: dict[str, Any] | None = None  # the driver heartbeat: period, beats written, skipped, last error
    ledger: str | None = None             # the ledger this writer records to (no user, no password)
    dead_letter_path: str | None = None   # where the failed events are, with their errors
    foreign_spool_files: int = 0          # orphans of other ledgers (or naming none) left alone, seen at start
    foreign_spool_paths: tuple[str, ...] = ()

    def counters(self) -> dict[str, int]:
        return {"queued": self.queued, "written": self.written, "retried": self.retried,
                "spilled": self.spilled, "failed": self.failed}


def open_recorder(ledger: LedgerAddress) -> Store:
    """The ledger at ``ledger`` as the writer's store, its schema brought to head (the writer's thread
    calls this on its first write, so a ledger that is down delays nothing at the listener's start)."""
    engine = engine_for(ledger)
    try:
        ensure_schema(engine)
    except Exception:
        engine.dispose()
        raise
    return Recorder(engine, owns_engine=True)
