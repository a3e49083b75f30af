"""Prune on the partitioned ``offset_ranges`` (0018, real PostgreSQL): aged partitions are swapped for new
tables holding only the rows kept, the rows kept and removed are those the DELETE path keeps and removes,
and a partition whose lock stays busy (a long reader) falls back to that path with the same result."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import text
from sqlalchemy.engine import Engine

from offset_ledger.ledger import partitions as parts
from offset_ledger.ledger import tables as t
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.prune import prune
from tests.integration.test_prune import KEPT_AFTER_30D, NOW, batch_keys, counts, seed
from tests.partitioned import narrow_partitions


def _layout(engine: Engine) -> dict[str, tuple[int, int]]:
    """Per partition: its table's oid and rows."""
    with engine.connect() as conn:
        return {p.name: (conn.execute(text(f"SELECT '{p.name}'::regclass::oid")).scalar_one(),
                         conn.execute(text(f"SELECT count(*) FROM {p.name}")).scalar_one())
                for p in parts.partitions(conn)}


def _ledger(dsn: str) -> Engine:
    engine = make_engine(dsn)
    upgrade(engine)
    narrow_partitions(engine, width=3, ahead=30)
    seed(engine)
    return engine


def test_aged_partitions_are_swapped_for_the_rows_they_keep(pg_dsn: str) -> None:
    engine = _ledger(pg_dsn)
    try:
        before, rows_before = _layout(engine), counts(engine)
        dry = prune(engine, timedelta(days=30), now=NOW)
        assert _layout(engine) == before and dry.partitions_swapped == 0  # a dry run changes nothing
        report = prune(engine, timedelta(days=30), now=NOW, execute=True)
        after = _layout(engine)
        assert batch_keys(engine) == KEPT_AFTER_30D == batch_keys(engine, t.batch_offsets)
        assert counts(engine)["batch_offsets"] == rows_before["batch_offsets"] - report.batch_offsets.deleted
        assert report.batch_offsets.deleted == 29
        assert (report.batches.deleted, report.batch_offsets.deleted) == (dry.batches.deleted, dry.batch_offsets.deleted)
        swapped = [n for n in before if after[n][0] != before[n][0]]
        # The 21 seeded batches lie in partitions of 3 ids; the newest is not swapped (writers may still insert
        # there: its old rows go by DELETE); the older ones with something to remove are ...
        assert report.partitions_swapped == len(swapped) >= 4, (report, swapped)
        # prune also made partitions ahead at this ledger's width (10,000 ids: no rate to measure here)
        assert sorted(set(after) - set(before)) == sorted(f"offset_ranges_p{91 + 10_000 * i}" for i in range(8))
        assert after["offset_ranges_default"][1] == 0
        for name in swapped:  # ... and each new table holds only what was kept
            assert after[name][1] < before[name][1] or before[name][1] == 0
        with engine.connect() as conn:
            kept_pks = set(conn.execute(text("SELECT batch_pk FROM offset_ranges")).scalars())
            assert kept_pks <= set(conn.execute(text("SELECT id FROM batches")).scalars())
        again = prune(engine, timedelta(days=30), now=NOW, execute=True)
        assert again.batches.deleted == again.batch_offsets.deleted == again.partitions_swapped == 0
    finally:
        engine.dispose()


def test_a_partition_a_long_reader_holds_is_pruned_by_delete_instead(pg_dsn: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(parts, "LOCK_TIMEOUT", "50ms")
    monkeypatch.setattr(parts, "TRIES", 2)
    engine = _ledger(pg_dsn)
    reader = make_engine(pg_dsn)
    try:
        with reader.connect() as held:
            held.execute(text("SELECT count(*) FROM offset_ranges")).scalar()  # its transaction stays open
            report = prune(engine, timedelta(days=30), now=NOW, execute=True)
            held.rollback()
        assert report.partitions_swapped == 0 and report.batch_offsets.deleted == 29
        assert batch_keys(engine) == KEPT_AFTER_30D == batch_keys(engine, t.batch_offsets)
    finally:
        reader.dispose()
        engine.dispose()


def test_the_latest_old_batches_read_per_row_are_those_read_per_partition_offset(pg_dsn: str) -> None:
    """Prune's keys on PostgreSQL come from the compact rows; the per-partition view gives the same."""
    from offset_ledger.ledger.prune import latest_old_batches_by_partition, latest_old_batches_by_row

    engine = _ledger(pg_dsn)
    try:
        with engine.connect() as conn:
            for days in (0, 5, 30, 45, 61):
                for pipeline in (None, "orders", "billing"):
                    cutoff = NOW - timedelta(days=days)
                    per_row = latest_old_batches_by_row(conn, cutoff, pipeline)
                    assert per_row == latest_old_batches_by_partition(conn, cutoff, pipeline), (days, pipeline)
            assert latest_old_batches_by_row(conn, NOW, None)  # not vacuous: every latest batch is old then
    finally:
        engine.dispose()


def test_the_live_windowed_queries_in_one_statement_are_those_asked_group_by_group(pg_dsn: str) -> None:
    """``live_stateful_queries`` (one statement) against ``queries.live_query_id`` per group, on PostgreSQL."""
    from offset_ledger.ledger.prune import live_stateful_queries
    from tests.unit.ledger.test_prune_live_queries import live_stateful_queries_per_group, random_ledger

    engine = make_engine(pg_dsn)
    try:
        upgrade(engine)
        found = []
        for seed_ in range(12):
            with engine.begin() as conn:
                for table in ("batches", "runs", "checkpoint_generations"):
                    conn.execute(text(f"DELETE FROM {table}"))
            random_ledger(engine, seed_)
            with engine.connect() as conn:
                for pipeline in (None, "p0", "p1"):
                    assert live_stateful_queries(conn, pipeline) == live_stateful_queries_per_group(conn, pipeline)
                found.append(len(live_stateful_queries(conn)))
        assert min(found) == 0 and max(found) >= 2, found
    finally:
        engine.dispose()
