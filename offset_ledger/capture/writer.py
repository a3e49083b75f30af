"""The listener's durable writer: a bounded queue, one writer thread, retries, health counters.

Callbacks hand events to :class:`EventWriter` and return. A single writer thread parses events
(``offset_ledger.rules.progress``) and writes them in batches, one transaction per batch of events,
through ``offset_ledger.ledger.recorder``. While the database is down it retries with exponential
backoff; callbacks keep filling the queue, then the spool (``offset_ledger.capture.spool``), and the writer
replays the spool, in order, once the database answers again.
"""

from __future__ import annotations

import functools
import logging
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from offset_ledger.capture.event_records import STARTED, TERMINATED, EventConverter
from offset_ledger.capture.spool import LIVE_WRITERS, Event, Spool, ledger_id
from offset_ledger.capture.spool_replay import END_OF_REPLAY, adopt_orphans, held_to_keep, read_replay
from offset_ledger.capture.store import ListenerHealth, Store, open_recorder
from offset_ledger.ledger.engine import permission_denied
from offset_ledger.ledger.records import Record, RecordOutcome

if TYPE_CHECKING:
    from offset_ledger.addresses import LedgerAddress

log = logging.getLogger(__name__)

#: Put on the queue by ``close`` to end the writer thread's idle wait; never written, never counted.
_WAKE = Event("wake", "", 0.0, None, None, None)


@dataclass(frozen=True)
class WriterOptions:
    """How the writer queues, batches, retries and reports: the listener's settings, as one value."""

    queue_size: int = 10_000         # events the queue holds before callbacks spill to the spool
    max_batch_events: int = 500      # events written in one ledger transaction
    initial_backoff: float = 0.05    # seconds before the first retry of a retriable error, doubled each time
    max_backoff: float = 2.0         # ... up to this
    health_interval: float = 30.0    # seconds between health reports to the ledger
    health_pipeline: str | None = None  # the pipeline the health rows name (the listener's, if one)
    beat_every_ms: int | None = None    # the driver heartbeat's period, stamped on the runs it records


