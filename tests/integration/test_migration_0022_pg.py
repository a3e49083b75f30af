"""0022 (``runs.beat_at``, ``runs.beat_every_ms``: the driver heartbeat) on real PostgreSQL: a ledger
the previous release created and wrote keeps every run and audit answer, down and up; that release
keeps recording on the migrated ledger during a rolling upgrade (its runs have no heartbeat and read
``uncertain`` while inferred alive); this tree's runs beside them are judged on their beat."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import Engine

from offset_ledger.ledger.activity import open_runs, verdict
from offset_ledger.ledger.engine import current_revision, downgrade, head_revision, make_engine, upgrade
from offset_ledger.ledger.heartbeats import beat_runs
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.records import RunStart
from tests.previous_release import (
    HEARTBEAT_PREDECESSOR,
    extract,
    record_with_previous_release,
    run_documented,
    upgrade_with_release,
)


def _run_columns(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(text(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'runs'::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum")).scalars())


def _runs(engine: Engine) -> list[tuple]:  # type: ignore[type-arg]
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT run_id, query_id, pipeline, started_at, terminated_at, last_heartbeat_at, last_batch_id, "
            "max_batch_ms, max_gap_ms FROM runs ORDER BY run_id"))]


def _state(engine: Engine, pipeline: str, now: datetime) -> str:
    with engine.connect() as conn:
        return verdict(open_runs(conn, pipeline, pipeline, now=now).get((pipeline, pipeline), []), None,
                       now=now).state


def test_0022_adds_the_heartbeat_and_the_previous_release_keeps_recording(pg_dsn: str, tmp_path: Path) -> None:
    previous = extract(tmp_path / "previous", HEARTBEAT_PREDECESSOR)
    upgrade_with_release(previous, pg_dsn, "0021")  # the previous release's own ledger, its own runs columns
    engine = make_engine(pg_dsn)
    role = f"hb_reader_{uuid.uuid4().hex[:8]}"
    try:
        assert "beat_at" not in _run_columns(engine)
        record_with_previous_release(previous, pg_dsn, "orders", "q-a")
        with engine.begin() as conn:
            conn.execute(text(f'CREATE ROLE "{role}"'))
            conn.execute(text(f'GRANT SELECT ON runs TO "{role}"'))
            documented = run_documented(conn)
        before = _runs(engine)
        assert before, "the previous release recorded no run"

        upgrade(engine)
        assert current_revision(engine) == head_revision()
        assert _run_columns(engine)[-2:] == ["beat_at", "beat_every_ms"]
        assert _runs(engine) == before
        with engine.connect() as conn:
            assert run_documented(conn) == documented
            assert conn.execute(text(f"SELECT has_table_privilege('{role}', 'runs', 'SELECT')")).scalar()
            assert conn.execute(text("SELECT count(*) FROM runs WHERE beat_at IS NOT NULL")).scalar() == 0

        # A rolling upgrade: the previous release's listener records on the migrated ledger...
        more = record_with_previous_release(previous, pg_dsn, "payments", "q-c")
        assert [o[:2] for o in more["outcomes"]] == [[1, 0], [1, 0], [1, 0], [1, 0], [3, 0]]
        # ...and this tree's listener beside it beats.
        now = datetime.now(timezone.utc)
        rec = Recorder(engine)
        try:
            rec.record([RunStart("fresh", "fresh", "q-f", "run-f", "fresh", now - timedelta(seconds=5),
                                 beat_every_ms=10_000)])
        finally:
            rec.close()
        assert beat_runs(engine, ["run-f"], now, 10_000) == 1
        assert _state(engine, "fresh", now + timedelta(seconds=20)) == "running"
        # The previous release's run (no heartbeat): inferred, and said to be.
        with engine.begin() as conn:
            conn.execute(text("UPDATE runs SET last_heartbeat_at = :at WHERE pipeline = 'payments'"), {"at": now})
        assert _state(engine, "payments", now + timedelta(seconds=20)) == "uncertain"

        # Down (the columns go, every other value stays) and up again.
        kept = _runs(engine)
        downgrade(engine, "0021")
        assert "beat_at" not in _run_columns(engine) and _runs(engine) == kept
        record_with_previous_release(previous, pg_dsn, "refunds", "q-d")  # the previous release on 0021 again
        upgrade(engine)
        assert _run_columns(engine)[-2:] == ["beat_at", "beat_every_ms"]
        assert len(_runs(engine)) == len(kept) + 1
    finally:
        with engine.begin() as conn:
            conn.execute(text(f'DROP OWNED BY "{role}"'))
            conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        engine.dispose()
