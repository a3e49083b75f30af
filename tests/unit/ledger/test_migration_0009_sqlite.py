"""0009 (``pruned_ranges``: what prune deleted) upgrades a 0005 ledger with data, and back."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import inspect, select, text

from offset_ledger.ledger.engine import (
    current_revision,
    downgrade,
    head_revision,
    make_engine,
    upgrade,
)
from offset_ledger.ledger.tables import batches, pruned_ranges

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)


def test_upgrade_from_0005_with_data_adds_pruned_ranges_and_keeps_rows(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        upgrade(engine, "0005")
        with engine.begin() as conn:
            # Whatever 0001 builds from the live module, a real 0005 ledger has no pruned_ranges.
            conn.execute(text("DROP TABLE IF EXISTS pruned_ranges"))
            conn.execute(text(
                "INSERT INTO batches (pipeline, consumer_group, query_id, run_id, batch_id, batch_time, "
                "recorded_at, input_rows) VALUES ('orders', 'orders', 'q0', 'r0', 0, :at, :at, 5)"), {"at": T0})
        assert not inspect(engine).has_table("pruned_ranges")
        upgrade(engine)
        assert current_revision(engine) == head_revision()
        assert {c["name"] for c in inspect(engine).get_columns("pruned_ranges")} == set(pruned_ranges.c.keys())
        with engine.connect() as conn:
            assert conn.execute(select(batches.c.query_id, batches.c.input_rows)).one() == ("q0", 5)
            assert conn.execute(select(pruned_ranges)).all() == []
        downgrade(engine, "0005")
        assert not inspect(engine).has_table("pruned_ranges")
        upgrade(engine)
        assert inspect(engine).has_table("pruned_ranges")
    finally:
        engine.dispose()
