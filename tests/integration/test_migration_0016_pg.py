"""0016 (compact ranges) on real PostgreSQL: a 0014 ledger the previous release wrote converts in
place and back, docs/audit.md's queries answer the same, and the previous release's recorder (its
COPY, one-batch and several-batches statements) keeps recording on the migrated ledger."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import func, inspect, select, text

from offset_ledger.ledger.engine import current_revision, downgrade, head_revision, make_engine, upgrade
from offset_ledger.ledger.tables import offset_ranges
from tests.previous_release import extract, record_with_previous_release, run_documented
from tests.unit.ledger.test_migration_0016_sqlite import _history_ranges, _ranges, _stretch_kinds

_LEGACY = ('SELECT query_id, batch_id, source_index, topic, "partition", from_offset, until_offset '
           "FROM batch_offsets")


def test_0016_converts_a_0014_ledger_both_ways_and_the_audit_queries_answer_the_same(
        pg_dsn: str, tmp_path: Path) -> None:
    release = extract(tmp_path / "release")
    engine = make_engine(pg_dsn)
    try:
        upgrade(engine, "0014")
        recorded = record_with_previous_release(release, pg_dsn, "orders", "q-old")
        with engine.connect() as conn:
            before = run_documented(conn)
            legacy = sorted(tuple(r) for r in conn.execute(text(_LEGACY)))
        assert legacy == sorted(tuple(r) for r in recorded["ranges"]) and len(legacy) == 7 * 252
        assert all(isinstance(v, list) for v in before.values()), before  # every documented query runs here
        assert sum(len(v) for v in before.values()) > 0

        upgrade(engine)
        assert current_revision(engine) == head_revision()
        assert _ranges(engine) == legacy == _history_ranges(engine, "orders")
        with engine.connect() as conn:
            assert run_documented(conn) == before
            assert conn.execute(select(func.count()).select_from(offset_ranges)).scalar() == 7 * 2
            assert conn.execute(text("SELECT COUNT(*) FROM batch_offsets")).scalar() == 0

        downgrade(engine, "0014")
        assert "offset_ranges" not in inspect(engine).get_table_names()
        with engine.connect() as conn:
            assert run_documented(conn) == before
            assert sorted(tuple(r) for r in conn.execute(text(_LEGACY))) == legacy
        upgrade(engine)
        assert _ranges(engine) == legacy
    finally:
        engine.dispose()


def test_the_previous_release_keeps_recording_on_a_migrated_ledger(pg_dsn: str, tmp_path: Path) -> None:
    release = extract(tmp_path / "release")
    engine = make_engine(pg_dsn)
    try:
        upgrade(engine)
        recorded = record_with_previous_release(release, pg_dsn, "orders", "q-old")
        assert [o[:2] for o in recorded["outcomes"]] == [[1, 0], [1, 0], [1, 0], [1, 0], [3, 0]]
        # batch 0 (a new query, an unreported start) on the general path (COPY: 250 partitions); the
        # rest through the old one-batch and several-batches statements into the folding table
        assert recorded["general_path_calls"] == [0], recorded["general_path_calls"]
        want = sorted(tuple(r) for r in recorded["ranges"])
        assert _ranges(engine) == want == _history_ranges(engine, "orders")
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(offset_ranges)).scalar() == 7 * 2
            assert conn.execute(text("SELECT COUNT(*) FROM batch_offsets")).scalar() == 0
        assert _stretch_kinds(engine, "orders") <= {"read", "unknown_start"}, _stretch_kinds(engine, "orders")
    finally:
        engine.dispose()
