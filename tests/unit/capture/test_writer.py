"""The listener's writer: queue, batching, retries, spool and replay, with an in-memory store."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from offset_ledger.addresses import LedgerAddress
from offset_ledger.capture.listener import Event, EventWriter, OffsetLedgerListener
from offset_ledger.capture.spool import is_header
from offset_ledger.capture.writer import WriterOptions
from offset_ledger.errors import LedgerError, LedgerUnavailable
from offset_ledger.ledger.records import BatchRecord, Record, RecordOutcome, RunEnd, RunHeartbeat, RunStart

QID, RID = "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"


def progress(batch_id: int, *, name: str | None = "orders", query: str = QID, rows: int | None = None,
             start: int | None = None, end: int | None = None) -> str:
    until = end if end is not None else (batch_id + 1) * 10
    since = start if start is not None else (None if batch_id == 0 else batch_id * 10)
    if rows is None:  # every offset one record, as on a plain topic (fewer rows: a read shortfall, issue 41)
        rows = until - (since or 0)
    return json.dumps({
        "id": query, "runId": RID, "name": name, "timestamp": "2026-11-22T20:42:12.804Z",
        "batchId": batch_id, "numInputRows": rows,
        "sources": [{"description": "KafkaV2[Subscribe[t]]",
                     "startOffset": None if since is None else {"t": {"0": since}},
                     "endOffset": {"t": {"0": until}}, "numInputRows": rows}],
        "sink": {"description": "MemorySink"}})


def started(name: str | None = "orders", query: str = QID) -> str:
    return json.dumps({"id": query, "runId": RID, "name": name, "timestamp": "2026-11-22T20:42:10.000Z"})


def ev(kind: str, payload: str, pipeline: str | None = None, group: str | None = None) -> Event:
    return Event(kind, payload, time.time(), pipeline, group, "1.0")


class FakeStore:
    """Records what it is given; can be 'down' (retriable) or reject some records (not retriable)."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.calls = 0
        self.down = threading.Event()
        self.reject_batch: int | None = None
        self.health: list[dict[str, int]] = []

    def record(self, records: list[Record]) -> RecordOutcome:
        self.calls += 1
        if self.down.is_set():
            raise LedgerUnavailable("connection refused")
        if self.reject_batch is not None and any(
                isinstance(r, BatchRecord) and r.batch.batch_id == self.reject_batch for r in records):
            raise LedgerError("value out of range")
        self.records.extend(records)
        return RecordOutcome(len(records))

    def report_health(self, listener_id, pipeline, host, counters, last_error):  # type: ignore[no-untyped-def]
        self.health.append(dict(counters))

    def batch_ids(self) -> list[int]:
        return [r.batch.batch_id for r in self.records if isinstance(r, BatchRecord)]


def writer(store: FakeStore, tmp_path: Path, *, ledger: str | None = None, **kw) -> EventWriter:  # type: ignore[no-untyped-def]
    """A writer over ``store`` whose spool names the ledger at ``ledger`` (a DSN; default a SQLite file);
    the ``WriterOptions`` fields among ``kw`` become its options (fast retries unless given)."""
    fields = {f.name for f in dataclasses.fields(WriterOptions)}
    options = {"initial_backoff": 0.01, "max_backoff": 0.05, **{k: kw.pop(k) for k in list(kw) if k in fields}}
    address = LedgerAddress(ledger or f"sqlite:///{tmp_path / 'ledger.db'}")
    return EventWriter(address, spool_dir=tmp_path / "spool", options=WriterOptions(**options),
                       store_factory=lambda: store, **kw)


def test_events_become_records_in_order(tmp_path: Path) -> None:
    store = FakeStore()
    w = writer(store, tmp_path)
    w.submit(ev("started", started()))
    for i in range(5):
        w.submit(ev("progress", progress(i)))
    w.submit(ev("idle", json.dumps({"id": QID, "runId": RID, "timestamp": "2026-11-22T20:43:00.000Z"})))
    w.submit(ev("terminated", json.dumps({"id": QID, "runId": RID, "exception": "boom"})))
    assert w.close(5)
    kinds = [type(r).__name__ for r in store.records]
    assert kinds == ["RunStart"] + ["BatchRecord"] * 5 + ["RunHeartbeat", "RunEnd"]
    assert store.batch_ids() == [0, 1, 2, 3, 4]
    start = store.records[0]
    assert isinstance(start, RunStart) and (start.pipeline, start.consumer_group, start.app_version) == (
        "orders", "orders", "1.0")
    end = store.records[-1]
    assert isinstance(end, RunEnd) and end.pipeline == "orders" and end.exception == "boom"
    health = w.health()
    assert (health.queued, health.written, health.failed, health.spilled, health.pending) == (8, 8, 0, 0, 0)
    assert w.settled_batch(QID) == 4 and w.is_terminated(QID)


