"""The ledger's write side on real Postgres: the same scenarios as on SQLite, plus concurrency."""

from __future__ import annotations


import pytest
from sqlalchemy.engine import Engine

from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.fast_batch import FastBatchPath
from offset_ledger.ledger.recorder import Recorder
from tests.unit.ledger.test_findings_sqlite import FINDING_SCENARIOS
from tests.unit.ledger.test_recorder_sqlite import SCENARIOS, batch, position_map, rec, start


@pytest.mark.parametrize("scenario", SCENARIOS + FINDING_SCENARIOS, ids=lambda f: f.__name__.removeprefix("check_"))
def test_recorder_on_postgres(scenario, ledger: Engine) -> None:  # type: ignore[no-untyped-def]
    scenario(ledger)


def test_two_writers_of_the_same_batches_stay_idempotent(ledger: Engine) -> None:
    """Two listeners on one query (registered twice by mistake) write each batch once."""
    first, second = Recorder(ledger), Recorder(ledger)
    b0 = batch(0, {("t", p): (None, 10) for p in range(50)})
    b1 = batch(1, {("t", p): (10, 20) for p in range(50)})
    first.record([start(), rec(b0)])
    second.record([start(), rec(b0), rec(b1)])
    out = first.record([rec(b1)])
    assert out.batches_written == 0 and out.duplicates == 1 and out.findings == ()
    assert position_map(ledger) == {("t", p): 20 for p in range(50)}


def test_large_batches_take_the_copy_path_with_awkward_names(ledger: Engine) -> None:
    """300 partitions go through COPY + INSERT ... SELECT ON CONFLICT; CSV quoting must hold."""
    from sqlalchemy import func, select

    from offset_ledger.ledger.records import BatchRecord
    from offset_ledger.ledger.tables import batch_offsets, positions

    pipeline = 'orders, "eu"\nline2\\x'
    parts = range(300)
    b0 = batch(0, {("t,1", p): (None, 10 + p) for p in parts})
    b1 = batch(1, {("t,1", p): (10 + p, 20 + p) for p in parts})
    Recorder(ledger).record([BatchRecord(pipeline, pipeline, b0), BatchRecord(pipeline, pipeline, b1)])
    out = Recorder(ledger).record([BatchRecord(pipeline, pipeline, b1)])  # re-delivery
    assert (out.batches_written, out.duplicates) == (0, 1)
    with ledger.connect() as conn:
        assert conn.execute(select(func.count()).select_from(batch_offsets)).scalar() == 600
        got = {(r.topic, r.partition): r.next_offset
               for r in conn.execute(select(positions).where(positions.c.pipeline == pipeline))}
        first = conn.execute(select(batch_offsets).where(batch_offsets.c.batch_id == 0,
                                                         batch_offsets.c.partition == 7)).one()
    assert got == {("t,1", p): 20 + p for p in parts}
    assert (first.pipeline, first.from_offset, first.until_offset) == (pipeline, None, 17)


