"""0022 (the driver heartbeat's ``runs`` columns) upgrades a 0021 SQLite ledger with runs in it, and back."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import inspect, text

from offset_ledger.ledger.engine import current_revision, downgrade, head_revision, make_engine, upgrade
from offset_ledger.ledger.heartbeats import beat_runs
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.records import RunEnd, RunStart

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)


def _columns(engine) -> set[str]:  # type: ignore[no-untyped-def]
    return {c["name"] for c in inspect(engine).get_columns("runs")}


def test_upgrade_from_0021_keeps_runs_and_old_writes_work_down_and_up(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        upgrade(engine, "0021")
        with engine.begin() as conn:
            for name in ("beat_every_ms", "beat_at"):  # 0001 builds from the live tables module
                if name in _columns(engine):
                    conn.execute(text(f"ALTER TABLE runs DROP COLUMN {name}"))
            conn.execute(text("INSERT INTO runs (run_id, query_id, pipeline, consumer_group, started_at) "
                              "VALUES ('old', 'q0', 'p', 'p', :s)"), {"s": T0})
        upgrade(engine)
        assert current_revision(engine) == head_revision()
        assert {"beat_at", "beat_every_ms"} <= _columns(engine)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT run_id, beat_at FROM runs")).all() == [("old", None)]
        rec = Recorder(engine)
        try:  # what a listener of the previous release writes names neither column
            rec.record([RunStart("p", "p", "q1", "r1", "p", T0), RunEnd("p", "p", "q1", "r1", T0)], now=T0)
        finally:
            rec.close()
        assert beat_runs(engine, ["old"], T0, 10_000) == 1
        downgrade(engine, "0021")
        assert not {"beat_at", "beat_every_ms"} & _columns(engine)
        upgrade(engine)
        assert {"beat_at", "beat_every_ms"} <= _columns(engine)
        with engine.connect() as conn:
            assert sorted(conn.execute(text("SELECT run_id FROM runs")).scalars()) == ["old", "r1"]
    finally:
        engine.dispose()