def test_listener_settings_override_the_query_name(tmp_path: Path) -> None:
    store = FakeStore()
    w = writer(store, tmp_path)
    w.submit(ev("progress", progress(0), pipeline="billing", group="billing-etl"))
    assert w.close(5)
    (rec,) = store.records
    assert isinstance(rec, BatchRecord) and (rec.pipeline, rec.consumer_group) == ("billing", "billing-etl")


def test_no_data_progress_is_a_heartbeat(tmp_path: Path) -> None:
    store = FakeStore()
    w = writer(store, tmp_path)
    w.submit(ev("progress", progress(3, rows=0, start=40, end=40)))
    assert w.close(5)
    assert [type(r) for r in store.records] == [RunHeartbeat]
    assert w.settled_batch(QID) == 3


def test_unnamed_query_is_logged_once_and_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = FakeStore()
    w = writer(store, tmp_path)
    with caplog.at_level(logging.WARNING, logger="offset_ledger"):
        w.submit(ev("started", started(name=None)))
        for i in range(3):
            w.submit(ev("progress", progress(i, name=None)))
        assert w.close(5)
    assert store.records == []
    assert sum("has no name" in r.getMessage() for r in caplog.records) == 1
    assert w.health().skipped == 4 and w.health().failed == 0


def test_malformed_event_is_counted_and_the_rest_written(tmp_path: Path) -> None:
    store = FakeStore()
    w = writer(store, tmp_path)
    w.submit(ev("progress", progress(0)))
    w.submit(ev("progress", "{not json"))
    w.submit(ev("progress", progress(1)))
    assert w.close(5)
    assert store.batch_ids() == [0, 1]
    health = w.health()
    assert health.failed == 1 and "unparsable" in (health.last_error or "")


def test_a_rejected_record_is_isolated(tmp_path: Path) -> None:
    store = FakeStore()
    store.reject_batch = 1
    w = writer(store, tmp_path, autostart=False)
    for i in range(3):
        w.submit(ev("progress", progress(i)))
    w.start()
    assert w.close(5)
    assert store.batch_ids() == [0, 2]
    assert (w.health().failed, w.health().written) == (1, 2)


def test_database_down_retries_spills_and_replays_in_order(tmp_path: Path) -> None:
    store = FakeStore()
    store.down.set()
    w = writer(store, tmp_path, queue_size=5, max_batch_events=3)
    n = 40
    for i in range(n):
        w.submit(ev("progress", progress(i)))
    assert not w.flush(0.3)  # nothing can be durable while the database is down
    health = w.health()
    assert health.retried > 0 and health.spilled > 0 and health.written == 0
    assert health.last_error and "connection refused" in health.last_error
    assert list((tmp_path / "spool").glob("*.jsonl"))
    store.down.clear()
    for i in range(n, n + 5):  # events keep coming during recovery
        w.submit(ev("progress", progress(i)))
    assert w.flush(10)
    assert store.batch_ids() == list(range(n + 5))
    assert w.health().written == n + 5 and w.health().pending == 0
    assert w.close(5)
    assert list((tmp_path / "spool").iterdir()) == []


def test_callbacks_do_not_wait_for_a_slow_database(tmp_path: Path) -> None:
    store = FakeStore()
    store.down.set()
    w = writer(store, tmp_path, queue_size=10)
    times = []
    for i in range(200):
        t0 = time.perf_counter()
        w.submit(ev("progress", progress(i)))
        times.append(time.perf_counter() - t0)
    assert max(times) < 0.25  # a write attempt against the dead database is never on this path
    store.down.clear()
    assert w.close(10)
    assert store.batch_ids() == list(range(200))


