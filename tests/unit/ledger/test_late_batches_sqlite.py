"""Issue 47, case 5: a duplicate is a duplicate whichever writer lands first, and a late batch is late,
not a regression (SQLite here; tests/integration/test_late_batches_pg.py runs the same scenarios on
Postgres, where the listener's recorder tries the one-statement path first).

A listener and a transactional sink record the same query. The listener's report of batch N lands
after the sink committed N and N+1: the same ranges, so a duplicate. It used to be heard by the
position rules as a batch ending behind the position and stored as a ``regression`` against the live
listener run (which verify then takes for a zombie's extra reads). A ``regression`` is a batch whose
offsets go back against what the same query committed before it, or another query's batch behind the
position; a lower batch id of the same query landing after a higher one, its ranges tiling with the
recorded history, is late.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.recorder import Recorder, record_in_transaction
from offset_ledger.ledger.records import BatchRecord, RunStart
from offset_ledger.ledger.tables import findings, runs
from offset_ledger.rules.model import BatchOffsets
from tests.unit.ledger.test_recorder_sqlite import T0, batch, position_map, rec, start

SINK_RUN = "sink:q1"


def sink_record(engine: Engine, *bs: BatchOffsets) -> None:
    """What the Postgres sink records in its own transaction: the batch under its run, rows = the span."""
    with engine.begin() as conn:
        records: list = [BatchRecord("orders", "orders", replace(b, run_id=SINK_RUN, recorded_by="sink"))
                         for b in bs]
        if conn.execute(select(runs.c.run_id).where(runs.c.run_id == SINK_RUN)).first() is None:
            records.insert(0, RunStart("orders", "orders", "q1", SINK_RUN, None, T0))
        record_in_transaction(conn, records, now=T0 + timedelta(minutes=5))


def kinds(engine: Engine) -> list[tuple[str, int | None, str | None]]:
    with engine.connect() as conn:
        return [(r.kind, r.batch_id, r.run_id) for r in conn.execute(select(findings).order_by(findings.c.id))]


def history(count: int) -> list[BatchOffsets]:
    """Batches 0..count-1 of q1 on two partitions, each starting where the one before ended."""
    ends = {("t", 0): 0, ("t", 1): 100}
    out = []
    for b in range(count):
        step = {("t", 0): 5 + b, ("t", 1): 3 + 2 * b}
        out.append(batch(b, {k: (ends[k], ends[k] + step[k]) for k in ends}))
        ends = {k: ends[k] + step[k] for k in ends}
    return out


def ends_of(b: BatchOffsets) -> dict[tuple[str, int], int]:
    return {(r.topic, r.partition): r.until_offset for r in b.sources[0].ranges}


# ------------------------------------------------------------------ scenarios (shared with Postgres)


def check_listener_copy_after_the_sinks_next_batch_is_a_duplicate(engine: Engine) -> None:
    b = history(4)
    listener = Recorder(engine)
    listener.record([start(), rec(b[0])])
    sink_record(engine, b[1])
    sink_record(engine, b[2])
    out = listener.record([rec(b[1])])  # batch N lands after the sink's N+1, same offsets
    assert (out.batches_written, out.duplicates, out.findings) == (0, 1, ())
    out = listener.record([rec(b[2])])
    assert (out.batches_written, out.duplicates, out.findings) == (0, 1, ())
    out = listener.record([rec(b[3])])
    assert (out.batches_written, out.findings) == (1, ())
    assert kinds(engine) == []
    assert position_map(engine) == ends_of(b[3])
    listener.close()


def check_the_sink_landing_second_is_a_duplicate_too(engine: Engine) -> None:
    b = history(3)
    listener = Recorder(engine)
    listener.record([start(), rec(b[0]), rec(b[1]), rec(b[2])])
    sink_record(engine, b[1])
    sink_record(engine, b[0])
    assert kinds(engine) == []
    assert position_map(engine) == ends_of(b[2])
    listener.close()


def check_a_late_batch_that_tiles_is_neither_a_gap_nor_a_regression(engine: Engine) -> None:
    b = history(5)
    listener = Recorder(engine)
    listener.record([start(), rec(b[0])])
    listener.record([rec(b[2])])     # batch 1 is late (a spool replay brings it after batch 2)
    listener.record([rec(b[3]), rec(b[1])])
    Recorder(engine).record([rec(b[4])])
    assert kinds(engine) == []
    assert position_map(engine) == ends_of(b[4])
    listener.record([rec(b[1])])  # a duplicate of it later changes nothing either
    assert kinds(engine) == []
    with engine.connect() as conn:  # the run's last batch never goes back to a late one
        assert conn.execute(select(runs.c.last_batch_id).where(runs.c.run_id == "r1")).scalar() == 4
    listener.close()


def check_a_late_batch_that_does_not_tile_is_a_gap_with_its_successor_not_a_regression(engine: Engine) -> None:
    b = history(3)
    listener = Recorder(engine)
    listener.record([start(), rec(b[0]), rec(b[2])])
    # batch 1 ends 4 offsets past where batch 2 starts on t-0: batch 2 read them again
    late = b[1].sources[0].ranges
    wide = batch(1, {(r.topic, r.partition): (r.from_offset, r.until_offset + (4 if r.partition == 0 else 0))
                     for r in late})
    out = listener.record([rec(wide)])
    assert [(f.kind, f.topic, f.partition) for f in out.findings] == [("gap", "t", 0)]
    (gap,) = out.findings
    assert gap.details["next_batch_id"] == 2 and gap.details["reread_records"] == 4
    assert kinds(engine) == [("gap", 1, "r1")]
    assert position_map(engine) == ends_of(b[2])
    listener.close()


def check_offsets_going_back_in_the_same_query_are_still_a_regression(engine: Engine) -> None:
    b = history(2)
    listener = Recorder(engine)
    listener.record([start(), rec(b[0]), rec(b[1])])
    back = batch(2, {k: (u, u - 3) for k, u in ends_of(b[1]).items()})  # a higher batch ending behind
    out = listener.record([rec(back)])
    assert "regression" in [f.kind for f in out.findings]
    # and another query's batch behind the position (a zombie) stays one
    zombie = batch(9, {k: (0, 2) for k in ends_of(b[1])}, query="q-zombie", run="r-zombie")
    out = listener.record([rec(zombie)])
    assert [f.kind for f in out.findings] == ["regression", "regression"]
    listener.close()


SCENARIOS: list[Callable[[Engine], None]] = [
    check_listener_copy_after_the_sinks_next_batch_is_a_duplicate,
    check_the_sink_landing_second_is_a_duplicate_too,
    check_a_late_batch_that_tiles_is_neither_a_gap_nor_a_regression,
    check_a_late_batch_that_does_not_tile_is_a_gap_with_its_successor_not_a_regression,
    check_offsets_going_back_in_the_same_query_are_still_a_regression,
]


@pytest.fixture()
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine)
    yield engine
    engine.dispose()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__[len("check_"):])
def test_late_batches_on_sqlite(scenario: Callable[[Engine], None], sqlite_engine: Engine) -> None:
    scenario(sqlite_engine)
