"""0014 (pruned islands keep the evidence) upgrades a 0009 ledger with pruned data, converting where it can, and back."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import inspect, select, text

from offset_ledger.ledger.engine import current_revision, downgrade, head_revision, make_engine, upgrade
from offset_ledger.ledger.tables import pruned_ranges

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)


def _island(conn, query: str, from_batch: int, from_offset: int) -> None:  # type: ignore[no-untyped-def]
    conn.execute(text(
        "INSERT INTO pruned_ranges (pipeline, consumer_group, query_id, topic, partition, from_batch_id, "
        "until_batch_id, from_offset, until_offset, batches, first_batch_time, cutoff, pruned_at) VALUES "
        "('orders', 'orders', :q, 't', 0, :b, :b + 2, :f, :f + 30, 3, :at, :at, :at)"),
        {"q": query, "b": from_batch, "f": from_offset, "at": T0})


def test_upgrade_converts_the_islands_it_can_and_keeps_the_rest_as_0009_explained_them(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        upgrade(engine, "0005")
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE IF EXISTS pruned_ranges"))  # a real 0005 ledger has none
        upgrade(engine, "0009")
        assert "counts_reads" not in {c["name"] for c in inspect(engine).get_columns("pruned_ranges")}
        with engine.begin() as conn:
            _island(conn, "q1", 0, 0)     # begins with q1's first batch: its start may have been unreported
            _island(conn, "q1", 5, 50)    # a later batch's start is always reported: convertible
            _island(conn, "qz", 4, 40)    # a flagged run of qz: the flag explained its reads
            conn.execute(text("INSERT INTO runs (pipeline, consumer_group, query_id, run_id, started_at) "
                              "VALUES ('orders', 'orders', 'qz', 'rz', :at)"), {"at": T0})
            conn.execute(text("INSERT INTO findings (pipeline, consumer_group, kind, run_id, message, created_at) "
                              "VALUES ('orders', 'orders', 'foreign_run', 'rz', 'zombie', :at)"), {"at": T0})
        upgrade(engine)
        assert current_revision(engine) == head_revision()
        assert {c["name"] for c in inspect(engine).get_columns("pruned_ranges")} == set(pruned_ranges.c.keys())
        with engine.connect() as conn:
            got = sorted(tuple(r) for r in conn.execute(select(
                pruned_ranges.c.query_id, pruned_ranges.c.from_batch_id, pruned_ranges.c.counts_reads)))
        assert got == [("q1", 0, False), ("q1", 5, True), ("qz", 4, False)]
        with engine.begin() as conn:  # an island 0014 records with an unknown start, then back to 0009
            conn.execute(pruned_ranges.update().where(pruned_ranges.c.from_batch_id == 0)
                         .values(from_offset=None, first_until_offset=10))
        downgrade(engine, "0009")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT from_offset FROM pruned_ranges WHERE from_batch_id = 0")).scalar() == 10
        upgrade(engine)
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()
