"""0020 (offset_ranges' foreign key to batches dropped) on real PostgreSQL: a 0019 ledger the release
1e8e3af wrote converts in place and back with every range and audit answer the same, that release keeps
recording on the migrated ledger, prune still removes ranges with their batches, and the downgrade
removes a range whose batch is gone before it puts the key back."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import func, select, text
from sqlalchemy.engine import Engine

from offset_ledger.ledger.engine import current_revision, downgrade, head_revision, make_engine, upgrade
from offset_ledger.ledger.prune import prune
from offset_ledger.ledger.tables import offset_ranges
from tests.previous_release import LAST_RELEASE, extract, record_with_previous_release, run_documented
from tests.unit.ledger.test_migration_0016_sqlite import _history_ranges, _ranges


def _foreign_keys(engine: Engine) -> list[str]:
    """Foreign keys referencing batches (on the parent and on each partition)."""
    with engine.connect() as conn:
        return sorted(conn.execute(text("SELECT conrelid::regclass::text FROM pg_constraint "
                                        "WHERE contype = 'f' AND confrelid = 'batches'::regclass")).scalars())


def _orphans(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM offset_ranges r WHERE NOT EXISTS "
                                     "(SELECT 1 FROM batches b WHERE b.id = r.batch_pk)")).scalar_one())


def test_0020_drops_the_key_both_ways_and_the_0019_release_keeps_recording(pg_dsn: str, tmp_path: Path) -> None:
    release = extract(tmp_path / "release", LAST_RELEASE)
    engine = make_engine(pg_dsn)
    try:
        upgrade(engine, "0019")
        recorded = record_with_previous_release(release, pg_dsn, "orders", "q-a")
        assert [o[:2] for o in recorded["outcomes"]] == [[1, 0], [1, 0], [1, 0], [1, 0], [3, 0]]
        with engine.connect() as conn:
            before = run_documented(conn)
        ranges = _ranges(engine)
        assert ranges == sorted(tuple(r) for r in recorded["ranges"]) and len(ranges) == 7 * 252
        assert sum(len(v) for v in before.values() if isinstance(v, list)) > 0  # the comparison is not vacuous
        assert "offset_ranges" in _foreign_keys(engine)

        upgrade(engine)
        assert current_revision(engine) == head_revision()
        assert _foreign_keys(engine) == []  # none left on any partition either
        assert _ranges(engine) == ranges == _history_ranges(engine, "orders")
        with engine.connect() as conn:
            assert run_documented(conn) == before

        # The 0019 release records on the migrated ledger.
        more = record_with_previous_release(release, pg_dsn, "payments", "q-b")
        assert [o[:2] for o in more["outcomes"]] == [[1, 0], [1, 0], [1, 0], [1, 0], [3, 0]]
        ranges = sorted([*ranges, *(tuple(r) for r in more["ranges"])])
        assert _ranges(engine) == ranges
        assert _history_ranges(engine, "payments") == sorted(tuple(r) for r in more["ranges"])

        # Prune removes ranges with their batches (no cascade needed): everything but each pipeline's latest
        # batch goes, no range is left without its batch.
        report = prune(engine, timedelta(days=1), execute=True, now=datetime.now(timezone.utc) + timedelta(days=400))
        assert report.batches.deleted == 2 * 6 and _orphans(engine) == 0
        with engine.connect() as conn:
            left = conn.execute(select(func.count()).select_from(offset_ranges)).scalar_one()
        assert left == 2 * 2  # the latest batch of each pipeline: two sources (topics t and u)

        # A range whose batch is gone (a writer racing a prune) is never read, and the downgrade drops it.
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO offset_ranges VALUES (999999, 0, 't', '{0}', '{0}', '{1}')"))
        assert _orphans(engine) == 1
        kept = _ranges(engine)
        assert len(kept) == 2 * 252  # the view joins batches: the stray row is not among them
        downgrade(engine, "0019")
        assert _foreign_keys(engine) and _orphans(engine) == 0 and _ranges(engine) == kept
        upgrade(engine)
        assert _foreign_keys(engine) == [] and _ranges(engine) == kept
    finally:
        engine.dispose()
