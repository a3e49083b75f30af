"""0024 (positions as a row per topic) on real PostgreSQL: a ledger the previous release created and wrote
reads the same positions after the migration, down and up again; that release keeps recording on the
migrated ledger during a rolling upgrade, and what this tree reads (the restart's positions, the views)
is exactly what its listener recorded; this tree's writes reach the rows the previous release reads."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine

from offset_ledger.ledger.engine import (
    current_revision,
    downgrade,
    head_revision,
    make_engine,
    upgrade,
)
from offset_ledger.ledger.queries import current_positions
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.records import BatchRecord
from offset_ledger.rules.model import BatchOffsets, PartitionRange, SourceProgress
from tests.previous_release import (
    PER_PARTITION_POSITIONS,
    extract,
    record_with_previous_release,
    run_documented,
    upgrade_with_release,
)

_COLUMNS = 'pipeline, consumer_group, topic, "partition", next_offset, updated_at, batch_id, reset_id, generation_id, query_id'


def _rows(engine: Engine, source: str, pipeline: str | None = None) -> list[tuple[Any, ...]]:
    where = "" if pipeline is None else f"WHERE pipeline = '{pipeline}'"
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            f'SELECT {_COLUMNS} FROM {source} {where} ORDER BY pipeline, consumer_group, topic, "partition"'))]


def _recorded_ends(result: dict[str, Any]) -> dict[tuple[str, int], int]:
    """Where the previous release's batches left each partition: the last batch's end."""
    ends: dict[tuple[str, int], int] = {}
    for _query, _batch, _source, topic, partition, _start, until in result["ranges"]:
        ends[(topic, partition)] = until
    return ends


def _positions(engine: Engine, pipeline: str) -> dict[tuple[str, int], int]:
    with engine.connect() as conn:
        return {(p.topic, p.partition): p.next_offset for p in current_positions(conn, pipeline)}


def _batch(pipeline: str, query: str, n: int, ends: dict[tuple[str, int], int], at: datetime) -> BatchRecord:
    ranges: dict[str, list[PartitionRange]] = {}
    for (topic, p), end in sorted(ends.items()):
        ranges.setdefault(topic, []).append(PartitionRange(topic, p, end, end + 3))
        ends[(topic, p)] = end + 3
    sources = tuple(SourceProgress(i, f"KafkaV2[Subscribe[{t}]]", tuple(r), 3 * len(r))
                    for i, (t, r) in enumerate(sorted(ranges.items())))
    return BatchRecord(pipeline, pipeline, BatchOffsets(query, "run-" + query, pipeline, n, at,
                                                        sum(s.input_rows for s in sources), sources))


def test_0024_converts_positions_and_the_previous_release_keeps_recording(pg_dsn: str, tmp_path: Path) -> None:
    previous = extract(tmp_path / "previous", PER_PARTITION_POSITIONS)
    upgrade_with_release(previous, pg_dsn, "0023")
    engine = make_engine(pg_dsn)
    try:
        orders = record_with_previous_release(previous, pg_dsn, "orders", "q-a")
        with engine.begin() as conn:
            # A position a reset placed, beside those batches placed: two movers in one topic row.
            conn.execute(text("INSERT INTO resets (pipeline, consumer_group, mode, actor, dry_run, forced, "
                              "created_at, status) VALUES ('orders', 'orders', 'offsets', 'me', false, false, "
                              ":at, 'consumed')"), {"at": datetime(2026, 11, 26, tzinfo=timezone.utc)})
            conn.execute(text("UPDATE positions SET next_offset = 1, reset_id = (SELECT max(id) FROM resets), "
                              "query_id = NULL, batch_id = NULL WHERE topic = 't' AND \"partition\" = 7"))
            documented = run_documented(conn)
        before = _rows(engine, "positions")
        assert len(before) == 252

        upgrade(engine)
        assert current_revision(engine) == head_revision()
        assert _rows(engine, "v_positions") == before
        assert _rows(engine, "v_current_positions") == before
        with engine.connect() as conn:
            assert run_documented(conn) == documented
            assert conn.execute(text("SELECT count(*) FROM topic_positions")).scalar() == 2
            assert conn.execute(text("SELECT stamps IS NULL FROM topic_positions WHERE topic = 'u'")).scalar()
        ends = _recorded_ends(orders)
        ends[("t", 7)] = 1
        assert _positions(engine, "orders") == ends

        # A rolling upgrade: the previous release's listener records on the migrated ledger (its general
        # path, its COPY, its one-statement paths: every batch written, no finding)...
        payments = record_with_previous_release(previous, pg_dsn, "payments", "q-c")
        assert payments["outcomes"] == [[1, 0, []], [1, 0, []], [1, 0, []], [1, 0, []], [3, 0, []]]
        # ...and this tree reads exactly what it recorded: the restart's positions, the views.
        assert _positions(engine, "payments") == _recorded_ends(payments)
        assert _rows(engine, "v_positions", "payments") == _rows(engine, "positions", "payments")

        # This tree's listener moves the positions of a pipeline the previous release recorded: the rows
        # the previous release reads follow (the mirror), so its next batch is judged against them.
        later = dict(_recorded_ends(payments))
        t1 = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)
        rec = Recorder(engine)
        try:
            outcome = rec.record([_batch("payments", "q-c", 7, later, t1)])
            assert outcome.batches_written == 1 and not outcome.findings
        finally:
            rec.close()
        assert _positions(engine, "payments") == later
        assert _rows(engine, "positions", "payments") == _rows(engine, "v_positions", "payments")

        # Retired (no previous release left): positions empties and stays so; this tree records on.
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE positions"))
        rec = Recorder(engine)
        try:
            assert rec.record([_batch("payments", "q-c", 8, later, t1 + timedelta(seconds=5))]).batches_written == 1
        finally:
            rec.close()
        assert _rows(engine, "positions") == [] and _positions(engine, "payments") == later
        kept = _rows(engine, "v_positions")

        # Down (positions rebuilt per partition from the rows per topic) and up again.
        downgrade(engine, "0023")
        assert _rows(engine, "positions") == kept
        with engine.connect() as conn:
            assert [tuple(r) for r in conn.execute(text(
                f'SELECT {_COLUMNS} FROM v_current_positions ORDER BY pipeline, consumer_group, topic, '
                '"partition"'))] == kept
        refunds = record_with_previous_release(previous, pg_dsn, "refunds", "q-d")  # the previous release on 0023
        assert [o[:2] for o in refunds["outcomes"]] == [[1, 0], [1, 0], [1, 0], [1, 0], [3, 0]]
        upgrade(engine)
        assert _rows(engine, "v_positions") == _rows(engine, "positions")
        assert _positions(engine, "refunds") == _recorded_ends(refunds)
        assert _positions(engine, "payments") == later
    finally:
        engine.dispose()