class EventWriter:
    """Bounded queue + spool file + one writer thread that records events through a ``Store``.

    ``ledger`` is the address the listener resolved once: the spool's files name its ledger
    (``capture.spool.ledger_id``), and unless ``store_factory`` is given (a fake, in tests) the store
    is that ledger's ``Recorder``, opened on the writer thread's first write.
    """

    def __init__(
        self,
        ledger: LedgerAddress,
        *,
        spool_dir: Path,
        options: WriterOptions = WriterOptions(),
        store_factory: Callable[[], Store] | None = None,
        listener_id: str | None = None,
        on_query_seen: Callable[[str], str | None] | None = None,
        pipeline_of: Callable[[str], str | None] | None = None,
        on_recorded: Callable[[RecordOutcome], None] | None = None,
        autostart: bool = True,
    ) -> None:
        self.listener_id = listener_id or uuid.uuid4().hex
        self._store_factory = store_factory or functools.partial(open_recorder, ledger)
        self._store: Store | None = None
        self._queue: queue.Queue[Event] = queue.Queue(maxsize=options.queue_size)
        self._max_batch = options.max_batch_events
        self._initial_backoff = options.initial_backoff
        self._max_backoff = options.max_backoff
        self._health_interval = options.health_interval
        self._health_pipeline = options.health_pipeline
        self._converter = EventConverter(on_query_seen, pipeline_of, self.note_error,
                                         beat_every_ms=options.beat_every_ms, live_since=time.time())
        self._on_recorded = on_recorded  # after each ledger COMMIT, on this thread (the Kafka mirror)
        self._host = socket.gethostname()
        # Spool: while ``_spooling`` every new event goes to the file, so replay keeps event order.
        self._spool = Spool(Path(spool_dir), self.listener_id, ledger_id(ledger.dsn))
        self._dead_letter_path: str | None = None
        self._foreign: tuple[str, ...] = ()
        self._spooling = False
        self._lock = threading.Lock()  # guards counters and the spool switch; held for microseconds
        self._cond = threading.Condition(threading.Lock())  # wakes flush() waiters on progress
        self._counts = {"queued": 0, "written": 0, "retried": 0, "spilled": 0, "failed": 0, "skipped": 0}
        self._accepted = 0
        self._settled = 0
        self._last_error: str | None = None
        self._last_written_at: datetime | None = None
        # Per query, what has settled: the highest batch id and whether its run(s) terminated.
        self._done_batch: dict[str, int] = {}
        self._terminated: set[str] = set()
        self._closing = threading.Event()
        self._abandon = threading.Event()
        self._ended = threading.Event()  # the thread left its loop: nothing settles any more
        self._last_health = 0.0
        LIVE_WRITERS.add(self.listener_id)
        self._adopt_orphans()
        self._thread = threading.Thread(target=self._run, name=f"offset-ledger-writer-{self.listener_id[:8]}",
                                        daemon=True)
        if autostart:
            self._thread.start()

    # ------------------------------------------------------------------ callback side (never raises)

    def submit(self, event: Event) -> None:
        """Hand one event over: to the queue, else to the spool file. Never blocks on the database."""
        try:
            with self._lock:
                if not self._spooling and not self._closing.is_set():
                    try:
                        self._queue.put_nowait(event)
                        self._counts["queued"] += 1
                        self._accepted += 1
                        return
                    except queue.Full:
                        self._spooling = True
                        log.warning("offset-ledger listener queue is full; spilling events to %s",
                                    self._spool.path)
                self._spill_locked(event)
                self._accepted += 1
        except Exception as exc:  # noqa: BLE001 - a callback must never fail the query
            self._count_failure(f"could not accept a {event.kind} event: {exc!r}", event)

    def _spill_locked(self, event: Event) -> None:
        self._spool.append(event)
        self._counts["spilled"] += 1
        self._spooling = True

    def _adopt_orphans(self) -> None:
        """Orphaned spool files of this writer's ledger get replayed; those of other ledgers stay put."""
        events, unreadable, self._foreign = adopt_orphans(self._spool)
        with self._lock:
            for event in events:
                self._spill_locked(event)
                self._accepted += 1
        for line, message in unreadable:
            self._count_failure(message, line=line)

    def _count_failure(self, message: str, event: Event | None = None, line: str | None = None) -> None:
        """An accepted event the ledger will never take: into the dead-letter file, counted as failed."""
        try:
            path: str | None = str(self._spool.dead_letter(message, event, line))
        except Exception as exc:  # noqa: BLE001 - a full or read-only disk: say so, still never raise
            path, message = None, f"{message}; the dead-letter file could not be written: {exc!r}"
        with self._lock:
            self._counts["failed"] += 1
            self._last_error = message
            if path is not None:
                self._dead_letter_path = path
        log.error("offset-ledger: %s (dead-lettered to %s)", message, path)

    # ------------------------------------------------------------------ observers

    def health(self) -> ListenerHealth:
        with self._lock:
            counts: dict[str, Any] = dict(self._counts)
            return ListenerHealth(pending=self._accepted - self._settled, last_error=self._last_error,
                                  last_written_at=self._last_written_at, ledger=self._spool.ledger.identity,
                                  dead_letter_path=self._dead_letter_path, foreign_spool_files=len(self._foreign),
                                  foreign_spool_paths=self._foreign, **counts)

    def live_runs(self) -> dict[str, str]:
        """Run id -> query id of the runs this process's events say are running (the heartbeat's list)."""
        return self._converter.live_runs.copy()

    def seen_queries(self) -> set[str]:
        with self._lock:
            return set(self._done_batch) | set(self._terminated)

    def settled_batch(self, query_id: str) -> int | None:
        with self._lock:
            return self._done_batch.get(query_id)

    def is_terminated(self, query_id: str) -> bool:
        with self._lock:
            return query_id in self._terminated

    def accepted(self) -> int:
        with self._lock:
            return self._accepted

    def wait_for(self, predicate: Callable[[], bool], deadline: float) -> bool:
        """Block until ``predicate()`` holds (re-checked whenever events settle) or the deadline passes."""
        with self._cond:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._ended.is_set() or not self._thread.is_alive():
                    return predicate()
                # Woken by every settle and by the thread's end; the cap only bounds a wake that was missed.
                self._cond.wait(min(remaining, 1.0))
        return True

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every event accepted so far is settled (written or dead-lettered)."""
        target = self.accepted()
        return self.wait_for(lambda: self._settled_count() >= target, time.monotonic() + timeout)

    def _settled_count(self) -> int:
        with self._lock:
            return self._settled

    def close(self, timeout: float = 30.0) -> bool:
        """Write what is pending (up to ``timeout``), keep the rest in the spool, stop the thread."""
        deadline = time.monotonic() + timeout
        flushed = self.flush(timeout)
        self._closing.set()
        if not flushed:
            self._abandon.set()  # the writer spools what it holds instead of retrying forever
        self._wake()
        if self._thread.is_alive():
            self._thread.join(max(0.5, deadline - time.monotonic()))
        elif self._thread.ident is None:
            self._spool_everything([])  # never started: keep what was queued
        LIVE_WRITERS.discard(self.listener_id)
        with self._lock:
            self._spool.close()
        return flushed

    # ------------------------------------------------------------------ writer thread

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                events = self._next_events()
                if events:
                    self._write(events)
                elif self._closing.is_set() and self._queue.empty() and not self._spooling:
                    break
                if self._abandon.is_set():
                    self._spool_everything([])
                    break
                self._maybe_report_health()
            except Exception as exc:  # noqa: BLE001 - the writer thread must survive anything
                log.exception("offset-ledger writer loop error")
                with self._lock:
                    self._last_error = f"writer error: {exc!r}"
                time.sleep(0.1)
        self._maybe_report_health(force=True)
        self._ended.set()
        with self._cond:
            self._cond.notify_all()  # waiters re-check: nothing will settle any more
        close = getattr(self._store, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # noqa: BLE001 - shutting down anyway
                log.debug("offset-ledger: closing the store failed", exc_info=True)

    def _next_events(self) -> list[Event]:
        events: list[Event] = []
        try:
            first = self._queue.get(timeout=self._idle_wait())
            if first is not _WAKE:
                events.append(first)
        except queue.Empty:
            pass
        while events and len(events) < self._max_batch:
            try:
                event = self._queue.get_nowait()
            except queue.Empty:
                break
            if event is not _WAKE:
                events.append(event)
        if events:
            return events
        return self._next_spooled()

    def _idle_wait(self) -> float:
        """How long the thread may sleep on an empty queue (seconds): briefly while the spool has events or
        the writer closes, else until the next health report, at most a second. A listener lives in every
        Spark driver for as long as the job runs, mostly idle between batches: a thread that woke 20 times a
        second to look took CPU and the GIL from the driver (and, in bench_fleet, from the batch path).
        A new event ends the wait at once; ``close`` wakes it (``_wake``)."""
        if self._spooling or self._spool.replay_open or self._closing.is_set():
            return 0.05
        until_health = self._last_health + self._health_interval - time.monotonic()
        return min(max(until_health, 0.05), 1.0)

    def _wake(self) -> None:
        """End the thread's idle wait now (``close``); a full queue needs no wake: the thread is busy."""
        try:
            self._queue.put_nowait(_WAKE)
        except queue.Full:
            pass

    def _next_spooled(self) -> list[Event]:
        """The next events from the spool, oldest file first; only called when the queue is empty."""
        if not self._spool.replay_open:
            with self._lock:
                if not self._spooling:
                    return []
                replay = self._spool.take()
                if replay is None:
                    self._spooling = False  # nothing left: callbacks may use the queue again
                    return []
            self._spool.open_replay(replay)
        events, unreadable = read_replay(self._spool, self._max_batch)
        for line, message in unreadable:  # accepted earlier (spilled): settled as failed
            self._count_failure(message, line=line)
            self._settle(1)
        return events

    def _spool_everything(self, held: list[Event]) -> None:
        """On an abandoned close: keep every unwritten event on disk, in order, for the next listener.

        Only events held from the queue, and the queue itself, need a file (``held_to_keep``): one
        that sorts before this listener's spool, whose events are newer.
        """
        rest = held_to_keep(self._spool, held)
        with self._lock:
            while True:
                try:
                    event = self._queue.get_nowait()
                except queue.Empty:
                    break
                if event is not _WAKE:
                    rest.append(event)
            if rest:
                self._spool.write_held(rest)
                self._counts["spilled"] += len(rest)
            self._spool.close()

    # ------------------------------------------------------------------ writing

    def _write(self, events: list[Event]) -> None:
        end_of_replay = bool(events) and events[-1].kind == END_OF_REPLAY
        if end_of_replay:
            events = events[:-1]
        items: list[tuple[Record, Event]] = []
        marks: list[tuple[str, str, int | None]] = []  # (kind, query id, batch id) settled on success
        dead: list[tuple[Event, str]] = []
        skipped = 0
        for event in events:
            try:
                recs, mark = self._converter.convert(event)
            except Exception as exc:  # noqa: BLE001 - ProgressParseError, or anything odd in a payload
                dead.append((event, f"unparsable {event.kind} event: {exc}"))
                continue
            if mark is not None:
                marks.append(mark)
            if recs:
                items.extend((rec, event) for rec in recs)
            else:
                skipped += 1
        if items:
            rejected = self._persist(items, events)
            if rejected is None:
                return  # abandoned during close: everything held went to the spool
            dead.extend(rejected)
        for event, error in dead:
            self._count_failure(error, event)
        written = len(events) - skipped - len(dead)
        with self._lock:
            self._counts["written"] += written
            self._counts["skipped"] += skipped
            if written:
                self._last_written_at = datetime.now(timezone.utc)
            for kind, query_id, batch_id in marks:
                if batch_id is not None:
                    self._done_batch[query_id] = max(self._done_batch.get(query_id, -1), batch_id)
                else:
                    self._done_batch.setdefault(query_id, -1)
                if kind == TERMINATED:
                    self._terminated.add(query_id)
                elif kind == STARTED:
                    self._terminated.discard(query_id)
        if end_of_replay:
            self._spool.finish_replay()
        self._settle(len(events))

    def _persist(self, items: list[tuple[Record, Event]], events: list[Event]) -> list[tuple[Event, str]] | None:
        """Record with retries while the error is retriable; the events rejected for good, with why.

        None when close() gave up while the database was still down (``events`` went to the spool).
        """
        backoff = self._initial_backoff
        while True:
            try:
                if self._store is None:
                    self._store = self._store_factory()
                outcome = self._store.record([record for record, _ in items])
                self._recorded(outcome)
                return []
            except Exception as exc:  # noqa: BLE001 - classified by the ``retriable`` flag
                if getattr(exc, "retriable", False):
                    with self._lock:
                        self._counts["retried"] += 1
                        self._last_error = str(exc)
                    log.warning("offset-ledger: ledger unavailable, retrying in %.2fs: %s", backoff, exc)
                    if self._abandon.wait(backoff):
                        self._spool_everything(events)
                        return None
                    backoff = min(backoff * 2, self._max_backoff)
                    continue
                if len(items) > 1:
                    # Find the record the database rejects; keep the others.
                    rejected: list[tuple[Event, str]] = []
                    for item in items:
                        one = self._persist([item], events)
                        if one is None:
                            return None
                        rejected.extend(one)
                    return rejected
                if permission_denied(exc):
                    # Retrying cannot help: the role lacks the grant or the pipeline is another team's.
                    pipeline = getattr(items[0][0], "pipeline", None)
                    return [(items[0][1], f"ledger role {self._ledger_role()!r} may not write pipeline "
                                          f"{pipeline!r} (permission denied: the pipeline is not in the role's "
                                          f"scope; see offset-ledger db grant): {exc}")]
                return [(items[0][1], f"ledger rejected an event: {exc}")]

    def _ledger_role(self) -> str | None:
        """The database user the store logs in as (its DSN's), for a refusal's reason."""
        url = getattr(getattr(self._store, "engine", None), "url", None)
        return getattr(url, "username", None)

    def _recorded(self, outcome: RecordOutcome) -> None:
        if self._on_recorded is None or outcome is None:
            return
        try:
            self._on_recorded(outcome)
        except Exception as exc:  # noqa: BLE001 - the ledger write succeeded; nothing else may undo it
            self.note_error(f"after-record hook failed: {exc!r}")

    def note_error(self, message: str) -> None:
        """Show ``message`` as the health's last error (a mirror refusal, say) without counting events."""
        with self._lock:
            self._last_error = message

    def _settle(self, n: int) -> None:
        with self._lock:
            self._settled += n
        with self._cond:
            self._cond.notify_all()

    def _maybe_report_health(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_health < self._health_interval:
            return
        self._last_health = now
        if self._store is None:
            return
        health = self.health()
        try:
            self._store.report_health(self.listener_id, self._health_pipeline, self._host,
                                      health.counters(), health.last_error)
        except Exception as exc:  # noqa: BLE001 - health is best effort
            log.debug("offset-ledger: health report failed: %s", exc)


