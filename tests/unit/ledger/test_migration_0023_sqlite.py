"""0023 (``listener_health.ledger_role``) on SQLite, which has no roles: the column (NULL there) comes and
goes with the rows kept, and a report works at head. A ledger made at 0022 by this tree already has the
column (0001 builds today's metadata); the downgrade drops it and the upgrade adds it back."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import text

from offset_ledger.ledger.engine import current_revision, downgrade, head_revision, make_engine, upgrade
from offset_ledger.ledger.recorder import Recorder


def _rows(engine) -> list[tuple]:  # type: ignore[no-untyped-def,type-arg]
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT listener_id, pipeline, host, written FROM listener_health ORDER BY 1"))]


def _columns(engine) -> list[str]:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        return [r[1] for r in conn.execute(text("PRAGMA table_info(listener_health)"))]


def test_0023_adds_the_role_column_on_sqlite_both_ways(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        upgrade(engine, "0022")
        with engine.begin() as conn:  # a column list 0022 knows: 0001 builds today's metadata
            conn.execute(text("INSERT INTO listener_health (listener_id, pipeline, host, reported_at, queued, "
                              "written, retried, spilled, failed) "
                              "VALUES ('l1', NULL, 'h', '2026-11-28 12:00:00', 0, 4, 0, 0, 0)"))
        before = _rows(engine)
        upgrade(engine, "0023")
        assert "ledger_role" in _columns(engine) and _rows(engine) == before
        Recorder(engine).report_health("l2", None, "h2", {"written": 1}, None)
        after = _rows(engine)
        assert len(after) == 2
        downgrade(engine, "0022")
        assert "ledger_role" not in _columns(engine) and _rows(engine) == after
        upgrade(engine)
        assert current_revision(engine) == head_revision() and _rows(engine) == after
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM listener_health WHERE ledger_role IS NULL")).scalar() == 2
    finally:
        engine.dispose()
