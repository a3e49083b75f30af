"""``db upgrade`` from the previous revision with data in it, on real PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import select, text

from offset_ledger.ledger.engine import current_revision, downgrade, head_revision, make_engine, upgrade
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.records import BatchRecord
from offset_ledger.ledger.tables import (
    batches,
    checkpoint_generations,
    findings,
    positions,
    runs,
)
from offset_ledger.rules.model import BatchOffsets, PartitionRange, SourceProgress

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
# What 0003 adds; a ledger written by the 0002-era code has none of these columns.
_ADDED = {"runs": ["generation_id", "max_batch_ms"], "positions": ["generation_id"],
          "findings": ["generation_id", "run_id"],
          "checkpoint_generations": ["resolved_offsets", "topic_ids", "watermarks", "query_id"]}


def test_upgrade_from_0002_with_data_keeps_it_and_tells_current_runs_from_foreign_ones(pg_dsn: str) -> None:
    engine = make_engine(pg_dsn)
    try:
        upgrade(engine, "0002")
        with engine.begin() as conn:
            # 0001 builds tables from the live schema module: take the columns away again so the
            # database is exactly what a 0002 ledger in production looks like.
            for view in ("v_current_positions", "v_findings", "v_batch_history", "v_pipeline_activity"):
                conn.execute(text(f"DROP VIEW {view}"))
            for table, columns in _ADDED.items():
                for column in columns:
                    conn.execute(text(f"ALTER TABLE {table} DROP COLUMN {column}"))
            for gen, loc in ((1, "/ckpt/gen-1-aaaaaaaa"), (2, "/ckpt/gen-2-bbbbbbbb")):
                conn.execute(text(
                    "INSERT INTO checkpoint_generations (pipeline, consumer_group, generation, checkpoint_root, "
                    "location, app_version, reason, created_at, starting_offsets) VALUES "
                    "('orders', 'orders', :g, '/ckpt', :loc, '1', 'first', :at, '{\"t\": {\"0\": 0}}')"),
                    {"g": gen, "loc": loc, "at": T0 + timedelta(minutes=gen)})
            for run, loc in (("r-old", "file:/ckpt/gen-1-aaaaaaaa"), ("r-new", "file:/ckpt/gen-2-bbbbbbbb")):
                conn.execute(text(
                    "INSERT INTO runs (run_id, query_id, pipeline, consumer_group, checkpoint_location, started_at) "
                    "VALUES (:r, :q, 'orders', 'orders', :loc, :at)"), {"r": run, "q": "q-" + run, "loc": loc, "at": T0})
            conn.execute(text(
                "INSERT INTO positions (pipeline, consumer_group, topic, \"partition\", next_offset, updated_at, "
                "query_id, batch_id) VALUES ('orders', 'orders', 't', 0, 40, :at, 'q-r-new', 3)"), {"at": T0})
            conn.execute(text(
                "INSERT INTO findings (pipeline, consumer_group, kind, message, created_at) "
                "VALUES ('orders', 'orders', 'gap', 'an old finding', :at)"), {"at": T0})
        assert current_revision(engine) == "0002"

        upgrade(engine)
        assert current_revision(engine) == head_revision()
        with engine.connect() as conn:
            gens = {r.generation: r.id for r in conn.execute(select(checkpoint_generations))}
            by_run = {r.run_id: r.generation_id for r in conn.execute(select(runs))}
            assert by_run == {"r-old": gens[1], "r-new": gens[2]}
            assert [r.next_offset for r in conn.execute(select(positions))] == [40]
            assert [r.message for r in conn.execute(text("SELECT message FROM v_findings"))] == ["an old finding"]
            placed = conn.execute(text("SELECT placed_by, generation_id FROM v_current_positions")).one()
            assert tuple(placed) == ("batch", None)

        # The upgraded ledger records by the new rules at once: the old generation's run is foreign.
        recorder = Recorder(engine)

        def batch(run: str, batch_id: int, since: int, until: int) -> BatchRecord:
            ranges = (PartitionRange("t", 0, since, until),)
            return BatchRecord("orders", "orders", BatchOffsets(
                "q-" + run, run, "orders", batch_id, T0 + timedelta(minutes=10 + batch_id), until - since,
                (SourceProgress(0, "KafkaV2", ranges, until - since),)))

        recorder.record([batch("r-old", 7, 90, 120)])
        recorder.record([batch("r-new", 4, 40, 55)])
        recorder.close()
        with engine.connect() as conn:
            assert [r.next_offset for r in conn.execute(select(positions))] == [55]
            kinds = sorted(r.kind for r in conn.execute(select(findings)))
            assert kinds == ["foreign_run", "gap"]
            assert conn.execute(select(batches.c.batch_id).order_by(batches.c.batch_id)).scalars().all() == [4, 7]
    finally:
        engine.dispose()


def test_0008_leaves_room_on_positions_pages_and_updates_stay_on_their_page(pg_dsn: str) -> None:
    engine = make_engine(pg_dsn)
    try:
        upgrade(engine, "0005")
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO positions (pipeline, consumer_group, topic, \"partition\", next_offset, updated_at) "
                "SELECT 'orders', 'orders', 't', p, p, :at FROM generate_series(0, 999) AS p"), {"at": T0})
        # Up to the last revision where ``positions`` is the table writers update (0024 keeps it for the
        # previous release only, its writes mirrored by triggers: test_migration_0024_pg).
        upgrade(engine, "0023")
        assert current_revision(engine) == "0023"
        with engine.begin() as conn:
            options = conn.execute(text("SELECT reloptions FROM pg_class WHERE relname = 'positions'")).scalar()
            assert options == ["fillfactor=50"]
            assert conn.execute(text("SELECT count(*), sum(next_offset) FROM positions")).one() == (1000, 499500)
            before = conn.execute(text("SELECT pg_relation_size('pk_positions')")).scalar()
        # The existing rows were rewritten with free space: updating all of them at once (a
        # restart's baseline), three times, adds no index entries (each new version stays on its
        # page; the page's dead versions are pruned when it is updated again).
        for _ in range(3):
            with engine.begin() as conn:
                conn.execute(text("UPDATE positions SET next_offset = next_offset + 1, generation_id = 1"))
        with engine.connect() as conn:
            assert conn.execute(text("SELECT pg_relation_size('pk_positions')")).scalar() == before
            assert conn.execute(text("SELECT sum(next_offset) FROM positions")).scalar() == 499500 + 3000
        downgrade(engine, "0005")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT reloptions FROM pg_class WHERE relname = 'positions'")).scalar() is None
    finally:
        engine.dispose()
