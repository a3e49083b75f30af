"""0005 (stored stateful inputs, defaulted groups, batch source, finding counts) upgrades a 0004 ledger with data."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import inspect, select, text

from offset_ledger.ledger.engine import current_revision, downgrade, ensure_schema, head_revision, make_engine, upgrade
from offset_ledger.ledger.tables import batches, checkpoint_generations, findings

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
_ADDED = {"checkpoint_generations": ["stateful", "group_defaulted"], "batches": ["source"],
          "findings": ["occurrences", "last_seen_at"]}


def test_upgrade_from_0004_with_data_adds_the_columns_and_keeps_rows(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        upgrade(engine, "0004")
        with engine.begin() as conn:
            # 0001 builds tables from the live module: take 0005's columns away to get a real 0004 ledger.
            views = [r[0] for r in conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'view'"))]
            ddl = {r[0]: r[1] for r in conn.execute(text("SELECT name, sql FROM sqlite_master WHERE type = 'view'"))}
            for view in views:
                conn.execute(text(f"DROP VIEW {view}"))
            for table, columns in _ADDED.items():
                for column in columns:
                    conn.execute(text(f"ALTER TABLE {table} DROP COLUMN {column}"))
            for view in views:
                conn.execute(text(ddl[view]))
            conn.execute(text(
                "INSERT INTO batches (pipeline, consumer_group, query_id, run_id, batch_id, batch_time, "
                "recorded_at, input_rows) VALUES ('orders', 'orders', 'q0', 'r0', 0, :at, :at, 5)"), {"at": T0})
            conn.execute(text(
                "INSERT INTO checkpoint_generations (pipeline, consumer_group, generation, checkpoint_root, location, "
                "reason, created_at) VALUES ('orders', 'orders', 1, '/ck', '/ck/gen-1-aaaaaaaa', 'first', :at)"),
                {"at": T0})
            conn.execute(text("INSERT INTO findings (pipeline, consumer_group, kind, message, created_at) "
                              "VALUES ('orders', 'orders', 'gap', 'old', :at)"), {"at": T0})
        for table, columns in _ADDED.items():
            assert not set(columns) & {c["name"] for c in inspect(engine).get_columns(table)}
        upgrade(engine)
        assert current_revision(engine) == head_revision()
        for table, columns in _ADDED.items():
            assert set(columns) <= {c["name"] for c in inspect(engine).get_columns(table)}
        with engine.connect() as conn:
            b = conn.execute(select(batches)).one()
            assert (b.query_id, b.input_rows, b.source) == ("q0", 5, None)
            g = conn.execute(select(checkpoint_generations)).one()
            assert (g.location, g.stateful, g.group_defaulted) == ("/ck/gen-1-aaaaaaaa", None, None)
            f = conn.execute(select(findings)).one()
            assert (f.message, f.occurrences, f.last_seen_at) == ("old", None, None)
            assert tuple(conn.execute(text("SELECT message, occurrences FROM v_findings")).one()) == ("old", 1)
            assert tuple(conn.execute(text("SELECT batch_id, recorded_by FROM v_batch_history")).all()) == ()
        # And back: 0004's views and columns again, the rows kept.
        downgrade(engine, "0004")
        assert "occurrences" not in {c["name"] for c in inspect(engine).get_columns("findings")}
        with engine.connect() as conn:
            assert conn.execute(text("SELECT message FROM v_findings")).scalar() == "old"
        upgrade(engine)
        assert current_revision(engine) == head_revision()
        fresh = make_engine(f"sqlite:///{tmp_path / 'fresh.db'}")
        ensure_schema(fresh)
        assert current_revision(fresh) == head_revision()
        fresh.dispose()
    finally:
        engine.dispose()
