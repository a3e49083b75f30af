"""0018 (offset_ranges partitioned on PostgreSQL) is a no-op on SQLite: the schema and every row stay as
they are both ways, and prune keeps its DELETE path there."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import insert, select, text

from offset_ledger.ledger.engine import current_revision, downgrade, make_engine, upgrade
from offset_ledger.ledger.tables import batches, offset_ranges


def _schema_and_rows(engine) -> tuple[list, list]:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        schema = sorted(tuple(r) for r in conn.execute(text(
            "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' AND name <> 'alembic_version'")))
        rows = [tuple(r) for r in conn.execute(select(offset_ranges).order_by(offset_ranges.c.batch_pk))]
    return schema, rows


def test_0018_changes_nothing_on_sqlite_both_ways(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        upgrade(engine, "0017")
        t = datetime(2026, 11, 26, 12, tzinfo=timezone.utc)
        with engine.begin() as conn:
            pk = conn.execute(insert(batches).values(
                pipeline="p", consumer_group="p", query_id="q", run_id="r", batch_id=0, batch_time=t, recorded_at=t,
                input_rows=5).returning(batches.c.id)).scalar_one()
            conn.execute(insert(offset_ranges).values(batch_pk=pk, source_index=0, topic="t", partitions=[0, 1],
                                                      from_offsets=[None, 3], until_offsets=[2, 6]))
        before = _schema_and_rows(engine)
        assert before[1] == [(pk, 0, "t", [0, 1], [None, 3], [2, 6])]
        upgrade(engine, "0018")
        assert current_revision(engine) == "0018"
        assert _schema_and_rows(engine) == before
        downgrade(engine, "0017")
        assert _schema_and_rows(engine) == before
    finally:
        engine.dispose()
