"""0006 on PostgreSQL: a 0005 ledger with data upgrades (sink tables, v_batch_outputs) and downgrades."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import inspect, text

from offset_ledger.ledger.engine import current_revision, downgrade, head_revision, make_engine, upgrade

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)


def test_db_upgrade_from_0005_with_data_on_postgres(pg_dsn: str) -> None:
    engine = make_engine(pg_dsn)
    try:
        upgrade(engine, "0005")
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO batches (pipeline, consumer_group, query_id, run_id, batch_id, batch_time, "
                "recorded_at, input_rows) VALUES ('orders', 'orders', 'q0', 'r0', 3, :at, :at, 7)"), {"at": T0})
        upgrade(engine)
        assert current_revision(engine) == head_revision()
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO sinks (sink, pipeline, consumer_group, kind, target, last_sequence, "
                              "updated_at) VALUES ('s', 'orders', 'orders', 'delta', '/t', 1, :at)"), {"at": T0})
            conn.execute(text(
                "INSERT INTO sink_batches (sink, pipeline, consumer_group, sequence, generation_id, query_id, batch_id, "
                "target, row_count, table_version, committed_at, recorded_at) VALUES ('s', 'orders', 'orders', 1, 1, "
                "'q0', 3, '/t', 7, 0, :at, :at)"), {"at": T0})
            assert tuple(conn.execute(text("SELECT sink_kind, table_version, batch_input_rows FROM v_batch_outputs"))
                         .one()) == ("delta", 0, 7)
        downgrade(engine, "0005")
        assert not {"sinks", "sink_batches"} & set(inspect(engine).get_table_names())
        upgrade(engine)
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()