def _replay_isolated_batches(engine: Engine) -> tuple[list, dict]:
    """One batch per record() call, as a listener that keeps up writes them, through every rule."""
    from datetime import timedelta

    from sqlalchemy import select

    from offset_ledger.ledger.tables import (
        batch_offsets,
        batches,
        findings,
        positions,
        runs,
    )
    from offset_ledger.rules.model import PartitionRange, SourceProgress
    from tests.unit.ledger.test_recorder_sqlite import T0, _pending_reset

    odd = 'a"b\\c,{d} é'  # quote, backslash, comma, braces, space, non-ASCII: array-literal quoting
    mine, other = Recorder(engine), Recorder(engine)
    outcomes = []

    def put(recorder: Recorder, *records) -> None:  # type: ignore[no-untyped-def]
        out = recorder.record(list(records))
        outcomes.append((out.batches_written, out.duplicates, [(f.kind, f.topic, f.partition) for f in out.findings]))

    put(mine, start(), rec(batch(0, {("t", 0): (None, 10), ("t", 1): (None, 10), (odd, 0): (None, 5)})))
    put(mine, rec(batch(1, {("t", 0): (10, 20), ("t", 1): (12, 20), (odd, 0): (5, 9)})))  # gap on t-1
    # A zombie query of the same pipeline runs ahead on t-0, then this query ends behind it.
    put(other, start(run="rz", query="qz"), rec(batch(0, {("t", 0): (None, 25)}, query="qz", run="rz")))
    put(other, rec(batch(1, {("t", 0): (25, 26)}, query="qz", run="rz")))
    put(mine, rec(batch(2, {("t", 0): (20, 22), ("t", 1): (20, 30), (odd, 0): (9, 9)})))  # regression on t-0
    _pending_reset(engine, 1, 40, T0 + timedelta(hours=1))
    put(mine, rec(batch(3, {("t", 0): (22, 50), ("t", 1): (30, 31)})))  # the run predates the reset
    put(mine, start(run="r2", at=T0 + timedelta(hours=2)))
    put(mine, rec(batch(4, {("t", 0): (None, 45), ("t", 1): (None, 39)}, run="r2")))  # newer run: forward rule
    put(other, rec(batch(5, {("t", 0): (45, 46)}, run="r2")))  # a second writer records batch 5 first...
    put(mine, rec(batch(5, {("t", 0): (45, 46)}, run="r2")))  # ...so ours is a duplicate
    self_union = SourceProgress(1, "KafkaV2[Subscribe[t]]", (PartitionRange("t", 0, 46, 60),), 14)
    # Gap on source 0 against batch 5, which the other writer recorded (our own last is batch 4: it
    # ended t-0 at 45, and batch 6 starting at 46 there was once taken for a gap).
    put(mine, rec(batch(6, {("t", 0): (47, 55)}, run="r2", extra_sources=(self_union,))))
    self_union = SourceProgress(1, "KafkaV2[Subscribe[t]]", (PartitionRange("t", 0, 60, 61),), 1)
    put(mine, rec(batch(7, {("t", 0): (55, 70), ("t", 1): (39, 41), (odd, 0): (9, 45)}, run="r2",
                        extra_sources=(self_union,))))
    with engine.connect() as conn:
        tables = {
            "batches": sorted((r.query_id, r.batch_id, r.run_id, r.input_rows) for r in conn.execute(select(batches))),
            "offsets": sorted(tuple(r)[2:9] for r in conn.execute(select(batch_offsets))),  # query id .. until
            "positions": sorted((r.topic, r.partition, r.next_offset, r.query_id, r.batch_id, r.reset_id)
                                for r in conn.execute(select(positions))),
            "findings": [(r.kind, r.topic, r.partition, r.query_id, r.batch_id, r.expected_offset,
                          r.actual_offset, r.message, r.details)
                         for r in conn.execute(select(findings).order_by(findings.c.id))],
            "runs": sorted((r.run_id, r.last_batch_id) for r in conn.execute(select(runs))),
        }
    return outcomes, tables


