"""Run liveness on an embedded SQLite ledger: a query's end ends its sink's run; heartbeats are throttled."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from offset_ledger.capture.event_records import IDLE, TERMINATED, EventConverter
from offset_ledger.capture.spool import Event
from offset_ledger.ledger.activity import last_ends, open_runs, verdict
from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.records import BatchRecord, RunEnd, RunHeartbeat, RunStart
from offset_ledger.ledger.tables import runs
from offset_ledger.rules.model import BatchOffsets, PartitionRange, SourceProgress

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)
S = timedelta(seconds=1)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine)
    yield engine
    engine.dispose()


def ended(engine: Engine) -> dict[str, datetime | None]:
    with engine.connect() as conn:
        return {r.run_id: r.terminated_at for r in conn.execute(select(runs.c.run_id, runs.c.terminated_at))}


def test_the_listener_seeing_a_query_end_ends_its_sink_run_and_its_silent_crashed_runs(engine: Engine) -> None:
    rec = Recorder(engine)
    try:
        rec.record([
            RunStart("p", "p", "q1", "killed", "p", T0),           # a SIGKILLed driver's run: no end event
            RunHeartbeat("p", "p", "q1", "killed", T0 + 5 * S),
            RunStart("p", "p", "q1", "sink:q1", None, T0 + 2 * S),  # the sink's record of the query
            RunHeartbeat("p", "p", "q1", "sink:q1", T0 + 40 * S),
            RunStart("p", "p", "q1", "last", "p", T0 + 30 * S),     # the run that ends normally
            RunStart("p", "p", "q2", "sink:q2", None, T0),          # another query's sink run: untouched
            RunStart("p", "p", "q1", "later", "p", T0 + 45 * S),   # heard after the end: not ended by it
            RunHeartbeat("p", "p", "q1", "later", T0 + 60 * S),
        ], now=T0 + 60 * S)
        rec.record([RunEnd("p", "p", "q1", "last", T0 + 50 * S)], now=T0 + 61 * S)
    finally:
        rec.close()
    got = ended(engine)
    assert got["last"] is not None and got["sink:q1"] is not None and got["killed"] is not None
    assert got["sink:q2"] is None and got["later"] is None
    with engine.connect() as conn:
        acts = open_runs(conn, "p", now=T0 + 62 * S)[("p", "p")]
        assert {a.run_id for a in acts} == {"sink:q2", "later"}
        assert last_ends(conn, "p")[("p", "p")][0] == "last"  # the listener's end, not its sink echo


def test_a_restart_pass_closing_its_own_run_ends_nothing_else(engine: Engine) -> None:
    rec = Recorder(engine)
    try:
        rec.record([RunStart("p", "p", "q1", "live", "p", T0), RunHeartbeat("p", "p", "q1", "live", T0 + S),
                    RunStart("p", "p", "q1", "checkpoint:q1", None, T0)], now=T0)
        rec.record([RunEnd("p", "p", "q1", "checkpoint:q1", T0 + 2 * S)], now=T0 + 2 * S)
    finally:
        rec.close()
    assert ended(engine)["live"] is None


def test_a_sink_only_pipeline_is_uncertain_with_its_reason(engine: Engine) -> None:
    rec = Recorder(engine)
    try:
        rec.record([RunStart("p", "p", "q1", "sink:q1", None, T0), RunHeartbeat("p", "p", "q1", "sink:q1", T0)],
                   now=T0)
    finally:
        rec.close()
    with engine.connect() as conn:
        acts = open_runs(conn, "p", now=T0 + 12 * S)[("p", "p")]
    judged = verdict(acts, None, now=T0 + 12 * S)
    assert judged.state == "uncertain"
    assert judged.reason == "no listener: running inferred from the last batch 12 s ago from run sink:q1 (bound 10 min)"


def test_the_longest_gap_is_recorded_and_only_grows(engine: Engine) -> None:
    rec = Recorder(engine)
    try:
        rec.record([RunStart("p", "p", "q1", "r1", "p", T0), RunHeartbeat("p", "p", "q1", "r1", T0, 30_000)], now=T0)
        rec.record([RunHeartbeat("p", "p", "q1", "r1", T0 + S, 20_000)], now=T0)
        # A heartbeat for a run the ledger never saw start makes its row, gap included.
        rec.record([RunHeartbeat("p", "p", "q9", "r9", T0, 7_000)], now=T0)
    finally:
        rec.close()
    with engine.connect() as conn:
        gaps = dict(conn.execute(select(runs.c.run_id, runs.c.max_gap_ms)).all())
    assert gaps == {"r1": 30_000, "r9": 7_000}


def idle(at: datetime, run: str = "r1") -> Event:
    return Event(IDLE, json.dumps({"id": "q1", "runId": run, "timestamp": at.isoformat().replace("+00:00", "Z")}),
                 at.timestamp(), "p", None, None)


def test_idle_events_are_throttled_but_a_longer_gap_is_always_written() -> None:
    conv = EventConverter(None, None, lambda _m: None)
    written = []
    for i in range(0, 200):  # an idle event every 100 ms for 20 s (noDataProgressEventInterval=100ms)
        recs, _ = conv.convert(idle(T0 + i * S / 10))
        written += recs
    # The first, the first gap seen (100 ms), then one every 5 s: 5 writes instead of 200.
    assert [r.at for r in written] == [T0, T0 + S / 10, T0 + 5.1 * S, T0 + 10.1 * S, T0 + 15.1 * S]
    assert [r.max_gap_ms for r in written] == [None, 100, None, None, None]
    recs, _ = conv.convert(idle(T0 + 35 * S))  # 15 s of silence: a longer gap, written at once
    assert len(recs) == 1 and recs[0].max_gap_ms == 15_100
    recs, _ = conv.convert(Event(TERMINATED, json.dumps({"id": "q1", "runId": "r1", "exception": None}),
                                 (T0 + 36 * S).timestamp(), "p", None, None))
    assert isinstance(recs[0], RunEnd)
    # The cost per idle event of deciding: a few microseconds (it runs on the writer thread).
    events = [idle(T0 + 40 * S + i * S / 100) for i in range(2000)]
    began = time.perf_counter()
    for e in events:
        conv.convert(e)
    assert (time.perf_counter() - began) / len(events) < 0.001


def test_a_listener_run_whose_batches_the_sink_recorded_first_is_heard_and_its_longest_batch_kept(
        engine: Engine) -> None:
    def batch(run: str, batch_id: int, at: datetime, ms: int) -> BatchRecord:
        src = (SourceProgress(0, "KafkaV2[Subscribe[t]]", (PartitionRange("t", 0, batch_id * 10, batch_id * 10 + 10),), 10),)
        return BatchRecord("p", "p", BatchOffsets("q1", run, "p", batch_id, at, 10, src, ms,
                                                  recorded_by="sink" if run.startswith("sink:") else None))

    rec = Recorder(engine)
    try:
        rec.record([RunStart("p", "p", "q1", "r1", "p", T0)], now=T0)
        rec.record([RunStart("p", "p", "q1", "sink:q1", None, T0), batch("sink:q1", 0, T0 + S, 40_000)], now=T0)
        rec.record([batch("r1", 0, T0 + S, 40_000)], now=T0 + 2 * S)  # the listener's report of it: a duplicate
        rec.record([batch("r1", 0, T0 + S, 40_000)], now=T0 + 3 * S)  # re-delivered: nothing moves backwards
    finally:
        rec.close()
    with engine.connect() as conn:
        row = conn.execute(select(runs.c.last_heartbeat_at, runs.c.max_batch_ms).where(runs.c.run_id == "r1")).one()
    assert row.max_batch_ms == 40_000 and row.last_heartbeat_at.replace(tzinfo=timezone.utc) == T0 + S
