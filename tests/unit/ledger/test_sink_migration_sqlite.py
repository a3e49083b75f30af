"""0006 (sinks, sink_batches, v_batch_outputs) upgrades a 0005 ledger with data and goes back."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import inspect, text

from offset_ledger.ledger.engine import current_revision, downgrade, head_revision, make_engine, upgrade

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)


def test_upgrade_from_0005_with_data_adds_the_sink_tables_and_view(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        upgrade(engine, "0005")
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO batches (pipeline, consumer_group, query_id, run_id, batch_id, batch_time, "
                "recorded_at, input_rows) VALUES ('orders', 'orders', 'q0', 'r0', 0, :at, :at, 5)"), {"at": T0})
        assert not {"sinks", "sink_batches"} & set(inspect(engine).get_table_names())
        upgrade(engine)
        assert current_revision(engine) == head_revision()
        assert {"sinks", "sink_batches"} <= set(inspect(engine).get_table_names())
        with engine.begin() as conn:
            assert conn.execute(text("SELECT input_rows FROM batches")).scalar() == 5
            conn.execute(text("INSERT INTO sinks (sink, pipeline, consumer_group, kind, target, last_sequence, "
                              "updated_at) VALUES ('s', 'orders', 'orders', 'postgres', 'out', 1, :at)"), {"at": T0})
            conn.execute(text(
                "INSERT INTO sink_batches (sink, pipeline, consumer_group, sequence, generation_id, query_id, batch_id, "
                "target, row_count, committed_at, recorded_at) VALUES ('s', 'orders', 'orders', 1, 1, 'q0', 0, 'out', "
                "5, :at, :at)"), {"at": T0})
            row = conn.execute(text("SELECT sink, sequence, row_count, batch_input_rows, target_database "
                                    "FROM v_batch_outputs")).one()
            assert tuple(row) == ("s", 1, 5, 5, "ledger")
        downgrade(engine, "0005")
        assert not {"sinks", "sink_batches"} & set(inspect(engine).get_table_names())
        with engine.connect() as conn:
            assert conn.execute(text("SELECT input_rows FROM batches")).scalar() == 5
        upgrade(engine)
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()
