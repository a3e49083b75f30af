"""0020 (offset_ranges' foreign key dropped on PostgreSQL) is a no-op on SQLite: from 0019 with data the
schema and every row stay as they are both ways, and prune keeps its DELETE path there."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import insert

from offset_ledger.ledger.engine import current_revision, downgrade, head_revision, make_engine, upgrade
from offset_ledger.ledger.prune import prune
from offset_ledger.ledger.tables import batches, offset_ranges
from tests.unit.ledger.test_migration_0018_sqlite import _schema_and_rows


def test_0020_changes_nothing_on_sqlite_both_ways_and_prune_still_deletes(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        upgrade(engine, "0019")
        t = datetime(2026, 11, 26, 12, tzinfo=timezone.utc)
        with engine.begin() as conn:
            for n in range(3):
                pk = conn.execute(insert(batches).values(
                    pipeline="p", consumer_group="p", query_id="q", run_id="r", batch_id=n,
                    batch_time=t + timedelta(hours=n), recorded_at=t, input_rows=5,
                ).returning(batches.c.id)).scalar_one()
                conn.execute(insert(offset_ranges).values(batch_pk=pk, source_index=0, topic="t", partitions=[0, 1],
                                                          from_offsets=[None if n == 0 else 2 * n, 3 * n],
                                                          until_offsets=[2 * n + 2, 3 * n + 3]))
        before = _schema_and_rows(engine)
        assert len(before[1]) == 3
        upgrade(engine, "0020")
        assert current_revision(engine) == "0020"
        assert _schema_and_rows(engine) == before
        downgrade(engine, "0019")
        assert _schema_and_rows(engine) == before
        upgrade(engine)
        assert current_revision(engine) == head_revision()
        report = prune(engine, timedelta(minutes=30), now=t + timedelta(hours=2), execute=True)
        assert (report.batches.deleted, report.batch_offsets.deleted) == (2, 4)  # batches 0 and 1; 2 is the latest
        schema, rows = _schema_and_rows(engine)
        assert rows == before[1][2:]  # its ranges went with it (deleted explicitly: no cascade needed)
    finally:
        engine.dispose()
