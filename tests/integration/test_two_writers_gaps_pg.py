"""Two writers of one query on real Postgres: the gap check judges each batch against the batch
before it in the ledger, never against what one writer last wrote itself (issue: false ``gap``).

Production has two writers of one query: the listener beside a transactional sink (which records
each batch in its own transaction through ``record_in_transaction``), a spool replay beside the
live listener, two listener processes. Each writes the batches in order. A false ``gap`` pages an
operator about lost records that were not lost; a real one must still be found. The oracle is one
writer recording the same batches in order, uninterrupted.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select, text
from sqlalchemy.engine import Engine

from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.recorder import Recorder, record_in_transaction
from offset_ledger.ledger.records import RunStart
from offset_ledger.ledger.tables import findings
from tests.unit.ledger.test_recorder_sqlite import T0, batch, rec, start

PARTS = [("t", 0), ("t", 1)]


def _batches(count: int, *, hole_at: int | None = None, query: str = "q1", run: str = "r1") -> list:
    """Batches 0..count-1 of one query, each starting where the one before ended, except batch
    ``hole_at``, which starts 3 records past it on t-1 (a real gap)."""
    ends = {k: 0 for k in PARTS}
    out = []
    for batch_id in range(count):
        ranges = {}
        for k in PARTS:
            begin = None if batch_id == 0 else ends[k] + (3 if batch_id == hole_at and k == ("t", 1) else 0)
            ranges[k] = (begin, (begin or 0) + 2 + (batch_id + k[1]) % 3)
            ends[k] = ranges[k][1]
        out.append(batch(batch_id, ranges, query=query, run=run))
    return out


def _gaps(engine: Engine, query: str = "q1") -> list[tuple]:
    with engine.connect() as conn:
        rows = conn.execute(select(findings).where(findings.c.query_id == query).order_by(findings.c.id))
        return [(r.kind, r.batch_id, r.topic, r.partition, r.expected_offset, r.actual_offset,
                 (r.details or {}).get("previous_batch_id")) for r in rows]


def test_a_writer_whose_last_batch_is_stale_finds_no_false_gap_and_the_real_one_against_its_predecessor(
        ledger: Engine) -> None:
    """No concurrency at all: the listener wrote batch 0, the sink batch 1 (the listener's copy of
    it a duplicate), the listener writes batch 2: batch 1, not its own batch 0, is the one before.
    Then the sink writes batch 3, past batch 2's end: one gap, against batch 2."""
    b = _batches(4, hole_at=3)
    listener, sink = Recorder(ledger), Recorder(ledger)
    listener.record([start(), rec(b[0])])
    sink.record([start(), rec(b[0])])
    sink.record([rec(b[1])])
    assert listener.record([rec(b[1])]).duplicates == 1
    out = listener.record([rec(b[2])])
    assert (out.batches_written, out.findings) == (1, ())
    sink.record([rec(b[2])])
    out = sink.record([rec(b[3])])
    assert [f.kind for f in out.findings] == ["gap"]
    end_2 = b[2].sources[0].ranges[1].until_offset
    assert _gaps(ledger) == [("gap", 3, "t", 1, end_2, end_2 + 3, 2)]
    listener.close(), sink.close()


def _waiting_on_a_lock(engine: Engine, thread: threading.Thread) -> None:
    """Return once ``thread`` finished or another session waits for a lock (at most 20 s)."""
    with engine.connect() as conn:
        deadline = time.monotonic() + 20
        while thread.is_alive() and time.monotonic() < deadline:
            if conn.execute(text("SELECT count(*) FROM pg_locks WHERE NOT granted")).scalar():
                return
            conn.rollback()
            time.sleep(0.02)


@pytest.mark.parametrize("hole", [False, True], ids=["contiguous", "real_gap"])
def test_a_batch_written_while_the_one_before_is_uncommitted_waits_and_judges_against_it(
        ledger: Engine, hole: bool) -> None:
    """A sink's transaction has written batch 2 and not committed yet; the listener (which wrote
    batch 1) records batch 3 meanwhile. Batch 3 must be judged against batch 2, which the
    listener cannot see until the sink commits: it waits for the pipeline lock, then reads it.
    No finding when batch 3 starts where batch 2 ended; one gap against batch 2 when it starts
    past it. The sink's own record of batch 2 and the listener's duplicate of it find nothing."""
    b = _batches(4, hole_at=3 if hole else None)
    listener = Recorder(ledger)
    listener.record([start(), rec(b[0])])
    listener.record([rec(b[1])])
    sink_conn = ledger.connect()
    sink_txn = sink_conn.begin()
    out = record_in_transaction(sink_conn, [rec(b[2])], now=T0 + timedelta(minutes=5))
    assert (out.batches_written, out.findings) == (1, ())
    result: list = []
    thread = threading.Thread(target=lambda: result.append(listener.record([rec(b[3])])))
    thread.start()
    _waiting_on_a_lock(ledger, thread)
    waited = thread.is_alive()  # the listener's batch 3 waits for the sink's commit
    sink_txn.commit()
    thread.join(30)
    sink_conn.close()
    assert not thread.is_alive() and len(result) == 1
    assert listener.record([rec(b[2])]).duplicates == 1
    end_2 = b[2].sources[0].ranges[1].until_offset
    assert _gaps(ledger) == ([("gap", 3, "t", 1, end_2, end_2 + 3, 2)] if hole else [])
    assert waited
    listener.close()


