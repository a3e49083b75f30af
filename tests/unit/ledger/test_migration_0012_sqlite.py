"""0012 (``runs.max_gap_ms``; open sink/watcher runs of ended queries closed) upgrades a 0009 ledger, and back."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import inspect, select, text

from offset_ledger.ledger.engine import current_revision, downgrade, head_revision, make_engine, upgrade
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.records import RunEnd, RunHeartbeat, RunStart
from offset_ledger.ledger.tables import runs

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)
S = timedelta(seconds=1)

_RUN = ("INSERT INTO runs (run_id, query_id, pipeline, consumer_group, started_at, terminated_at, last_heartbeat_at) "
        "VALUES (:r, :q, 'p', 'p', :s, :t, :h)")


def test_upgrade_from_0009_ends_sink_runs_of_ended_queries_and_keeps_old_writes_working(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        upgrade(engine, "0009")
        with engine.begin() as conn:
            if "max_gap_ms" in {c["name"] for c in inspect(conn).get_columns("runs")}:
                # 0001 builds from the live tables module; a real 0009 ledger has no such column.
                conn.execute(text("ALTER TABLE runs DROP COLUMN max_gap_ms"))
            conn.execute(text(_RUN), [
                # q1: the listener saw it end after the sink's last batch -> the sink's run is ended then.
                {"r": "l1", "q": "q1", "s": T0, "t": T0 + 50 * S, "h": T0 + 40 * S},
                {"r": "sink:q1", "q": "q1", "s": T0, "t": None, "h": T0 + 45 * S},
                # q2: the sink recorded a batch after the listener's end (a later run): left open.
                {"r": "l2", "q": "q2", "s": T0, "t": T0 + 10 * S, "h": T0 + 9 * S},
                {"r": "sink:q2", "q": "q2", "s": T0, "t": None, "h": T0 + 20 * S},
                # q3: sink only: nothing to end it.
                {"r": "sink:q3", "q": "q3", "s": T0, "t": None, "h": T0 + 5 * S},
            ])
        upgrade(engine)
        assert current_revision(engine) == head_revision()
        with engine.connect() as conn:
            ends = {r.run_id: r.terminated_at for r in conn.execute(select(runs.c.run_id, runs.c.terminated_at))}
        assert ends["sink:q1"] is not None and ends["sink:q1"].replace(tzinfo=timezone.utc) == T0 + 50 * S
        assert ends["sink:q2"] is None and ends["sink:q3"] is None
        # What a listener of the previous release writes names no max_gap_ms: it still records.
        rec = Recorder(engine)
        try:
            rec.record([RunStart("p", "p", "q4", "old", "p", T0), RunHeartbeat("p", "p", "q4", "old", T0 + S),
                        RunEnd("p", "p", "q4", "old", T0 + 2 * S)], now=T0 + 2 * S)
        finally:
            rec.close()
        downgrade(engine, "0009")
        assert "max_gap_ms" not in {c["name"] for c in inspect(engine).get_columns("runs")}
        upgrade(engine)
        assert "max_gap_ms" in {c["name"] for c in inspect(engine).get_columns("runs")}
    finally:
        engine.dispose()
