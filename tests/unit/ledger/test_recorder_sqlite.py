"""The ledger's write side on an embedded SQLite file (the same checks run on Postgres too)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.engine import Engine

from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.records import BatchRecord, RunEnd, RunHeartbeat, RunStart
from offset_ledger.ledger.tables import batch_offsets, batches, findings, listener_health, positions, resets, runs
from offset_ledger.rules.model import BatchOffsets, PartitionRange, SourceProgress

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


def batch(batch_id: int, ends: dict[tuple[str, int], tuple[int | None, int]], *, query: str = "q1",
          run: str = "r1", source_index: int = 0, extra_sources: tuple[SourceProgress, ...] = ()) -> BatchOffsets:
    ranges = tuple(PartitionRange(t, p, f, u) for (t, p), (f, u) in sorted(ends.items()))
    # Every offset one row, per source and in the batch's total (Spark's numInputRows: the sum over
    # the sources), as on a plain topic: issue 41's read-shortfall rule compares them.
    rows = sum(u - (f or 0) for f, u in ends.values())
    return BatchOffsets(query, run, "orders", batch_id, T0 + timedelta(seconds=batch_id),
                        rows + sum(s.input_rows for s in extra_sources),
                        (SourceProgress(source_index, "KafkaV2[Subscribe[t]]", ranges, rows), *extra_sources))


def rec(b: BatchOffsets, pipeline: str = "orders") -> BatchRecord:
    return BatchRecord(pipeline, pipeline, b)


def start(run: str = "r1", query: str = "q1", at: datetime = T0 - timedelta(minutes=1)) -> RunStart:
    return RunStart("orders", "orders", query, run, "orders", at, app_version="1.0")


def position_map(engine: Engine, pipeline: str = "orders") -> dict[tuple[str, int], int]:
    with engine.connect() as conn:
        rows = conn.execute(select(positions).where(positions.c.pipeline == pipeline))
        return {(r.topic, r.partition): r.next_offset for r in rows}


def finding_rows(engine: Engine) -> list:
    with engine.connect() as conn:
        return list(conn.execute(select(findings).order_by(findings.c.id)))


def offsets_of(engine: Engine, query: str = "q1") -> list[tuple]:
    with engine.connect() as conn:
        rows = conn.execute(select(batch_offsets).where(batch_offsets.c.query_id == query)
                            .order_by(batch_offsets.c.batch_id, batch_offsets.c.source_index,
                                      batch_offsets.c.topic, batch_offsets.c.partition))
        return [(r.batch_id, r.source_index, r.topic, r.partition, r.from_offset, r.until_offset) for r in rows]


# ----------------------------------------------------------------------------- scenarios (shared)


def check_batches_and_positions(engine: Engine) -> None:
    recorder = Recorder(engine)
    recorder.record([start(), rec(batch(0, {("t", 0): (None, 10), ("t", 1): (None, 5)}))])
    recorder.record([rec(batch(1, {("t", 0): (10, 20), ("t", 1): (5, 5)})),
                     rec(batch(2, {("t", 0): (20, 21), ("t", 1): (5, 9)}))])
    assert offsets_of(engine) == [
        (0, 0, "t", 0, None, 10), (0, 0, "t", 1, None, 5),
        (1, 0, "t", 0, 10, 20), (1, 0, "t", 1, 5, 5),
        (2, 0, "t", 0, 20, 21), (2, 0, "t", 1, 5, 9)]
    assert position_map(engine) == {("t", 0): 21, ("t", 1): 9}
    assert finding_rows(engine) == []
    with engine.connect() as conn:
        run = conn.execute(select(runs)).one()
        assert (run.query_id, run.pipeline, run.app_version, run.last_batch_id) == ("q1", "orders", "1.0", 2)
        assert [r.input_rows for r in conn.execute(select(batches).order_by(batches.c.batch_id))] == [15, 10, 5]


def check_duplicates_are_idempotent(engine: Engine) -> None:
    b0 = batch(0, {("t", 0): (None, 10)})
    b1 = batch(1, {("t", 0): (10, 20)})
    Recorder(engine).record([start(), rec(b0), rec(b1), rec(b1)])
    # A new recorder has no cache: the duplicate is found in the tables.
    out = Recorder(engine).record([rec(b1), rec(b0)])
    assert (out.batches_written, out.duplicates, out.findings) == (0, 2, ())
    assert len(offsets_of(engine)) == 2
    assert position_map(engine) == {("t", 0): 20}
    assert finding_rows(engine) == []


def check_gap_is_a_finding(engine: Engine) -> None:
    recorder = Recorder(engine)
    recorder.record([start(), rec(batch(0, {("t", 0): (None, 10), ("t", 1): (None, 3)}))])
    out = recorder.record([rec(batch(1, {("t", 0): (15, 20), ("t", 1): (3, 4)}))])
    assert [(f.kind, f.topic, f.partition) for f in out.findings] == [("gap", "t", 0)]
    (row,) = finding_rows(engine)
    assert (row.kind, row.expected_offset, row.actual_offset, row.batch_id) == ("gap", 10, 15, 1)
    assert row.details["skipped_records"] == 5
    assert position_map(engine) == {("t", 0): 20, ("t", 1): 4}


def check_stale_batch_is_a_finding_not_a_position(engine: Engine) -> None:
    recorder = Recorder(engine)
    recorder.record([start(), rec(batch(0, {("t", 0): (None, 50)}))])
    # A zombie instance of the same pipeline (another query) reports an older end.
    zombie = batch(7, {("t", 0): (20, 30)}, query="q-zombie", run="r-zombie")
    out = recorder.record([rec(zombie)])
    assert [(f.kind, f.partition) for f in out.findings] == [("regression", 0)]
    (row,) = finding_rows(engine)
    assert (row.expected_offset, row.actual_offset, row.query_id) == (50, 30, "q-zombie")
    assert position_map(engine) == {("t", 0): 50}
    assert offsets_of(engine, "q-zombie") == [(7, 0, "t", 0, 20, 30)]  # history keeps what Spark said


def check_stale_event_inside_one_transaction(engine: Engine) -> None:
    b0, b1 = batch(0, {("t", 0): (None, 10)}), batch(1, {("t", 0): (10, 40)})
    zombie = batch(3, {("t", 0): (5, 12)}, query="q2", run="r2")
    out = Recorder(engine).record([start(), rec(b0), rec(b1), rec(zombie)])
    assert [f.kind for f in out.findings] == ["regression"]
    assert position_map(engine) == {("t", 0): 40}


def _pending_reset(engine: Engine, reset_id: int, next_offset: int, at: datetime, status: str = "pending") -> None:
    """What the reset writer does: audit the reset and move the position, marking it."""
    with engine.begin() as conn:
        conn.execute(insert(resets).values(
            id=reset_id, pipeline="orders", consumer_group="orders", mode="offsets", actor="ops",
            dry_run=False, forced=True, created_at=at, status=status))
        conn.execute(update(positions).values(next_offset=next_offset, reset_id=reset_id, updated_at=at))


def check_a_pending_reset_is_not_overwritten_by_an_older_run(engine: Engine) -> None:
    recorder = Recorder(engine)
    recorder.record([start(at=T0 - timedelta(minutes=1)), rec(batch(0, {("t", 0): (None, 100)}))])
    _pending_reset(engine, 1, 20, T0 + timedelta(hours=1))
    # The run that was going when the (forced) reset came keeps reporting, ahead of the reset...
    out = recorder.record([rec(batch(1, {("t", 0): (100, 120)}))])
    assert [(f.kind, f.partition) for f in out.findings] == [("pending_reset", 0)]
    (row,) = finding_rows(engine)
    assert (row.expected_offset, row.actual_offset) == (20, 120)
    assert position_map(engine) == {("t", 0): 20}
    # ...until the reset is consumed; a run started after it moves the position again.
    late = start(run="r9", query="q9", at=T0 + timedelta(hours=2))
    out = recorder.record([late, rec(batch(0, {("t", 0): (None, 30)}, query="q9", run="r9"))])
    assert out.findings == ()
    assert position_map(engine) == {("t", 0): 30}


def check_a_consumed_reset_follows_the_forward_rule(engine: Engine) -> None:
    recorder = Recorder(engine)
    recorder.record([start(at=T0 - timedelta(minutes=1)), rec(batch(0, {("t", 0): (None, 100)}))])
    _pending_reset(engine, 2, 500, T0 + timedelta(hours=1), status="consumed")
    # A run that ends behind the reset's position did not honour it: a regression.
    late = start(run="r9", query="q9", at=T0 + timedelta(hours=2))
    out = recorder.record([late, rec(batch(0, {("t", 0): (None, 130)}, query="q9", run="r9"))])
    assert [f.kind for f in out.findings] == ["regression"]
    with engine.connect() as conn:
        row = conn.execute(select(positions)).one()
    assert (row.next_offset, row.reset_id) == (500, 2)


def check_conflicting_redelivery_keeps_the_first(engine: Engine) -> None:
    recorder = Recorder(engine)
    recorder.record([start(), rec(batch(0, {("t", 0): (None, 10)}))])
    out = Recorder(engine).record([rec(batch(0, {("t", 0): (None, 99)}))])
    assert [f.kind for f in out.findings] == ["other"]
    assert offsets_of(engine) == [(0, 0, "t", 0, None, 10)]
    assert position_map(engine) == {("t", 0): 10}


def check_two_sources_and_two_topics(engine: Engine) -> None:
    second = SourceProgress(2, "KafkaV2[Subscribe[u]]", (PartitionRange("u", 0, None, 7),), 7)
    b0 = batch(0, {("t", 0): (None, 3)}, extra_sources=(second,))
    second1 = SourceProgress(2, "KafkaV2[Subscribe[u]]", (PartitionRange("u", 0, 7, 9),), 2)
    b1 = batch(1, {("t", 0): (3, 4)}, extra_sources=(second1,))
    Recorder(engine).record([start(), rec(b0), rec(b1)])
    assert offsets_of(engine) == [(0, 0, "t", 0, None, 3), (0, 2, "u", 0, None, 7),
                                  (1, 0, "t", 0, 3, 4), (1, 2, "u", 0, 7, 9)]
    assert position_map(engine) == {("t", 0): 4, ("u", 0): 9}
    assert finding_rows(engine) == []


def check_run_lifecycle_and_health(engine: Engine) -> None:
    recorder = Recorder(engine)
    # Heartbeat first: the listener was added after the query started.
    recorder.record([RunHeartbeat("orders", "orders", "q1", "r1", T0)])
    recorder.record([RunHeartbeat("orders", "orders", "q1", "r1", T0 + timedelta(seconds=30)),
                     RunEnd("orders", "orders", "q1", "r1", T0 + timedelta(minutes=1), "boom: broken")])
    with engine.connect() as conn:
        run = conn.execute(select(runs)).one()
    assert run.exception == "boom: broken"
    assert run.terminated_at is not None and run.last_heartbeat_at is not None
    recorder.report_health("L1", "orders", "host", {"queued": 3, "written": 2}, None)
    recorder.report_health("L1", "orders", "host", {"queued": 5, "written": 5, "failed": 1}, "x")
    with engine.connect() as conn:
        health = conn.execute(select(listener_health)).one()
    assert (health.queued, health.written, health.failed, health.last_error) == (5, 5, 1, "x")


SCENARIOS = [
    check_batches_and_positions, check_duplicates_are_idempotent, check_gap_is_a_finding,
    check_stale_batch_is_a_finding_not_a_position, check_stale_event_inside_one_transaction,
    check_a_pending_reset_is_not_overwritten_by_an_older_run, check_a_consumed_reset_follows_the_forward_rule,
    check_conflicting_redelivery_keeps_the_first,
    check_two_sources_and_two_topics, check_run_lifecycle_and_health,
]


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine)
    yield engine
    engine.dispose()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__.removeprefix("check_"))
def test_recorder_on_sqlite(scenario, sqlite_engine: Engine) -> None:  # type: ignore[no-untyped-def]
    scenario(sqlite_engine)


def test_driver_errors_are_classified_by_retriability() -> None:
    from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError

    from offset_ledger.errors import LedgerError, LedgerUnavailable
    from offset_ledger.ledger.recorder import translate

    lost = OperationalError("SELECT 1", {}, Exception("server closed the connection unexpectedly"))
    closed = InterfaceError("SELECT 1", {}, Exception("connection already closed"))
    dup = IntegrityError("INSERT", {}, Exception("duplicate key"))
    assert isinstance(translate(lost), LedgerUnavailable) and translate(lost).retriable
    assert isinstance(translate(closed), LedgerUnavailable)
    assert type(translate(dup)) is LedgerError and not translate(dup).retriable


# ----------------------------------------------------------------------------- property


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def _deliveries(draw: st.DrawFn) -> tuple[dict, list[list[tuple[str, int]]]]:
    """Consistent histories for two queries of one pipeline, delivered shuffled, duplicated, chunked."""
    histories: dict[str, list[dict[int, tuple[int | None, int]]]] = {}
    for query in ("q1", "q2"):
        ends = {p: draw(st.integers(0, 50)) for p in range(3)}
        batches = []
        for b in range(draw(st.integers(1, 5))):
            step = {p: draw(st.integers(0, 20)) for p in range(3)}
            batches.append({p: (None if b == 0 else ends[p], ends[p] + step[p]) for p in range(3)})
            ends = {p: ends[p] + step[p] for p in range(3)}
        histories[query] = batches
    keys = [(q, b) for q, bs in histories.items() for b in range(len(bs))]
    order = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=20))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(order) - 1)), max_size=5)))
    chunks = [order[i:j] for i, j in zip([0, *cuts], [*cuts, len(order)]) if order[i:j]]
    return histories, chunks


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_deliveries())
def test_any_delivery_order_keeps_the_ledger_consistent(tmp_path_factory: pytest.TempPathFactory,
                                                         case: tuple[dict, list[list[tuple[str, int]]]]) -> None:
    from offset_ledger.ledger.tables import metadata

    histories, chunks = case
    engine = make_engine(f"sqlite:///{tmp_path_factory.mktemp('prop') / 'ledger.db'}")
    metadata.create_all(engine)
    recorder = Recorder(engine)
    model_position: dict[int, int] = {}
    moved_by: dict[int, tuple[str, int]] = {}  # partition -> (query, batch) that moved it last
    expected_regressions = 0
    seen: set[tuple[str, int]] = set()
    for chunk in chunks:
        recorder.record([rec(batch(b, {("t", p): r for p, r in histories[q][b].items()}, query=q, run="r" + q))
                         for q, b in chunk])
        for q, b in chunk:  # the model: first delivery counts; positions never move back
            if (q, b) in seen:
                continue
            seen.add((q, b))
            for p, (_, until) in histories[q][b].items():
                if p in moved_by and moved_by[p][0] == q and moved_by[p][1] > b:
                    continue  # a later batch of its own query moved it: late, not a regression (issue 47)
                if p in model_position and until < model_position[p]:
                    expected_regressions += 1
                else:
                    model_position[p] = until
                    moved_by[p] = (q, b)
    assert position_map(engine) == {("t", p): o for p, o in model_position.items()}
    got = offsets_of(engine, "q1") + offsets_of(engine, "q2")
    assert len(got) == 3 * len(seen)  # each delivered batch exactly once, duplicates ignored
    rows = finding_rows(engine)
    kinds = [r.kind for r in rows]
    # A repeated regression (same run, partition) is one row counting its occurrences.
    assert sum(r.occurrences for r in rows if r.kind == "regression") == expected_regressions
    assert len({(r.run_id, r.topic, r.partition) for r in rows if r.kind == "regression"}) == kinds.count("regression")
    assert set(kinds) <= {"regression", "gap"}
    engine.dispose()


def test_health_reports_share_the_recording_connection(tmp_path: Path) -> None:
    """A listener holds one ledger connection: a second (health's) would stay pooled for the process's life."""
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine)
    recorder = Recorder(engine)
    recorder.record([RunHeartbeat("orders", "orders", "q1", "r1", T0)])
    recorder.report_health("L1", "orders", "host", {"queued": 1, "written": 1}, None)
    recorder.record([RunHeartbeat("orders", "orders", "q1", "r1", T0 + timedelta(seconds=30))])
    recorder.report_health("L1", "orders", "host", {"queued": 2, "written": 2}, None)
    assert (engine.pool.checkedout(), engine.pool.checkedin()) == (1, 0)
    with engine.connect() as conn:
        assert conn.execute(select(listener_health.c.written)).scalar_one() == 2
    recorder.close()
    engine.dispose()


def test_a_batch_another_writer_recorded_past_this_writers_last_is_judged_never_a_silent_duplicate(
        sqlite_engine: Engine) -> None:
    """SQLite's side of tests/integration/test_two_writers_gaps_pg.py's case of the same name."""
    b0 = batch(0, {("t", 0): (None, 10), ("t", 1): (None, 20)})
    b1 = batch(1, {("t", 0): (10, 15), ("t", 1): (20, 26)})
    listener, sink = Recorder(sqlite_engine), Recorder(sqlite_engine)
    listener.record([start(), rec(b0)])
    sink.record([start(), rec(b0), rec(b1)])
    out = listener.record([rec(batch(1, {("t", 0): (10, 18), ("t", 1): (20, 26)}))])
    assert (out.batches_written, out.duplicates) == (0, 1)
    assert [(f.kind, f.message) for f in out.findings] == [
        ("other", "a recorded batch was reported again with different offsets")]
    third = Recorder(sqlite_engine)
    third.record([rec(b0)])
    out = third.record([rec(b1)])
    assert (out.batches_written, out.duplicates, out.findings) == (0, 1, ())
