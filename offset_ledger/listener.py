"""The drop-in StreamingQueryListener and its background writer (bounded queue, retry, spool).

Spark delivers listener events on its listener bus; a slow listener makes that bus drop events.
So a callback here does as little as possible: it takes the event's JSON text (one py4j call),
wraps it with the listener's settings and hands it to a bounded in-memory queue, or, when that
queue is full, appends it to a local spool file. It never raises. A single writer thread parses
events (``offset_ledger.progress``), and writes them in batches, one transaction per batch of
events, through ``offset_ledger.ledger.recorder``. While the database is down it retries with
exponential backoff; callbacks keep filling the queue, then the spool, and the writer replays the
spool, in order, once the database answers again.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import functools
import json
import logging
import os
import queue
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple, Protocol

try:
    from pyspark.sql.streaming import StreamingQueryListener
except ImportError:  # the CLI, API and start_from_ledger run without PySpark; only this module needs it
    raise ModuleNotFoundError(
        "OffsetLedgerListener needs PySpark 3.5 or 4.x: pip install 'offset-ledger[spark]', "
        "or run it where your platform's PySpark is installed", name="pyspark") from None

from offset_ledger.ledger.recorder import (
    BatchRecord,
    Record,
    RecordOutcome,
    RunEnd,
    RunHeartbeat,
    RunStart,
)
from offset_ledger.progress import (
    ProgressParseError,
    is_no_data,
    parse_idle,
    parse_progress,
    parse_started,
    parse_terminated,
)

log = logging.getLogger(__name__)

STARTED, PROGRESS, IDLE, TERMINATED = "started", "progress", "idle", "terminated"
# Listener ids with a running writer in this process: their spool files are not orphans.
_LIVE: set[str] = set()


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
    failed: int          # events that could not be recorded (malformed, rejected by the database)
    skipped: int         # events of queries with neither a pipeline nor a name
    pending: int         # events accepted but not yet settled
    last_error: str | None
    last_written_at: datetime | None
    callback_p99_ms: float | None = None  # per callback, incl. the py4j fetch of the JSON (last 1024)
    mirror: dict[str, Any] | None = None  # the Kafka consumer-group mirror's counters (commit_to_kafka)

    def counters(self) -> dict[str, int]:
        return {"queued": self.queued, "written": self.written, "retried": self.retried,
                "spilled": self.spilled, "failed": self.failed}


class Event(NamedTuple):
    """One listener event as received: its JSON text plus the settings of the listener that got it."""

    kind: str
    payload: str
    received_at: float
    pipeline: str | None
    consumer_group: str | None
    app_version: str | None

    def to_line(self) -> str:
        return json.dumps(self._asdict(), separators=(",", ":")) + "\n"

    @classmethod
    def from_line(cls, line: str) -> Event:
        return cls(**json.loads(line))


def _utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=timezone.utc)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class EventWriter:
    """Bounded queue + spool file + one writer thread that records events through a ``Store``."""

    def __init__(
        self,
        store_factory: Callable[[], Store],
        *,
        spool_dir: Path,
        listener_id: str | None = None,
        queue_size: int = 10_000,
        max_batch_events: int = 500,
        initial_backoff: float = 0.05,
        max_backoff: float = 2.0,
        health_interval: float = 30.0,
        health_pipeline: str | None = None,
        on_query_seen: Callable[[str], str | None] | None = None,
        pipeline_of: Callable[[str], str | None] | None = None,
        autostart: bool = True,
        on_recorded: Callable[[RecordOutcome], None] | None = None,
    ) -> None:
        self.listener_id = listener_id or uuid.uuid4().hex
        self._store_factory = store_factory
        self._store: Store | None = None
        self._queue: queue.Queue[Event] = queue.Queue(maxsize=queue_size)
        self._max_batch = max_batch_events
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self._health_interval = health_interval
        self._health_pipeline = health_pipeline
        self._on_query_seen = on_query_seen
        self._pipeline_of = pipeline_of
        self._on_recorded = on_recorded  # after each ledger COMMIT, on this thread (the Kafka mirror)
        self._host = socket.gethostname()
        # Spool: while ``_spooling`` every new event goes to the file, so replay keeps event order.
        self._spool_dir = Path(spool_dir)
        self._spool_path = self._spool_dir / f"{os.getpid()}-{self.listener_id}.jsonl"
        self._spool_file: Any = None
        self._spooling = False
        self._replaying: Path | None = None
        self._replay_lines: Iterator[str] | None = None
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
        self._query_pipeline: dict[str, tuple[str, str, str | None]] = {}
        self._warned_unnamed: set[str] = set()
        self._closing = threading.Event()
        self._abandon = threading.Event()
        self._last_health = 0.0
        _LIVE.add(self.listener_id)
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
                                    self._spool_path)
                self._spill_locked(event)
                self._accepted += 1
        except Exception as exc:  # noqa: BLE001 - a callback must never fail the query
            self._count_failure(f"could not accept a {event.kind} event: {exc!r}")

    def _spill_locked(self, event: Event) -> None:
        if self._spool_file is None:
            self._spool_dir.mkdir(parents=True, exist_ok=True)
            self._spool_file = open(self._spool_path, "a", encoding="utf-8")  # noqa: SIM115
        self._spool_file.write(event.to_line())
        self._spool_file.flush()
        self._counts["spilled"] += 1
        self._spooling = True

    def _count_failure(self, message: str) -> None:
        with self._lock:
            self._counts["failed"] += 1
            self._last_error = message
        log.warning("offset-ledger: %s", message)

    # ------------------------------------------------------------------ observers

    def health(self) -> ListenerHealth:
        with self._lock:
            counts: dict[str, Any] = dict(self._counts)
            return ListenerHealth(pending=self._accepted - self._settled, last_error=self._last_error,
                                  last_written_at=self._last_written_at, **counts)

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
                if remaining <= 0 or not self._thread.is_alive():
                    return predicate()
                self._cond.wait(min(remaining, 0.1))
        return True

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every event accepted so far is settled (written or counted as failed)."""
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
        if self._thread.is_alive():
            self._thread.join(max(0.5, deadline - time.monotonic()))
        elif self._thread.ident is None:
            self._spool_everything([])  # never started: keep what was queued
        _LIVE.discard(self.listener_id)
        with self._lock:
            if self._spool_file is not None:
                self._spool_file.close()
                self._spool_file = None
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
        close = getattr(self._store, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # noqa: BLE001 - shutting down anyway
                log.debug("offset-ledger: closing the store failed", exc_info=True)

    def _next_events(self) -> list[Event]:
        events: list[Event] = []
        try:
            events.append(self._queue.get(timeout=0.05))
        except queue.Empty:
            pass
        while events and len(events) < self._max_batch:
            try:
                events.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if events:
            return events
        return self._next_spooled()

    def _next_spooled(self) -> list[Event]:
        """The next events from the spool, oldest file first; only called when the queue is empty."""
        if self._replay_lines is None:
            with self._lock:
                if not self._spooling:
                    return []
                if self._spool_file is not None:
                    self._spool_file.close()
                    self._spool_file = None
                if not self._spool_path.exists() or self._spool_path.stat().st_size == 0:
                    self._spool_path.unlink(missing_ok=True)
                    self._spooling = False  # nothing left: callbacks may use the queue again
                    return []
                replay = self._spool_path.with_suffix(f".replay-{uuid.uuid4().hex[:6]}")
                self._spool_path.rename(replay)
            self._open_replay(replay)
        return self._read_replay()

    def _open_replay(self, path: Path) -> None:
        self._replaying = path
        self._replay_lines = iter(path.open("r", encoding="utf-8"))

    def _read_replay(self) -> list[Event]:
        events: list[Event] = []
        assert self._replay_lines is not None
        for line in self._replay_lines:
            if not line.strip():
                continue
            try:
                events.append(Event.from_line(line))
            except (ValueError, TypeError) as exc:
                self._settle(1, failed=f"unreadable spool line: {exc!r}")
            if len(events) >= self._max_batch:
                return events
        # End of file: it is deleted once these last events are written (see _write).
        self._replay_lines = None
        if not events:
            self._finish_replay()
        else:
            events.append(Event("_end_of_replay", "", 0.0, None, None, None))
        return events

    def _finish_replay(self) -> None:
        if self._replaying is not None:
            self._replaying.unlink(missing_ok=True)
            self._replaying = None

    def _adopt_orphans(self) -> None:
        """Spool files left by a process that died or closed with the database down get replayed."""
        if not self._spool_dir.is_dir():
            return
        def order(path: Path) -> tuple[str, int]:
            # Per owner, oldest first: a half-replayed file, then events held at close, then the spool.
            rank = 0 if ".replay-" in path.name else 1 if path.name.endswith(".held.jsonl") else 2
            return path.name.split(".", 1)[0], rank

        paths = sorted(self._spool_dir.glob("*.jsonl"), key=order)
        paths = sorted([*paths, *self._spool_dir.glob("*.replay-*")], key=order)
        for path in paths:
            pid, _, rest = path.name.partition("-")
            owner = rest.split(".", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and _pid_alive(int(pid)):
                continue  # another live process's listener
            if pid.isdigit() and int(pid) == os.getpid() and owner in _LIVE:
                continue  # a live listener of this process (ourselves included)
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
                path.unlink()
            except OSError:
                continue
            with self._lock:
                for line in lines:
                    if not line.strip():
                        continue
                    try:
                        event = Event.from_line(line)
                    except (ValueError, TypeError):
                        self._counts["failed"] += 1
                        self._last_error = f"unreadable spool line in {path.name}"
                        continue
                    self._spill_locked(event)
                    self._accepted += 1
            log.info("offset-ledger: adopted %d spooled events from %s", len(lines), path.name)

    def _spool_everything(self, held: list[Event]) -> None:
        """On an abandoned close: keep every unwritten event on disk, in order, for the next listener.

        Held events read from a replay file are still in that file (it is deleted only after they
        are written), so only events held from the queue, and the queue itself, need a file: one
        that sorts before this listener's spool, whose events are newer.
        """
        if self._replaying is not None:
            held = []
            self._replay_lines = None
            self._replaying = None  # left on disk under its replay name: adopted later
        with self._lock:
            rest = [e for e in held if e.kind != "_end_of_replay"]
            while True:
                try:
                    rest.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if rest:
                self._spool_dir.mkdir(parents=True, exist_ok=True)
                with open(self._spool_path.with_suffix(".held.jsonl"), "a", encoding="utf-8") as out:
                    out.writelines(e.to_line() for e in rest)
                self._counts["spilled"] += len(rest)
            if self._spool_file is not None:
                self._spool_file.close()
                self._spool_file = None

    # ------------------------------------------------------------------ writing

    def _write(self, events: list[Event]) -> None:
        end_of_replay = bool(events) and events[-1].kind == "_end_of_replay"
        if end_of_replay:
            events = events[:-1]
        records: list[Record] = []
        marks: list[tuple[str, str, int | None]] = []  # (kind, query id, batch id) settled on success
        skipped = failed = 0
        for event in events:
            try:
                recs, mark = self._convert(event)
            except Exception as exc:  # noqa: BLE001 - ProgressParseError, or anything odd in a payload
                failed += 1
                with self._lock:
                    self._last_error = f"unparsable {event.kind} event: {exc}"
                log.warning("offset-ledger: unparsable %s event: %s", event.kind, exc)
                continue
            if mark is not None:
                marks.append(mark)
            if recs:
                records.extend(recs)
            else:
                skipped += 1
        written = len(events) - skipped - failed
        if records and not self._persist(records, events):
            return  # abandoned during close: everything held went to the spool
        with self._lock:
            self._counts["written"] += written
            self._counts["skipped"] += skipped
            self._counts["failed"] += failed
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
            self._finish_replay()
        self._settle(len(events))

    def _persist(self, records: list[Record], events: list[Event]) -> bool:
        """Record with retries; False when close() gave up while the database was still down."""
        backoff = self._initial_backoff
        while True:
            try:
                if self._store is None:
                    self._store = self._store_factory()
                outcome = self._store.record(records)
                self._recorded(outcome)
                return True
            except Exception as exc:  # noqa: BLE001 - classified by the ``retriable`` flag
                if getattr(exc, "retriable", False):
                    with self._lock:
                        self._counts["retried"] += 1
                        self._last_error = str(exc)
                    log.warning("offset-ledger: ledger unavailable, retrying in %.2fs: %s", backoff, exc)
                    if self._abandon.wait(backoff):
                        self._spool_everything(events)
                        return False
                    backoff = min(backoff * 2, self._max_backoff)
                    continue
                if len(records) > 1:
                    # Find the record the database rejects; keep the others.
                    for record in records:
                        self._persist([record], events)
                    return True
                with self._lock:
                    self._counts["failed"] += 1
                    self._counts["written"] -= 1  # _write counts it as written; it is not
                    self._last_error = f"ledger rejected an event: {exc}"
                log.error("offset-ledger: ledger rejected an event: %s", exc)
                return True

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

    def _settle(self, n: int, failed: str | None = None) -> None:
        with self._lock:
            self._settled += n
            if failed:
                self._counts["failed"] += n
                self._last_error = failed
        with self._cond:
            self._cond.notify_all()

    def _convert(self, event: Event) -> tuple[list[Record], tuple[str, str, int | None] | None]:
        """One event -> ledger records (none for unnamed queries) and what it settles."""
        if event.kind == STARTED:
            started = parse_started(event.payload)
            checkpoint = self._first_sight(started.query_id, started=True)
            target = self._pipeline_for(event, started.query_id, started.query_name)
            mark: tuple[str, str, int | None] = (STARTED, started.query_id, None)
            if target is None:
                return [], mark
            pipeline, group, app_version = target
            return [RunStart(pipeline, group, started.query_id, started.run_id, started.query_name,
                             started.started_at, app_version=app_version, checkpoint_location=checkpoint)], mark
        if event.kind == PROGRESS:
            batch = parse_progress(event.payload)
            self._first_sight(batch.query_id)
            target = self._pipeline_for(event, batch.query_id, batch.query_name)
            mark = (PROGRESS, batch.query_id, batch.batch_id)
            if target is None:
                return [], mark
            pipeline, group, _ = target
            if is_no_data(batch):
                return [RunHeartbeat(pipeline, group, batch.query_id, batch.run_id, batch.batch_time)], mark
            return [BatchRecord(pipeline, group, batch)], mark
        if event.kind == IDLE:
            idle = parse_idle(event.payload)
            self._first_sight(idle.query_id)
            target = self._pipeline_for(event, idle.query_id, None)
            mark = (IDLE, idle.query_id, None)
            if target is None:
                return [], mark
            return [RunHeartbeat(target[0], target[1], idle.query_id, idle.run_id, idle.at)], mark
        if event.kind == TERMINATED:
            ended = parse_terminated(event.payload)
            target = self._pipeline_for(event, ended.query_id, None)
            mark = (TERMINATED, ended.query_id, None)
            if target is None:
                return [], mark
            return [RunEnd(target[0], target[1], ended.query_id, ended.run_id, _utc(event.received_at),
                           ended.exception)], mark
        raise ProgressParseError(f"unknown event kind {event.kind!r}")

    def _first_sight(self, query_id: str, *, started: bool = False) -> str | None:
        """Tell the listener about a query (each run's start, else its first event): the checkpoint."""
        if self._on_query_seen is None:
            return None
        if not started and (query_id in self._query_pipeline or query_id in self._warned_unnamed):
            return None
        try:
            return self._on_query_seen(query_id)
        except Exception:  # noqa: BLE001 - only an optimisation for flush() and a detail of the run
            log.debug("on_query_seen failed", exc_info=True)
            return None

    def _pipeline_for(self, event: Event, query_id: str, name: str | None) -> tuple[str, str, str | None] | None:
        """(pipeline, consumer group, app version) of a query; idle/terminated events carry no name."""
        if event.pipeline or name:
            pipeline = event.pipeline or self._mapped(name) or name
            assert pipeline is not None
            target = (pipeline, event.consumer_group or pipeline, event.app_version)
        elif query_id in self._query_pipeline:
            target = self._query_pipeline[query_id]
        else:
            if query_id not in self._warned_unnamed:
                self._warned_unnamed.add(query_id)
                log.warning("offset-ledger: query %s has no name and the listener no pipeline; "
                            "its offsets are not recorded (set queryName or pipeline=)", query_id)
            return None
        self._query_pipeline[query_id] = target
        return target

    def _mapped(self, name: str | None) -> str | None:
        """The pipeline ``pipeline=`` maps a query name to (None: use the name itself)."""
        if self._pipeline_of is None or name is None:
            return None
        try:
            mapped = self._pipeline_of(name)
        except Exception as exc:  # noqa: BLE001 - a user's mapping must not stop recording
            self._count_failure(f"pipeline mapping failed for query {name!r}: {exc!r}; using the query name")
            return None
        return str(mapped) if mapped else None

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


def _open_recorder(dsn: str | None) -> Store:
    from offset_ledger.ledger.engine import ensure_schema, make_engine
    from offset_ledger.ledger.recorder import Recorder

    engine = make_engine(dsn, pool_size=1)
    try:
        ensure_schema(engine)
    except Exception:
        engine.dispose()
        raise
    return Recorder(engine, owns_engine=True)


class OffsetLedgerListener(StreamingQueryListener):
    """Records every committed micro-batch's Kafka offsets in the offset ledger.

    Register it once per SparkSession::

        spark.streams.addListener(OffsetLedgerListener(dsn="postgresql+psycopg2://...", pipeline="orders"))

    ``pipeline`` defaults to each query's name (a query with neither is logged once and skipped). A
    string attributes every query of the session to that one pipeline; a mapping or a callable
    maps each query's name to its pipeline (unmapped names keep their own), so several queries of
    one session reading the same topic keep separate positions. ``consumer_group`` defaults to the
    pipeline, ``dsn`` to ``OFFSET_LEDGER_DSN`` and then the embedded
    SQLite ledger. Callbacks never block on the database and never raise; call :meth:`flush`
    after ``query.processAllAvailable()`` or ``query.stop()`` to wait until the batches Spark
    reported are durable, and :meth:`close` at shutdown.

    ``commit_to_kafka=True`` also mirrors the ledger's positions into the Kafka consumer group of
    the same name (``bootstrap_servers`` default ``OFFSET_LEDGER_BOOTSTRAP_SERVERS``; Spark-style
    ``kafka_options``), after each ledger commit, on a thread of its own: Kafka being down never
    delays the ledger, and a group someone else consumes with is left alone (see
    ``offset_ledger.mirror``). :meth:`flush_mirror` waits until the group shows the ledger.

    How events arrive (``bridge`` tells which path a classic session took):

    * classic PySpark, ``"json"``: one py4j call per event fetches Spark's own JSON of it. It needs
      ``PythonStreamingQueryListenerWrapper`` in the JVM and events that serialise themselves
      (Spark 3.5+); when either is missing, or ``fast_bridge`` is set to False on the listener
      before ``addListener``, ``"pyspark"``: PySpark's own conversion builds the event objects and
      calls the ``onQuery*`` methods below.
    * Spark Connect (``bridge`` stays None): the client registers itself with the server's
      listener bus and the server streams each event's JSON to the client over gRPC, where PySpark
      calls the ``onQuery*`` methods on a thread of its own. ``flush()`` works the same way
      (``streams.get(id).lastProgress`` is asked over Connect), but the run's checkpoint location
      cannot be looked up from a Connect client, so runs are recorded with an unknown checkpoint.
    """

    #: Use the one-call JSON bridge when the running PySpark offers it (see the class docstring).
    fast_bridge: bool = True
    #: Which path delivers events on a classic session: "json", "pyspark", or None (Spark Connect).
    bridge: str | None = None

    def __init__(
        self,
        dsn: str | None = None,
        pipeline: str | Mapping[str, str] | Callable[[str], str | None] | None = None,
        consumer_group: str | None = None,
        app_version: str | None = None,
        *,
        spool_dir: str | Path | None = None,
        queue_size: int = 10_000,
        max_batch_events: int = 500,
        max_backoff: float = 2.0,
        health_interval: float = 30.0,
        store_factory: Callable[[], Store] | None = None,
        commit_to_kafka: bool = False,
        bootstrap_servers: str | None = None,
        kafka_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if spool_dir is None:
            from offset_ledger.config import settings

            spool_dir = settings().home / "spool"
        self.dsn = dsn
        pipeline_of: Callable[[str], str | None] | None = None
        if isinstance(pipeline, Mapping):
            pipeline_of, pipeline = dict(pipeline).get, None
        elif callable(pipeline):
            pipeline_of, pipeline = pipeline, None
        elif pipeline is not None and not isinstance(pipeline, str):
            raise TypeError("pipeline must be a name, a mapping of query names, or a callable")
        self.pipeline = pipeline
        self.consumer_group = consumer_group
        self.app_version = app_version
        self._handles: dict[str, Any] = {}
        self._callback_seconds: collections.deque[float] = collections.deque(maxlen=1024)
        self._callback_errors = 0
        self._mirror: Any = None
        if commit_to_kafka:
            from offset_ledger.mirror import KafkaMirror

            factories = _mirror_factories(dsn, bootstrap_servers, kafka_options)
            self._mirror = KafkaMirror(*factories, on_error=lambda m: self._writer.note_error(m))
        self._writer = EventWriter(
            store_factory or (lambda: _open_recorder(dsn)),
            spool_dir=Path(spool_dir), queue_size=queue_size, max_batch_events=max_batch_events,
            max_backoff=max_backoff, health_interval=health_interval, health_pipeline=pipeline,
            on_query_seen=self._remember_query, pipeline_of=pipeline_of,
            on_recorded=self._mirror_moved if self._mirror is not None else None,
        )
        ref = weakref.ref(self)
        atexit.register(lambda: (lambda me: me and me.close(timeout=10))(ref()))

    @property
    def listener_id(self) -> str:
        return self._writer.listener_id

    # ------------------------------------------------------------------ Spark callbacks

    def onQueryStarted(self, event: Any) -> None:
        self._accept(STARTED, lambda: json.dumps({
            "id": str(event.id), "runId": str(event.runId), "name": event.name,
            "timestamp": event.timestamp}))

    def onQueryProgress(self, event: Any) -> None:
        self._accept(PROGRESS, lambda: event.progress.json)

    def onQueryIdle(self, event: Any) -> None:
        self._accept(IDLE, lambda: json.dumps({
            "id": str(event.id), "runId": str(event.runId), "timestamp": event.timestamp}))

    def onQueryTerminated(self, event: Any) -> None:
        self._accept(TERMINATED, lambda: json.dumps({
            "id": str(event.id), "runId": str(event.runId), "exception": event.exception,
            "errorClassOnException": getattr(event, "errorClassOnException", None)}))

    def accept_json(self, kind: str, payload: str) -> None:
        """Hand over an event already serialised by Spark (``kind``: started/progress/idle/terminated)."""
        self._accept(kind, lambda: payload)

    def _accept(self, kind: str, payload: Callable[[], str]) -> None:
        started = time.perf_counter()
        try:
            self._writer.submit(Event(kind, payload(), time.time(), self.pipeline, self.consumer_group,
                                      self.app_version))
        except Exception as exc:  # noqa: BLE001 - no exception may reach Spark's listener bus
            self._callback_errors += 1
            self._writer._count_failure(f"{kind} callback failed: {exc!r}")
        self._callback_seconds.append(time.perf_counter() - started)

    @property
    def _jlistener(self) -> Any:
        """What classic PySpark's ``addListener`` registers with the JVM (Spark Connect never asks).

        The fast bridge fetches each event's JSON in one py4j call instead of PySpark's field walk;
        it relies on PySpark internals, so it is only used when the running Spark offers them.
        """
        if not hasattr(self, "_jlistenerobj"):
            wrapper = _fast_bridge_wrapper() if self.fast_bridge else None
            if wrapper is None:
                self._jlistenerobj = StreamingQueryListener._jlistener.fget(self)  # type: ignore[attr-defined]
                self.bridge = "pyspark"
            else:
                self._jlistenerobj = wrapper(_JsonBridge(self))
                self.bridge = "json"
        return self._jlistenerobj

    def __reduce__(self) -> Any:
        # PySpark 3.5's Spark Connect pickles listeners and runs them on the server; this one owns
        # a writer thread and a spool in the client process, so say so instead of a pickling error.
        raise TypeError("OffsetLedgerListener runs in the driver or Spark Connect client process and "
                        "cannot be pickled: Spark Connect needs PySpark 4.x (3.5's Connect runs "
                        "listeners on the server); classic sessions work on 3.5 and 4.x")

    # ------------------------------------------------------------------ durability

    def health(self) -> ListenerHealth:
        """Counters: queued, written, retried, spilled, failed, skipped, pending, last error."""
        health = self._writer.health()
        if self._mirror is not None:
            health = dataclasses.replace(health, mirror=self._mirror.stats.to_dict())
        took = sorted(self._callback_seconds)
        if not took:
            return health
        p99 = took[min(len(took) - 1, int(0.99 * len(took)))] * 1000
        return dataclasses.replace(health, callback_p99_ms=round(p99, 3))

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every event received so far, and each seen query's last reported batch, is durable.

        Events reach Python after the batch, so when ``query.stop()`` returns the query's last
        progress events may still be on Spark's listener bus. For each query seen, this waits for
        the batch id of its ``lastProgress`` (and, once stopped, for its termination event).
        Returns False when ``timeout`` passed first.
        """
        deadline = time.monotonic() + timeout
        writer = self._writer
        if not writer.flush(max(0.0, deadline - time.monotonic())):
            return False
        for query_id in sorted(writer.seen_queries()):
            if writer.is_terminated(query_id):
                continue
            handle = self._handle(query_id)
            if handle is None:
                continue  # not a query of this session's manager any more; nothing to compare with
            try:
                last = handle.lastProgress
                target = int(last["batchId"]) if last else None
                active = bool(handle.isActive)
            except Exception:  # noqa: BLE001 - the JVM may be shutting down
                continue
            if target is not None and not writer.wait_for(
                    functools.partial(_batch_settled, writer, query_id, target), deadline):
                return False
            if not active and not writer.wait_for(functools.partial(writer.is_terminated, query_id), deadline):
                return False
        # Events that arrived while we waited (the terminated event, say) are written too.
        return writer.flush(max(0.0, deadline - time.monotonic()))

    def close(self, timeout: float = 30.0) -> bool:
        """Flush, then stop the writer; events it could not write stay in the spool for next time."""
        deadline = time.monotonic() + timeout
        flushed = self.flush(timeout)
        closed = self._writer.close(max(0.5, deadline - time.monotonic()))
        if self._mirror is not None:
            self._mirror.close(max(0.5, deadline - time.monotonic()))
        return flushed and closed

    def flush_mirror(self, timeout: float = 30.0) -> bool:
        """``flush``, then wait until the Kafka consumer groups show the ledger's positions (commit_to_kafka)."""
        deadline = time.monotonic() + timeout
        if not self.flush(timeout):
            return False
        return self._mirror is None or self._mirror.wait_synced(max(0.0, deadline - time.monotonic()))

    def _mirror_moved(self, outcome: RecordOutcome) -> None:
        if outcome.moved:
            self._mirror.notify(outcome.moved)

    # ------------------------------------------------------------------ Spark handles

    def _session(self) -> Any:
        session = self.spark
        if session is not None:
            return session
        from pyspark.sql import SparkSession

        return SparkSession._instantiatedSession or SparkSession.getActiveSession()

    def _remember_query(self, query_id: str) -> str | None:
        """Keep a run's handle while it is active (after stop() the manager forgets it); its checkpoint."""
        handle = self._handle(query_id)
        try:
            return str(handle._jsq.streamingQuery().resolvedCheckpointRoot()) if handle is not None else None
        except Exception:  # noqa: BLE001 - Spark Connect or another Spark: no checkpoint, nothing else lost
            return None

    def _lookup(self, query_id: str) -> Any:
        try:
            session = self._session()
            return session.streams.get(query_id) if session is not None else None
        except Exception:  # noqa: BLE001 - no session, JVM gone, ...
            return None

    def _handle(self, query_id: str) -> Any:
        """The query's handle: the active run if there is one, else the last run seen (it keeps lastProgress)."""
        handle = self._handles.get(query_id)
        if handle is not None:
            try:
                if handle.isActive:
                    return handle
            except Exception:  # noqa: BLE001
                pass
        fresh = self._lookup(query_id)  # restarted on the same checkpoint: same id, a new run
        if fresh is not None:
            self._handles[query_id] = fresh
            return fresh
        return handle


class _JsonBridge:
    """Implements Spark's PythonStreamingQueryListener over Py4J, passing each event's JSON text."""

    def __init__(self, listener: OffsetLedgerListener) -> None:
        self._listener = listener

    def onQueryStarted(self, jevent: Any) -> None:
        self._listener._accept(STARTED, lambda: _json_of(jevent))

    def onQueryProgress(self, jevent: Any) -> None:
        self._listener._accept(PROGRESS, lambda: jevent.progress().json())

    def onQueryIdle(self, jevent: Any) -> None:
        self._listener._accept(IDLE, lambda: _json_of(jevent))

    def onQueryTerminated(self, jevent: Any) -> None:
        self._listener._accept(TERMINATED, lambda: _json_of(jevent))

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


def _mirror_factories(dsn: str | None, bootstrap_servers: str | None,
                      kafka_options: Mapping[str, Any] | None) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(ledger engine factory, Kafka adapter factory) of the consumer-group mirror; checks settings now."""
    from offset_ledger.config import settings
    from offset_ledger.kafka import KafkaAdapter, client_configs

    options = dict(kafka_options or {})
    servers = bootstrap_servers or options.get("kafka.bootstrap.servers") or settings().bootstrap_servers
    client_configs(servers or "", options)  # ConfigError now, at construction, not in the writer thread

    def engine() -> Any:
        from offset_ledger.ledger.engine import make_engine

        return make_engine(dsn, pool_size=1)

    return engine, lambda: KafkaAdapter(str(servers), options)

def _fast_bridge_wrapper() -> Any:
    """Spark's ``PythonStreamingQueryListenerWrapper`` class when the fast bridge can work, else None.

    It can when the session is classic (a JVM behind py4j), the wrapper class is there, and every
    lifecycle event serialises itself to JSON (``json()`` on the event, Spark 3.5+).
    """
    try:
        from py4j.java_gateway import JavaClass
        from pyspark import SparkContext

        jvm, gateway = SparkContext._jvm, SparkContext._gateway
        if jvm is None or gateway is None:
            return None
        wrapper = jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper
        if not isinstance(wrapper, JavaClass):  # py4j answers an unknown class with a JavaPackage
            return None
        no_args = gateway.new_array(jvm.java.lang.Class, 0)
        for event in ("QueryStartedEvent", "QueryIdleEvent", "QueryTerminatedEvent"):
            # Raises (NoSuchMethodException, ClassNotFoundException) when this Spark lacks it.
            jvm.java.lang.Class.forName(f"org.apache.spark.sql.streaming.StreamingQueryListener${event}") \
                .getMethod("json", no_args)
        return wrapper
    except Exception:  # noqa: BLE001 - anything missing means: use PySpark's own path
        log.debug("offset-ledger: the fast listener bridge is not available", exc_info=True)
        return None


def _batch_settled(writer: EventWriter, query_id: str, batch_id: int) -> bool:
    settled = writer.settled_batch(query_id)
    return settled is not None and settled >= batch_id


def _json_of(jevent: Any) -> str:
    """A lifecycle event's JSON: Spark 3.5+ events serialise themselves (used by Spark Connect)."""
    return str(jevent.json())
