"""Every query in docs/audit.md, run against Postgres holding what a real Spark query recorded.

The live pipeline's batches are recorded by ``OffsetLedgerListener`` from a real Kafka-reading query.
The truth comes from Spark itself: a ``foreachBatch`` sink notes which batch saw which (partition,
offset), and Kafka's end offsets say what was produced; the ledger's answers must match both.
Resets, findings and a silent old pipeline are added through the tables.
"""

from __future__ import annotations

import re
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, insert, text
from sqlalchemy.engine import Engine, make_url

from offset_ledger import OffsetLedgerListener
from offset_ledger.ledger import tables as t
from offset_ledger.ledger.engine import make_engine, upgrade

DOC = Path(__file__).resolve().parents[2] / "docs" / "audit.md"
_BLOCK = re.compile(r"<!-- query: ([\w-]+) -->\s*```sql\n(.*?)```", re.S)


def documented_queries() -> dict[str, tuple[str, dict[str, Any]]]:
    """name -> (SQL with :binds, the example values of its psql ``\\set`` lines)."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for name, body in _BLOCK.findall(DOC.read_text()):
        defaults: dict[str, Any] = {}
        sql_lines = []
        for line in body.splitlines():
            if line.startswith("\\set "):
                _, var, value = line.split(" ", 2)
                defaults[var] = value.strip("'") if value.startswith("'") else int(value)
            else:
                sql_lines.append(line)
        # psql's :'name' (quoted literal) and :name (raw) both become SQLAlchemy binds.
        sql = re.sub(r":'(\w+)'", r":\1", "\n".join(sql_lines)).strip().rstrip(";")
        out[name] = (sql, defaults)
    return out


def run_doc_query(engine: Engine, name: str, **params: Any) -> list[dict[str, Any]]:
    sql, defaults = documented_queries()[name]
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(sql), {**defaults, **params})]


# --------------------------------------------------------------------------- the recorded ledger


@dataclass
class Truth:
    """What Spark and Kafka say happened, independent of the ledger."""

    pipeline: str
    topic: str
    batch_of: dict[tuple[int, int], int] = field(default_factory=dict)  # (partition, offset) -> batch
    end_offsets: dict[int, int] = field(default_factory=dict)
    started: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    finished: datetime | None = None


def _run_pipeline(spark, bootstrap: str, topic: str, checkpoint: str, truth: Truth,  # type: ignore[no-untyped-def]
                  max_offsets: int | None = None) -> None:
    """One availableNow run of a real Kafka-reading query."""
    def note(df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        for row in df.select("partition", "offset").collect():
            truth.batch_of[(row.partition, row.offset)] = batch_id

    reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest"))
    if max_offsets:
        reader = reader.option("maxOffsetsPerTrigger", max_offsets)
    query = (reader.load().writeStream.foreachBatch(note)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None


def _seed_operations(engine: Engine, live: Truth, old_pipeline: str, old_topic: str) -> None:
    """A silent old pipeline with a gap, resets (recent and old) and findings."""
    now = datetime.now(timezone.utc)
    three_hours_ago = now - timedelta(hours=3)
    with engine.begin() as conn:
        for batch_id, (frm, until) in enumerate([(0, 100), (130, 200)]):  # 100..130 skipped
            bt = three_hours_ago + timedelta(seconds=batch_id)
            conn.execute(insert(t.batches).values(
                pipeline=old_pipeline, consumer_group=old_pipeline, query_id="q-old", run_id="r-old",
                batch_id=batch_id, batch_time=bt, recorded_at=bt, input_rows=until - frm))
            conn.execute(insert(t.batch_offsets).values(
                pipeline=old_pipeline, consumer_group=old_pipeline, query_id="q-old",
                batch_id=batch_id, source_index=0, topic=old_topic, partition=0,
                from_offset=frm, until_offset=until, batch_time=bt))
        conn.execute(insert(t.runs).values(
            run_id="r-old", query_id="q-old", pipeline=old_pipeline, consumer_group=old_pipeline,
            started_at=three_hours_ago, terminated_at=three_hours_ago + timedelta(minutes=1)))
        conn.execute(insert(t.findings), [
            dict(pipeline=old_pipeline, consumer_group=old_pipeline, kind="gap", topic=old_topic,
                 partition=0, query_id="q-old", batch_id=1, expected_offset=100, actual_offset=130,
                 message="batch 1 started at 130, batch 0 ended at 100", created_at=three_hours_ago),
            dict(pipeline=live.pipeline, consumer_group=live.pipeline, kind="data_loss",
                 topic=live.topic, partition=1, expected_offset=0, actual_offset=50,
                 message="50 records lost to retention", created_at=now, query_id=None, batch_id=None),
            dict(pipeline=live.pipeline, consumer_group=live.pipeline, kind="new_partition",
                 topic=live.topic, partition=2, message="new partition read from earliest",
                 created_at=now, query_id=None, batch_id=None, expected_offset=None, actual_offset=None),
        ])
        for rid, actor, reason, age, moves in [
            (1, "alice", "replay after the parser bug", timedelta(days=2), {0: (5, 0), 1: (7, 0)}),
            (2, "bob", "ancient history", timedelta(days=40), {0: (9, 3)}),
        ]:
            conn.execute(insert(t.resets).values(
                id=rid, pipeline=live.pipeline, consumer_group=live.pipeline, mode="earliest",
                actor=actor, reason=reason, dry_run=False, forced=False, created_at=now - age,
                status="consumed"))
            for part, (before, after) in moves.items():
                conn.execute(insert(t.reset_partitions).values(
                    reset_id=rid, topic=live.topic, partition=part, before_next_offset=before,
                    after_next_offset=after, log_start_offset=0, log_end_offset=before))


@pytest.fixture(scope="module")
def ledger(stack, kafka_session, spark) -> Iterator[tuple[Engine, Truth, str]]:  # type: ignore[no-untyped-def]
    """A Postgres ledger holding a real query's batches, recorded by OffsetLedgerListener, plus
    operations history (resets, findings, a silent pipeline) written through the tables."""
    admin_url = make_url(stack.postgres_dsn)
    name = f"t_audit_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    dsn = admin_url.set(database=name).render_as_string(hide_password=False)
    engine = make_engine(dsn)
    upgrade(engine)
    topic = f"t_audit_{uuid.uuid4().hex[:8]}"
    kafka_session.create_topic(partitions=3, name=topic)
    truth = Truth(pipeline="audit_live", topic=topic)
    checkpoint = tempfile.mkdtemp(prefix="audit-cp-")
    try:
        # Batch 0 on the empty topic (Spark reports no start for a fresh checkpoint's first batch),
        # then 300 records in several batches on the same checkpoint, each with a known start.
        # The listener records what Spark reports, exactly as in production.
        listener = OffsetLedgerListener(dsn=dsn, pipeline=truth.pipeline, spool_dir=Path(checkpoint) / "spool")
        spark.streams.addListener(listener)
        try:
            _run_pipeline(spark, kafka_session.bootstrap_servers, topic, checkpoint, truth)
            kafka_session.produce(topic, (f"v{i}" for i in range(300)))
            _run_pipeline(spark, kafka_session.bootstrap_servers, topic, checkpoint, truth, max_offsets=70)
            assert listener.flush(120), listener.health()
        finally:
            spark.streams.removeListener(listener)
            listener.close()
        truth.finished = datetime.now(timezone.utc)
        truth.end_offsets = kafka_session.end_offsets(topic)
        _seed_operations(engine, truth, "audit_old", f"{topic}_old")
        yield engine, truth, "audit_old"
    finally:
        engine.dispose()
        kafka_session.delete_topics([topic])
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


# --------------------------------------------------------------------------- one test per query


def test_which_batch_processed_an_offset(ledger) -> None:  # type: ignore[no-untyped-def]
    engine, truth, _ = ledger
    assert len(set(truth.batch_of.values())) >= 4, "the run should span several batches"
    for (partition, offset), batch_id in sorted(truth.batch_of.items())[::17]:
        rows = run_doc_query(engine, "which-batch", topic=truth.topic, partition=partition, offset=offset)
        assert [(r["pipeline"], r["batch_id"]) for r in rows] == [(truth.pipeline, batch_id)]
        assert rows[0]["from_offset"] <= offset < rows[0]["until_offset"]


def test_what_a_pipeline_processed_between_two_times(ledger) -> None:  # type: ignore[no-untyped-def]
    engine, truth, _ = ledger
    assert truth.finished is not None
    rows = run_doc_query(engine, "processed-between", pipeline=truth.pipeline,
                         since=(truth.started - timedelta(minutes=1)).isoformat(),
                         until=(truth.finished + timedelta(minutes=1)).isoformat())
    per_partition = Counter(p for p, _ in truth.batch_of)
    assert {r["partition"]: r["records"] for r in rows} == dict(per_partition)
    assert {r["partition"]: r["until_offset"] for r in rows} == truth.end_offsets
    assert all(r["first_offset"] == 0 for r in rows)
    # Batch 0 of the fresh checkpoint: Spark reported no start; the listener took it from sources/0/0.
    assert all(r["batches_without_start"] == 0 for r in rows)
    before = run_doc_query(engine, "processed-between", pipeline=truth.pipeline,
                           since=(truth.started - timedelta(days=2)).isoformat(),
                           until=(truth.started - timedelta(days=1)).isoformat())
    assert before == []


def test_every_reset_in_the_last_30_days_and_who_did_it(ledger) -> None:  # type: ignore[no-untyped-def]
    engine, truth, _ = ledger
    rows = run_doc_query(engine, "recent-resets")
    assert {r["actor"] for r in rows} == {"alice"}  # bob's reset is 40 days old
    assert [(r["partition"], r["before_next_offset"], r["after_next_offset"], r["moved_by"])
            for r in rows] == [(0, 5, 0, -5), (1, 7, 0, -7)]
    assert rows[0]["reason"] == "replay after the parser bug" and rows[0]["dry_run"] is False


def test_pipelines_silent_for_more_than_n_minutes(ledger) -> None:  # type: ignore[no-untyped-def]
    engine, truth, old = ledger
    rows = run_doc_query(engine, "stale-pipelines", minutes=60)
    assert [(r["pipeline"], r["active_runs"]) for r in rows] == [(old, 0)]
    assert rows[0]["silent_for"] > timedelta(hours=2)
    everything = run_doc_query(engine, "stale-pipelines", minutes=0)
    assert {r["pipeline"] for r in everything} == {old, truth.pipeline}


def test_gaps_and_data_loss_per_pipeline(ledger) -> None:  # type: ignore[no-untyped-def]
    engine, truth, old = ledger
    rows = run_doc_query(engine, "gaps-and-data-loss")
    assert [(r["pipeline"], r["kind"], r["findings"], r["offsets_affected"]) for r in rows] == [
        (truth.pipeline, "data_loss", 1, 50), (old, "gap", 1, 30)]


def test_records_processed_per_hour_per_topic(ledger) -> None:  # type: ignore[no-untyped-def]
    engine, truth, old = ledger
    rows = run_doc_query(engine, "records-per-hour")
    live = [r for r in rows if r["topic"] == truth.topic]
    assert sum(r["records"] for r in live) == len(truth.batch_of) == 300
    # Batch 0 ran on the empty topic with a fresh checkpoint: Spark reported its three ranges without
    # a start, and the listener took each from the checkpoint (sources/0/0), so none is unknown.
    assert sum(r["ranges_without_start"] for r in live) == 0
    assert all(r["pipelines"] == 1 for r in live)
    old_rows = [r for r in rows if r["topic"] == f"{truth.topic}_old"]
    assert sum(r["records"] for r in old_rows) == 170
    expected_hours = {truth.started.replace(minute=0, second=0, microsecond=0),
                      truth.finished.replace(minute=0, second=0, microsecond=0)}  # type: ignore[union-attr]
    assert {r["hour"] for r in live} <= expected_hours


def test_current_positions_match_kafka(ledger) -> None:  # type: ignore[no-untyped-def]
    engine, truth, _ = ledger
    rows = run_doc_query(engine, "current-positions", pipeline=truth.pipeline)
    assert {r["partition"]: r["next_offset"] for r in rows} == truth.end_offsets
    assert {r["placed_by"] for r in rows} == {"batch"}


def test_gaps_straight_from_history(ledger) -> None:  # type: ignore[no-untyped-def]
    engine, truth, old = ledger
    rows = run_doc_query(engine, "history-gaps")
    assert [(r["pipeline"], r["batch_id"], r["expected_from"], r["actual_from"]) for r in rows] == [
        (old, 1, 100, 130)]


def test_every_documented_query_has_a_test() -> None:
    """docs/audit.md's queries are exactly the ones the tests above run."""
    assert set(documented_queries()) == {
        "which-batch", "processed-between", "recent-resets", "stale-pipelines",
        "gaps-and-data-loss", "records-per-hour", "current-positions", "history-gaps"}
    source = Path(__file__).read_text()
    for name in documented_queries():
        assert f'run_doc_query(engine, "{name}"' in source


