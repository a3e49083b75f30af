"""The recorder after a failover window, on the real Postgres: no session that went read-only is reused.

The listener-level tests (test_listener_durability.py) pass even if only the raw-cursor path drops
such a session, because the listener's batches reach that path; this one goes through the
SQLAlchemy-executed statements (a run's start), where the connection must not go back to the pool.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from offset_ledger.errors import LedgerUnavailable
from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.records import RunStart


def _set_read_only(pg_dsn: str, on: bool) -> None:
    """Make the database read-only for new sessions, as a demoted primary is, and end the current ones."""
    url = make_url(pg_dsn)
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{url.database}" SET default_transaction_read_only = '
                              f'{"on" if on else "off"}'))
            if on:
                conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  "WHERE datname = :db AND pid <> pg_backend_pid()"), {"db": url.database})
    finally:
        admin.dispose()


def test_the_recorder_does_not_keep_a_read_only_session(pg_dsn: str) -> None:
    """After a read-only window the next write succeeds: no session that went read-only is pooled."""
    engine = make_engine(pg_dsn, pool_size=1)
    ensure_schema(engine)
    recorder = Recorder(engine)

    def run_start(n: int) -> list:  # type: ignore[type-arg]
        return [RunStart("ro", "ro", "q-1", f"run-{n}", "ro", datetime.now(timezone.utc))]

    try:
        recorder.record(run_start(0))
        _set_read_only(pg_dsn, True)
        for n in range(1, 4):  # the terminated session first, then read-only ones: all retriable
            with pytest.raises(LedgerUnavailable):
                recorder.record(run_start(n))
        _set_read_only(pg_dsn, False)
        recorder.record(run_start(4))  # at once: no backend termination needed on the way back
        with engine.connect() as conn:
            runs = conn.execute(text("SELECT run_id FROM runs ORDER BY run_id")).scalars().all()
        assert runs == ["run-0", "run-4"]
    finally:
        recorder.close()
        engine.dispose()
