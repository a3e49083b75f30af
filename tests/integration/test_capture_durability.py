"""Nothing the listener accepted is lost (issue 20, cases 5 and 6), on real Spark, Kafka and Postgres.

Every event is in the ledger, in the spool of *that* ledger, or in a dead-letter file with its reason.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url

from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.tables import batch_offsets
from tests.integration.test_listener import (  # noqa: F401 - fixtures
    finding_kinds,
    kafka_stream,
    ledger_rows,
    listeners,
    position_map,
    produce_rounds,
    register,
    spark_rows,
    start,
)


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


def _count_rows(dsn: str) -> int:
    engine = create_engine(dsn)
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(batch_offsets)).scalar_one())
    finally:
        engine.dispose()


def test_a_read_only_ledger_loses_nothing(spark, kafka, pg_dsn, listeners, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A failover window: the ledger refuses writes (SQLSTATE 25006) for a while, then takes them again."""
    engine = make_engine(pg_dsn)
    ensure_schema(engine)
    engine.dispose()
    # A small queue, so the read-only window also fills it and the spool takes the rest.
    listener = register(spark, listeners, tmp_path, dsn=pg_dsn, pipeline="failover", max_backoff=0.5,
                        queue_size=3)
    topic = kafka.create_topic(partitions=2)
    query = start(kafka_stream(spark, kafka, topic, max_per_trigger=10), tmp_path / "cp",
                  "failover_" + uuid.uuid4().hex[:6], trigger="100 milliseconds")
    try:
        produce_rounds(kafka, query, topic, rounds=2, per_round=10)
        assert listener.flush(60)
        before = listener.health()
        assert before.written > 0 and before.failed == 0
        rows_before = _count_rows(pg_dsn)

        _set_read_only(pg_dsn, True)
        produce_rounds(kafka, query, topic, rounds=3, per_round=20)  # several batches while read-only
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and listener.health().retried < 3 and listener.health().failed == 0:
            time.sleep(0.1)
        during = listener.health()
        # The window was real: the ledger took none of those batches while it was read-only.
        assert _count_rows(pg_dsn) == rows_before
        assert query.isActive and query.exception() is None
        assert during.failed == 0, during.last_error
        assert during.retried > 0 and during.pending > 0 and "25006" in (during.last_error or "")
        assert during.spilled > 0

        _set_read_only(pg_dsn, False)  # writable again; the writer's sessions must not stay read-only
        produce_rounds(kafka, query, topic, rounds=1, per_round=10)
        assert listener.flush(120)
        expected = spark_rows(query)
    finally:
        query.stop()
    assert listener.flush(60)
    health = listener.health()
    assert health.failed == 0 and health.pending == 0, health.last_error
    engine = create_engine(pg_dsn)
    try:
        got = ledger_rows(engine, str(query.id))
        assert got == expected  # the oracle: every batch Spark reported, exactly as it reported it
        assert finding_kinds(engine) == []  # no gap: each batch starts where the previous one ended
        assert position_map(engine, "failover") == {(topic, p): o for p, o in kafka.end_offsets(topic).items()}
    finally:
        engine.dispose()


def test_spooled_events_reach_their_own_ledger_only(spark, kafka, pg_dsn, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A listener closes while its Postgres is down and spills; a listener of another ledger on the
    same host and spool directory leaves the spool alone; one of the original ledger adopts it."""
    from offset_ledger import OffsetLedgerListener
    from offset_ledger.devstack import _Postgres

    spool = tmp_path / "spool"  # the one spool directory of this "host"
    pg = _Postgres(tmp_path / "pg")  # ledger A: a dedicated server that can be stopped
    dsn_a, _pid = pg.start()
    port = int(dsn_a.rsplit(":", 1)[1].split("/")[0])
    made: list[OffsetLedgerListener] = []
    try:
        for dsn in (dsn_a, pg_dsn):
            engine = make_engine(dsn)
            ensure_schema(engine)
            engine.dispose()
        first = OffsetLedgerListener(dsn=dsn_a, pipeline="spooled", spool_dir=spool, max_backoff=0.5)
        made.append(first)
        spark.streams.addListener(first)
        topic = kafka.create_topic(partitions=2)
        query = start(kafka_stream(spark, kafka, topic, max_per_trigger=10), tmp_path / "cp",
                      "spooled_" + uuid.uuid4().hex[:6], trigger="100 milliseconds")
        try:
            produce_rounds(kafka, query, topic, rounds=1, per_round=10)
            assert first.flush(60)
            pg.stop()
            produce_rounds(kafka, query, topic, rounds=3, per_round=20)  # batches the ledger never got
            expected = spark_rows(query)
        finally:
            query.stop()
        spark.streams.removeListener(first)
        assert not first.close(5)  # its Postgres is down: what it holds stays in the spool
        spilled = sorted(p for p in spool.iterdir() if p.is_file())
        assert spilled and first.health().failed == 0

        # Another ledger (the shared Postgres, another database) on the same host and spool directory.
        other = OffsetLedgerListener(dsn=pg_dsn, pipeline="spooled", spool_dir=spool)
        made.append(other)
        assert other.close(30)
        health = other.health()
        assert sorted(health.foreign_spool_paths) == [str(p) for p in spilled]
        assert health.foreign_spool_files == len(spilled) and health.written == 0
        assert sorted(p for p in spool.iterdir() if p.is_file()) == spilled  # left where they were
        assert _count_rows(pg_dsn) == 0  # its ledger got nothing

        pg.start(port=port)  # ledger A is back: a listener of it adopts the spool
        again = OffsetLedgerListener(dsn=dsn_a, pipeline="spooled", spool_dir=spool)
        made.append(again)
        assert again.close(60)
        assert again.health().failed == 0 and again.health().foreign_spool_files == 0
        assert not [p for p in spool.iterdir() if p.is_file()]
        engine = create_engine(dsn_a)
        try:
            assert ledger_rows(engine, str(query.id)) == expected  # the oracle: what Spark reported
            assert position_map(engine, "spooled") == {(topic, p): o for p, o in kafka.end_offsets(topic).items()}
        finally:
            engine.dispose()
    finally:
        for listener in made:
            listener.close(5)
        pg.stop()


def test_the_recorder_does_not_keep_a_read_only_session(pg_dsn: str) -> None:
    """After a read-only window the next write succeeds: no session that went read-only is pooled."""
    from datetime import datetime, timezone

    import pytest

    from offset_ledger.errors import LedgerUnavailable
    from offset_ledger.ledger.recorder import Recorder, RunStart

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
