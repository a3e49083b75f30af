"""0021 (positions.query_id moved last) on real PostgreSQL: a ledger the last release created and
wrote keeps every position and audit answer, down and up; the last release keeps recording on it;
a granted view keeps its grant; and this tree's position updates are WAL-logged without the query id."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import Engine

from offset_ledger.ledger.engine import current_revision, downgrade, head_revision, make_engine, upgrade
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.records import BatchRecord, RunStart
from offset_ledger.rules.model import BatchOffsets, PartitionRange, SourceProgress
from tests.previous_release import (
    LAST_RELEASE,
    extract,
    record_with_previous_release,
    run_documented,
    upgrade_with_release,
)

_COLUMNS = ('pipeline, consumer_group, topic, "partition", next_offset, updated_at, query_id, batch_id, reset_id, '
            'generation_id')


def _columns(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(text(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'positions'::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum")).scalars())


def _positions(engine: Engine) -> list[tuple]:  # type: ignore[type-arg]
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(f"SELECT {_COLUMNS} FROM positions ORDER BY 1, 2, 3, 4"))]


def _view(engine: Engine) -> list[tuple]:  # type: ignore[type-arg]
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text("SELECT * FROM v_current_positions ORDER BY 1, 2, 3, 4"))]


def _record_steady_batches(engine: Engine, pipeline: str, batches: int) -> tuple[str, str]:
    """This tree's recorder: a run of 100 partitions, 3 batches of warm-up, then ``batches`` one call
    each (the one-statement path); the LSNs around those, with the WAL flushed up to the end."""
    t0 = datetime(2026, 11, 27, tzinfo=timezone.utc)
    query = str(uuid.uuid4())  # Spark's query ids are UUIDs: 36 characters
    recorder = Recorder(engine)

    def batch(n: int) -> BatchRecord:
        ranges = tuple(PartitionRange("t", p, 10**9 + 500 * n, 10**9 + 500 * (n + 1)) for p in range(100))
        return BatchRecord(pipeline, pipeline, BatchOffsets(
            query, f"run-{query}", pipeline, n, t0 + timedelta(seconds=5 * n), 50_000,
            (SourceProgress(0, "KafkaV2[Subscribe[t]]", ranges, 50_000),), duration_ms=100))

    recorder.record([RunStart(pipeline, pipeline, query, f"run-{query}", pipeline, t0)])
    for n in range(3):
        recorder.record([batch(n)])
    with engine.connect() as conn:
        start = str(conn.execute(text("SELECT pg_current_wal_insert_lsn()")).scalar())
    for n in range(3, 3 + batches):
        recorder.record([batch(n)])
    recorder.close()
    with engine.connect() as conn:
        end = str(conn.execute(text("SELECT pg_current_wal_insert_lsn()")).scalar())
        # pg_walinspect reads flushed WAL only (synchronous_commit=off: the WAL writer flushes soon)
        for _ in range(200):
            if conn.execute(text("SELECT pg_current_wal_flush_lsn() >= CAST(:e AS pg_lsn)"), {"e": end}).scalar():
                break
            time.sleep(0.05)
    return start, end


def _position_records(engine: Engine, start: str, end: str, relation: str = "positions") -> dict[str, tuple[int, float]]:
    """record type -> (count, mean length) of the WAL records on ``relation`` between the LSNs."""
    with engine.begin() as conn:
        conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_walinspect"))
        rows = conn.execute(text(
            "SELECT record_type, count(*), avg(record_length) FROM pg_get_wal_records_info("
            "CAST(:s AS pg_lsn), CAST(:e AS pg_lsn)) WHERE resource_manager = 'Heap' "
            "AND (regexp_match(block_ref, 'rel \\d+/(\\d+)/(\\d+)'))::oid[] = ARRAY["
            "(SELECT oid FROM pg_database WHERE datname = current_database()), pg_relation_filenode(CAST(:r AS regclass))] "
            "GROUP BY 1"), {"s": start, "e": end, "r": relation}).all()
    return {r[0]: (int(r[1]), float(r[2])) for r in rows}


def test_0021_moves_query_id_last_keeping_every_position_and_the_last_release_keeps_recording(
        pg_dsn: str, tmp_path: Path) -> None:
    last = extract(tmp_path / "last", LAST_RELEASE)
    upgrade_with_release(last, pg_dsn, "0019")  # the last release's ledger: its own positions column order
    engine = make_engine(pg_dsn)
    role = f"w35_reader_{uuid.uuid4().hex[:8]}"
    try:
        assert _columns(engine).index("query_id") == 6  # between updated_at and batch_id
        recorded = record_with_previous_release(last, pg_dsn, "orders", "q-a")
        assert recorded["general_path_calls"] == [0]
        with engine.begin() as conn:  # a position a restart placed: no query id, a generation
            conn.execute(text(f"INSERT INTO positions ({_COLUMNS}) VALUES ('placed', 'placed', 't', 0, 7, "
                              "CAST('2026-11-27 00:00:00+00' AS timestamptz), NULL, NULL, NULL, 3)"))
            conn.execute(text(f'CREATE ROLE "{role}"'))
            conn.execute(text(f'GRANT SELECT ON v_current_positions TO "{role}"'))
            documented = run_documented(conn)
        positions, view = _positions(engine), _view(engine)
        assert len(positions) == 252 + 1 and {p[6] for p in positions} == {"q-a", None}
        assert sum(len(v) for v in documented.values() if isinstance(v, list)) > 0

        upgrade(engine)
        assert current_revision(engine) == head_revision()
        assert _columns(engine)[-1] == "query_id" and len(_columns(engine)) == 10
        assert _positions(engine) == positions and _view(engine) == view
        with engine.connect() as conn:
            assert run_documented(conn) == documented
            assert conn.execute(text(f"SELECT has_table_privilege('{role}', 'v_current_positions', 'SELECT')")).scalar()

        # Down and up: column order only, nothing to undo; the data stays.
        downgrade(engine, "0019")
        assert _positions(engine) == positions
        upgrade(engine)
        assert _positions(engine) == positions and _columns(engine)[-1] == "query_id"

        # The last release records on the migrated table, its one-statement paths included.
        more = record_with_previous_release(last, pg_dsn, "payments", "q-c")
        assert [o[:2] for o in more["outcomes"]] == [[1, 0], [1, 0], [1, 0], [1, 0], [3, 0]]
        assert more["general_path_calls"] == [0]
        ends = {(r[3], r[4]): r[6] for r in more["ranges"]}  # (topic, partition) -> its last until
        with engine.connect() as conn:
            moved = {(r.topic, r.partition): (r.next_offset, r.query_id, r.batch_id) for r in conn.execute(
                text("SELECT topic, \"partition\", next_offset, query_id, batch_id FROM positions "
                     "WHERE pipeline = 'payments'"))}
        assert moved == {k: (v, "q-c", 6) for k, v in ends.items()}

        # This tree's steady batches: since 0024 one plain update of the topic's row per batch (not one
        # per partition), no row lock logged before it, the query id (the same value) in the record's
        # unchanged suffix: the 100 offsets (800 B) and the mover, ~0.9 KB where 100 records logged 9.5.
        start, end = _record_steady_batches(engine, "wal", 5)
        assert _position_records(engine, start, end) == {}  # nothing on the per-partition table
        found = _position_records(engine, start, end, "topic_positions")
        assert "LOCK" not in found, found
        count, mean = found["HOT_UPDATE"]
        assert count == 5 and mean <= 1000, found
    finally:
        with engine.begin() as conn:
            conn.execute(text(f'DROP OWNED BY "{role}"'))
            conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        engine.dispose()