def test_close_while_down_keeps_events_for_the_next_listener(tmp_path: Path) -> None:
    store = FakeStore()
    store.down.set()
    w = writer(store, tmp_path, queue_size=4)
    for i in range(10):
        w.submit(ev("progress", progress(i)))
    assert not w.close(0.5)
    assert store.batch_ids() == []
    spooled = [line for p in (tmp_path / "spool").iterdir() for line in p.read_text().splitlines()]
    assert sum(not is_header(line) for line in spooled) == 10
    store.down.clear()
    again = writer(store, tmp_path)  # same spool directory: adopts the orphaned file
    assert again.close(5)
    assert store.batch_ids() == list(range(10))
    assert list((tmp_path / "spool").iterdir()) == []


def test_health_is_reported_to_the_store(tmp_path: Path) -> None:
    store = FakeStore()
    w = writer(store, tmp_path, health_interval=0.0)
    w.submit(ev("progress", progress(0)))
    assert w.close(5)
    assert store.health and store.health[-1]["written"] == 1


class _Broken:
    @property
    def progress(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("py4j gone")


def test_listener_callbacks_never_raise(tmp_path: Path) -> None:
    store = FakeStore()
    listener = OffsetLedgerListener(pipeline="orders", spool_dir=tmp_path, store_factory=lambda: store)
    listener.onQueryProgress(_Broken())
    listener.onQueryStarted(object())
    listener.accept_json("progress", progress(0))
    assert listener.flush(5)
    assert store.batch_ids() == [0]
    assert listener.health().failed == 2
    assert listener.close(5)


def test_writer_on_a_real_sqlite_ledger_is_idempotent(tmp_path: Path) -> None:
    from offset_ledger.ledger.tables import batch_offsets, findings, positions

    dsn = f"sqlite:///{tmp_path / 'ledger.db'}"
    listener = OffsetLedgerListener(dsn=dsn, spool_dir=tmp_path / "spool")
    listener.accept_json("started", started())
    for i in range(3):
        listener.accept_json("progress", progress(i))
    listener.accept_json("progress", progress(1))  # a duplicate delivery
    listener.accept_json("progress", progress(7, query="33333333-3333-3333-3333-333333333333",
                                              start=5, end=12))  # a stale zombie batch
    assert listener.close(10)
    from offset_ledger.ledger.engine import make_engine

    engine = make_engine(dsn)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(batch_offsets)).scalar() == 4
        assert conn.execute(select(positions.c.next_offset)).scalar() == 30
        assert [r.kind for r in conn.execute(select(findings))] == ["regression"]
    engine.dispose()


def test_closing_a_writer_that_never_ran_keeps_its_events(tmp_path: Path) -> None:
    store = FakeStore()
    idle = writer(store, tmp_path, autostart=False)
    idle.submit(ev("progress", progress(0)))
    assert not idle.close(0.2)
    again = writer(store, tmp_path)
    assert again.close(5)
    assert store.batch_ids() == [0]


def test_an_idle_writer_sleeps_until_an_event_comes(tmp_path: Path) -> None:
    """A listener lives as long as its job, mostly between batches: its thread must not poll the queue."""
    store = FakeStore()
    w = writer(store, tmp_path)
    looks = []
    look = w._next_spooled
    w._next_spooled = lambda: (looks.append(1), look())[1]  # type: ignore[method-assign]  # runs on every empty wake
    time.sleep(1.5)
    assert len(looks) <= 3, f"{len(looks)} wakes of an idle writer in 1.5 s"
    w.submit(ev("progress", progress(0)))
    assert w.flush(5) and store.batch_ids() == [0]
    assert w.close(5) and not w._thread.is_alive()


def test_a_waiter_returns_when_the_thread_ends_not_at_its_deadline(tmp_path: Path) -> None:
    w = writer(FakeStore(), tmp_path)
    returned: list[bool] = []
    waiter = threading.Thread(target=lambda: returned.append(w.wait_for(lambda: False, time.monotonic() + 60)))
    waiter.start()
    time.sleep(0.2)  # waiting: nothing will ever satisfy it, nothing settles
    assert w.close(5)
    waiter.join(10)
    assert returned == [False], "wait_for still waiting after the writer thread ended"
