"""0016 (compact ranges) on SQLite: a 0014 ledger the previous release wrote converts in place and back,
the documented audit queries answer the same, and the previous release keeps recording afterwards."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import func, inspect, select, text

from offset_ledger.ledger.engine import current_revision, downgrade, head_revision, make_engine, upgrade
from offset_ledger.ledger.queries import batch_history
from offset_ledger.ledger.tables import batch_offsets, offset_ranges
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.verifying import verify_pipeline
from tests.previous_release import extract, record_with_previous_release, run_documented


def _ranges(engine) -> list[tuple]:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        return sorted(tuple(r) for r in conn.execute(select(
            batch_offsets.c.query_id, batch_offsets.c.batch_id, batch_offsets.c.source_index, batch_offsets.c.topic,
            batch_offsets.c.partition, batch_offsets.c.from_offset, batch_offsets.c.until_offset)))


def _history_ranges(engine, pipeline: str) -> list[tuple]:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        rows = batch_history(conn, pipeline, pipeline, limit=1000)
    return sorted((b["query_id"], b["batch_id"], r["source_index"], r["topic"], r["partition"], r["from_offset"],
                   r["until_offset"]) for b in rows for r in b["ranges"])


def _stretch_kinds(engine, pipeline: str) -> set[str]:  # type: ignore[no-untyped-def]
    ops = Operations(engine)
    try:
        return {s.kind for s in verify_pipeline(ops, pipeline).stretches}
    finally:
        ops.close()


def test_0016_converts_a_0014_ledger_both_ways_and_the_audit_queries_answer_the_same(tmp_path: Path) -> None:
    release = extract(tmp_path / "release")
    dsn = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = make_engine(dsn)
    try:
        upgrade(engine, "0014")
        recorded = record_with_previous_release(release, dsn, "orders", "q-old")
        with engine.connect() as conn:
            before = run_documented(conn)
            legacy = sorted(tuple(r) for r in conn.execute(text(
                'SELECT query_id, batch_id, source_index, topic, "partition", from_offset, until_offset '
                "FROM batch_offsets")))
        assert legacy == sorted(tuple(r) for r in recorded["ranges"]) and len(legacy) == 7 * 252
        assert any(isinstance(v, list) and v for v in before.values())  # the comparison is not vacuous

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
            assert sorted(tuple(r) for r in conn.execute(text(
                'SELECT query_id, batch_id, source_index, topic, "partition", from_offset, until_offset '
                "FROM batch_offsets"))) == legacy
        upgrade(engine)
        assert _ranges(engine) == legacy
    finally:
        engine.dispose()


def test_the_previous_release_keeps_recording_on_a_migrated_ledger(tmp_path: Path) -> None:
    release = extract(tmp_path / "release")
    dsn = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = make_engine(dsn)
    try:
        upgrade(engine)
        recorded = record_with_previous_release(release, dsn, "orders", "q-old")
        assert [o[:2] for o in recorded["outcomes"]] == [[1, 0], [1, 0], [1, 0], [1, 0], [3, 0]]
        want = sorted(tuple(r) for r in recorded["ranges"])
        assert _ranges(engine) == want == _history_ranges(engine, "orders")
        with engine.connect() as conn:  # folded: one compact row per batch and topic, the old table empty
            assert conn.execute(select(func.count()).select_from(offset_ranges)).scalar() == 7 * 2
            assert conn.execute(text("SELECT COUNT(*) FROM batch_offsets")).scalar() == 0
        assert _stretch_kinds(engine, "orders") <= {"read", "unknown_start"}, _stretch_kinds(engine, "orders")
    finally:
        engine.dispose()