def test_isolated_batches_take_one_statement_and_match_the_general_path(
        ledger: Engine, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The Postgres one-statement path keeps every rule: same ledger as the general path on SQLite.

    Batches it must not decide alone (a regression, a pending reset, a batch another writer recorded)
    abort it, leaving nothing behind, and go the general way; gaps never take it.
    """
    fast_calls = []
    record_fast = FastBatchPath.record

    def counting(self, conn, recs, txn):  # type: ignore[no-untyped-def]
        out = record_fast(self, conn, recs, txn)
        fast_calls.extend((r.batch.query_id, r.batch.batch_id, out is not None) for r in recs)
        return out

    monkeypatch.setattr(FastBatchPath, "record", counting)
    pg_outcomes, pg_tables = _replay_isolated_batches(ledger)
    # Batch 4 starts a fresh checkpoint (no start offsets: the general path fills them) and batch 7
    # moves a position a reset still holds (the legacy rule decides that on the general path). The
    # zombie's batch 1 moves t-0 only, not every partition of the topic's row, whose partitions two
    # queries placed (two movers since 0024): the general path's too.
    assert fast_calls == [("qz", 1, False), ("q1", 2, False), ("q1", 3, False), ("q1", 5, False),
                          ("q1", 7, False)]
    sqlite_engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(sqlite_engine)
    fast_calls.clear()
    lite_outcomes, lite_tables = _replay_isolated_batches(sqlite_engine)
    sqlite_engine.dispose()
    assert fast_calls == []
    assert pg_outcomes == lite_outcomes
    assert pg_tables == lite_tables
    assert [kind for _, _, found in pg_outcomes for kind, _, _ in found] == [
        "gap", "regression", "pending_reset", "pending_reset", "regression", "gap",
        # Batch 7 (run r2 started after the reset, but not from it) moves t-1 and the odd topic past it.
        "reset_overtaken", "reset_overtaken"]
    assert pg_outcomes[-3] == (0, 1, [])
    assert [f[7] for f in pg_tables["findings"] if f[0] == "gap"][-1] == "batch 6 of t-0 starts at 47 but batch 5 ended at 46"
    # A self-union's position is the lower end of its two sources (70 and 61): neither skips on restart.
    assert ("t", 0, 61, "q1", 7, None) in pg_tables["positions"]
    assert ("r2", 7) in pg_tables["runs"]  # last_batch_id, written by the one statement


def test_a_vanished_prepared_statement_falls_back_to_the_general_path(ledger: Engine) -> None:
    """Behind a transaction pooler the one-round-trip statement's PREPARE does not persist."""
    from sqlalchemy import text

    recorder = Recorder(ledger)
    recorder.record([start(), rec(batch(0, {("t", 0): (None, 10)}))])
    recorder.record([rec(batch(1, {("t", 0): (10, 20)}))])  # prepares and uses the statement
    assert recorder._conn is not None
    recorder._conn.execute(text("DEALLOCATE ALL"))  # what a pooler's next server connection looks like
    recorder._conn.commit()
    out = recorder.record([rec(batch(2, {("t", 0): (20, 30)}))])
    assert out.batches_written == 1 and out.findings == ()
    assert recorder._fast is not None and recorder._fast.usable is False
    recorder.record([rec(batch(3, {("t", 0): (30, 40)}))])
    assert position_map(ledger) == {("t", 0): 40}
    recorder.close()


def test_the_one_statement_path_keeps_foreign_runs_off_every_position(ledger: Engine, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A foreign run's steady batches qualify for the fast path; it must refuse even a partition
    nobody has a position on yet (an insert, not an update), and the general path says why."""
    from offset_ledger.ledger import generations as gens
    from offset_ledger.ledger.records import RunStart
    from tests.unit.ledger.test_recorder_sqlite import T0, finding_rows

    with ledger.begin() as conn:
        gen, _ = gens.create_generation(conn, gens.NewGeneration(
                                        pipeline="orders", consumer_group="orders", checkpoint_root="/c",
                                        app_version="1", reason="test", starting_offsets={"t": {"0": 0}},
                                        resolved_offsets={"t": {"0": 0}}))
    fast_calls = []
    record_fast = FastBatchPath.record

    def counting(self, conn, recs, txn):  # type: ignore[no-untyped-def]
        out = record_fast(self, conn, recs, txn)
        fast_calls.extend((r.batch.query_id, r.batch.batch_id, out is not None) for r in recs)
        return out

    monkeypatch.setattr(FastBatchPath, "record", counting)
    mine, other = Recorder(ledger), Recorder(ledger)
    mine.record([RunStart("orders", "orders", "q1", "r1", "orders", T0, checkpoint_location="file:" + gen.location)])
    mine.record([rec(batch(0, {("t", 0): (None, 10)}))])
    mine.record([rec(batch(1, {("t", 0): (10, 20)}))])
    other.record([RunStart("orders", "orders", "qf", "rf", "orders", T0, checkpoint_location="/copy/of/it")])
    other.record([rec(batch(0, {("t", 0): (0, 50)}, query="qf", run="rf"))])
    other.record([rec(batch(1, {("t", 1): (0, 9)}, query="qf", run="rf"))])  # only a partition with no position
    mine.close()
    other.close()
    assert fast_calls == [("q1", 1, True), ("qf", 1, False)]
    assert position_map(ledger) == {("t", 0): 20}
    assert [f.kind for f in finding_rows(ledger)] == ["foreign_run"]