def test_views_upgrade_and_downgrade_on_sqlite(tmp_path: Path) -> None:
    from offset_ledger.ledger.engine import current_revision, downgrade

    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    upgrade(engine)
    # v_positions (0024): topic_positions unnested with the columns positions had, which v_current_positions reads
    views = {"v_current_positions", "v_batch_history", "v_resets", "v_findings", "v_pipeline_activity",
             "v_generations", "v_batch_outputs", "v_batch_offsets", "v_positions"}

    def present() -> set[str]:
        with engine.connect() as conn:
            return {r[0] for r in conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'view'"))}

    assert present() == views
    with engine.connect() as conn:
        for view in views:
            conn.execute(text(f"SELECT * FROM {view}")).fetchall()
    downgrade(engine, "0001")
    assert present() == set() and current_revision(engine) == "0001"
    upgrade(engine)
    assert present() == views


def test_views_upgrade_and_downgrade_on_postgres(pg_dsn: str) -> None:
    from offset_ledger.ledger.engine import current_revision, downgrade

    engine = make_engine(pg_dsn)
    # v_positions (0024): topic_positions unnested with the columns positions had, which v_current_positions reads
    views = {"v_current_positions", "v_batch_history", "v_resets", "v_findings", "v_pipeline_activity",
             "v_generations", "v_batch_outputs", "v_batch_offsets", "v_positions"}

    def present() -> set[str]:
        with engine.connect() as conn:
            return set(conn.execute(text(
                "SELECT table_name FROM information_schema.views WHERE table_schema = 'public'")).scalars())

    try:
        upgrade(engine)
        assert present() == views
        downgrade(engine, "0001")
        assert present() == set() and current_revision(engine) == "0001"
        upgrade(engine)
        assert present() == views
    finally:
        engine.dispose()
