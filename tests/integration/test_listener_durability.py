"""Nothing the listener accepted is lost: a read-only (failing-over) ledger, and spools of other ledgers.

Real Spark reading real Kafka, writing to real Postgres; the oracle is what Spark itself reported.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import Engine, make_url

from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.tables import batch_offsets
from tests.integration.test_listener import (
    finding_kinds,
    kafka_stream,
    ledger_rows,
    position_map,
    produce_rounds,
    register,
    spark_rows,
    start,
)


@pytest.fixture
def listeners(spark) -> Iterator[list]:  # type: ignore[no-untyped-def]
    made: list = []
    yield made
    for listener in made:
        spark.streams.removeListener(listener)
        listener.close(10)


def _set_read_only(admin: Engine, database: str, on: bool) -> None:
    """What a failover looks like to the writer: its sessions end, new ones cannot write (SQLSTATE 25006)."""
    with admin.connect() as conn:
        if on:
            conn.execute(text(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on'))
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = :db AND pid <> pg_backend_pid()"), {"db": database})
        else:
            conn.execute(text(f'ALTER DATABASE "{database}" RESET default_transaction_read_only'))


def test_a_read_only_window_loses_nothing(spark, kafka, stack, ledger, pg_dsn, listeners,  # type: ignore[no-untyped-def]
                                          tmp_path: Path) -> None:
    database = make_url(pg_dsn).database
    assert database
    admin = create_engine(make_url(stack.postgres_dsn), isolation_level="AUTOCOMMIT")
    listener = register(spark, listeners, tmp_path, dsn=pg_dsn, pipeline="failover", max_backoff=0.5,
                        queue_size=3, health_interval=0.5)
    topic = kafka.create_topic(partitions=2)
    query = start(kafka_stream(spark, kafka, topic, max_per_trigger=10), tmp_path / "cp",
                  "failover_" + uuid.uuid4().hex[:6], trigger="100 milliseconds")
    try:
        produce_rounds(kafka, query, topic, rounds=2, per_round=10)
        assert listener.flush(60)
        before = listener.health().written
        _set_read_only(admin, database, True)
        try:
            produce_rounds(kafka, query, topic, rounds=3, per_round=20)  # 6+ batches while read-only
            deadline = time.monotonic() + 30
            while listener.health().retried == 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            during = listener.health()
            assert during.retried > 0 and during.pending > 0, during
            assert during.failed == 0 and during.written == before, during
            assert "read-only" in (during.last_error or "") or "shut down" in (during.last_error or "")
        finally:
            _set_read_only(admin, database, False)
        produce_rounds(kafka, query, topic, rounds=1, per_round=10)
        assert listener.flush(120)
        expected = spark_rows(query)
    finally:
        query.stop()
    assert listener.flush(60)
    got = ledger_rows(ledger, str(query.id))
    assert got == expected
    batch_ids = sorted({r[0] for r in got})
    assert batch_ids == list(range(batch_ids[0], batch_ids[-1] + 1))  # every batch, no hole
    assert finding_kinds(ledger) == []
    assert position_map(ledger, "failover") == {(topic, p): o for p, o in kafka.end_offsets(topic).items()}
    health = listener.health()
    assert health.failed == 0 and health.pending == 0
    admin.dispose()


def count_batches(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(batch_offsets)).scalar() or 0)


def test_spooled_events_reach_their_own_ledger_only(spark, kafka, ledger, pg_dsn, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A listener closes while its (dedicated) Postgres is down; one of another ledger on the same host and
    spool directory leaves the spool alone; one of the original ledger adopts it once that is back."""
    from offset_ledger import OffsetLedgerListener
    from offset_ledger.devstack.postgres import Postgres

    spool = tmp_path / "spool"
    # Outside pytest's private temp root: another pytest session on the machine resets that root to
    # 0700, and the postgres user (the server refuses to run as root) could no longer reach its data.
    pg_root = Path(tempfile.mkdtemp(prefix="offset-ledger-spool-pg-"))
    pg = Postgres(pg_root)
    dsn, _pid = pg.start()
    port = int(dsn.rsplit(":", 1)[1].split("/")[0])
    try:
        own = make_engine(dsn)
        ensure_schema(own)
        first = OffsetLedgerListener(dsn=dsn, pipeline="spooled", spool_dir=spool, queue_size=2, max_backoff=0.5)
        spark.streams.addListener(first)
        topic = kafka.create_topic(partitions=2)
        query = start(kafka_stream(spark, kafka, topic, max_per_trigger=10), tmp_path / "cp",
                      "spooled_" + uuid.uuid4().hex[:6])
        try:
            produce_rounds(kafka, query, topic, rounds=1, per_round=10)
            assert first.flush(60)
            own.dispose()
            pg.stop()
            produce_rounds(kafka, query, topic, rounds=3, per_round=20)
            expected = spark_rows(query)
        finally:
            query.stop()
        spark.streams.removeListener(first)
        assert not first.close(3)  # its ledger is down: what it holds goes to the spool
        assert first.health().spilled > 0 and first.health().failed == 0
        files = sorted(p for p in spool.iterdir() if p.is_file())
        assert files

        other = OffsetLedgerListener(dsn=pg_dsn, pipeline="spooled", spool_dir=spool)
        health = other.health()
        assert other.close(10)
        assert count_batches(ledger) == 0  # another ledger gets nothing
        assert health.foreign_spool_files == len(files) and sorted(health.foreign_spool_paths) == [str(p) for p in files]
        assert sorted(p for p in spool.iterdir() if p.is_file()) == files  # left untouched

        pg.start(port=port)
        again = OffsetLedgerListener(dsn=dsn, pipeline="spooled", spool_dir=spool)
        assert again.health().foreign_spool_files == 0
        assert again.close(60)
        own = create_engine(dsn)
        assert ledger_rows(own, str(query.id)) == expected
        assert finding_kinds(own) == []
        assert position_map(own, "spooled") == {(topic, p): o for p, o in kafka.end_offsets(topic).items()}
        own.dispose()
        assert [p for p in spool.iterdir() if p.is_file()] == []
        assert again.health().failed == 0
    finally:
        pg.stop()
        shutil.rmtree(pg_root, ignore_errors=True)