# ------------------------------------------------------------------ any interleaving, against the oracle

_case = itertools.count()


@pytest.fixture(scope="module")
def shared_engine(stack) -> Iterator[Engine]:  # type: ignore[no-untyped-def]
    from tests.integration.conftest import fresh_database

    with fresh_database(stack, "two_writers_gaps_pg") as dsn:
        eng = make_engine(dsn)
        ensure_schema(eng)
        yield eng
        eng.dispose()


@st.composite
def interleavings(draw) -> tuple[int, int | None, list[tuple[int, int]]]:  # type: ignore[no-untyped-def]
    """(batch count, the batch starting past its predecessor's end or None, the calls in order:
    (writer, how many of its next batches) until both wrote every batch)."""
    count = draw(st.integers(3, 9))
    hole = draw(st.none() | st.integers(1, count - 1))
    done, calls = [0, 0], []
    while done != [count, count]:
        writer = draw(st.sampled_from([w for w in (0, 1) if done[w] < count]))
        n = draw(st.integers(1, min(3, count - done[writer])))
        calls.append((writer, n))
        done[writer] += n
    return count, hole, calls


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(interleavings())
def test_two_writers_in_any_interleaving_find_what_one_uninterrupted_writer_finds(
        shared_engine: Engine, case: tuple[int, int | None, list[tuple[int, int]]]) -> None:
    """Two recorders (each on the one-statement path where it can, else the general path) write the
    same batches in order, their calls interleaved at random, folding 1-3 batches a call: the
    findings are exactly those of one recorder writing them alone."""
    count, hole, calls = case
    n = next(_case)
    oracle_query, query = f"oracle-{n}", f"two-{n}"
    oracle = Recorder(shared_engine)
    oracle.record([RunStart(oracle_query, oracle_query, oracle_query, f"o{n}", "orders", T0, app_version="1")])
    for b in _batches(count, hole_at=hole, query=oracle_query, run=f"o{n}"):
        oracle.record([rec(b, oracle_query)])
    oracle.close()
    writers = [Recorder(shared_engine), Recorder(shared_engine)]
    for w in writers:
        w.record([RunStart(query, query, query, f"w{n}", "orders", T0, app_version="1")])
    mine = _batches(count, hole_at=hole, query=query, run=f"w{n}")
    done = [0, 0]
    for writer, k in calls:
        writers[writer].record([rec(b, query) for b in mine[done[writer]:done[writer] + k]])
        done[writer] += k
    for w in writers:
        w.close()
    expected = _gaps(shared_engine, oracle_query)
    assert [f[0] for f in expected] == (["gap"] if hole is not None else [])
    assert _gaps(shared_engine, query) == expected


def test_a_batch_another_writer_recorded_past_this_writers_last_is_judged_never_a_silent_duplicate(
        ledger: Engine) -> None:
    """The listener last wrote batch 0; the sink wrote batch 1. The listener's batch 1 is newer than
    anything it wrote, so it is not looked up before the write: the write skips it, and it is then
    judged against the sink's row like any recorded batch (different offsets: an ``other`` finding;
    the same: a plain duplicate)."""
    b = _batches(2)
    listener, sink = Recorder(ledger), Recorder(ledger)
    listener.record([start(), rec(b[0])])
    sink.record([start(), rec(b[0]), rec(b[1])])
    moved = {k: (f, u + 5) for (k, (f, u)) in
             {(r.topic, r.partition): (r.from_offset, r.until_offset) for r in b[1].sources[0].ranges}.items()}
    other = batch(1, moved)
    out = listener.record([rec(other)])
    assert (out.batches_written, out.duplicates) == (0, 1)
    assert [(f.kind, f.message) for f in out.findings] == [
        ("other", "a recorded batch was reported again with different offsets")]
    third = Recorder(ledger)
    third.record([rec(b[0])])
    out = third.record([rec(b[1])])
    assert (out.batches_written, out.duplicates, out.findings) == (0, 1, ())
