"""Every face as a team role, end to end on real Spark, Kafka and PostgreSQL (issue 48, case 3).

Team A's database role (``db grant --pipelines 'team-a-*'``) runs its pipeline the whole way: a fresh
``start_from_ledger``, its listener and a PostgresSink (target and staging in the role's own schema)
over two batches, a resumed start and one more batch, then ``watch``, ``prune --pipeline``,
``verify``, ``replay`` and ``resolve``. The oracle is the topic: every record in the target once, and
the ledger (read by the owner) holding exactly the batches Spark committed. Then the same calls naming
team B's pipeline: each is refused, B's rows are unchanged (read by the owner), and what an error
says about B is exactly what it says about a pipeline that does not exist.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url

from offset_ledger import OffsetLedgerListener, start_from_ledger
from offset_ledger.ledger.engine import ensure_schema, make_engine, permission_denied
from offset_ledger.ledger.tables import batches, checkpoint_generations, positions, sink_batches, sinks
from offset_ledger.sinks import PostgresSink
from tests.integration.test_team_walls_pg import grant
from tests.ops_seed import seed_pipeline

A, B, NOBODY = "team-a-orders", "team-b-payments", "team-b-nothing"


@pytest.fixture
def team(pg_dsn: str) -> Iterator[dict[str, str]]:
    """Two granted teams; team A's DSN, and a schema of its own (its sink's target and staging tables)."""
    suffix = uuid.uuid4().hex[:8]
    roles = {"a": f"stack_a_{suffix}", "b": f"stack_b_{suffix}"}
    admin = make_engine(pg_dsn)
    ensure_schema(admin)
    grant(pg_dsn, roles)
    with admin.begin() as conn:
        # "$user" comes first in the default search path: the role's unqualified tables go to its schema
        conn.execute(text(f'CREATE SCHEMA "{roles["a"]}" AUTHORIZATION "{roles["a"]}"'))
    seed_pipeline(admin, B, {"payments-b": {0: 70, 1: 80}})
    dsn_a = make_url(pg_dsn).set(username=roles["a"], password="pw").render_as_string(hide_password=False)
    try:
        yield {"dsn": pg_dsn, "dsn_a": dsn_a, **roles}
    finally:
        with admin.begin() as conn:
            for role in roles.values():
                conn.execute(text(f'DROP OWNED BY "{role}" CASCADE'))
                conn.execute(text(f'DROP ROLE "{role}"'))
        admin.dispose()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "offset-ledger"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=180)


def _b_state(dsn: str) -> dict[str, Any]:
    """Team B's rows, as the owner reads them."""
    admin = make_engine(dsn)
    try:
        with admin.connect() as conn:
            out = {}
            for table in ("runs", "batches", "positions", "checkpoint_generations", "sinks", "sink_batches",
                          "findings", "resets", "pruned_ranges", "listener_health"):
                out[table] = sorted(repr(tuple(r)) for r in conn.execute(
                    text(f"SELECT * FROM {table} WHERE pipeline LIKE 'team-b-%'")))
            out["ranges"] = conn.execute(text("SELECT count(*) FROM v_batch_offsets WHERE pipeline LIKE 'team-b-%'")
                                         ).scalar()
            return out
    finally:
        admin.dispose()


def _run(spark, kafka, topic: str, plan, sink, listener) -> None:  # type: ignore[no-untyped-def]
    spark.streams.addListener(listener)
    try:
        df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
              .option("subscribe", topic).option("startingOffsets", plan.starting_offsets_json)
              .option("maxOffsetsPerTrigger", "20").load()
              .selectExpr("CAST(value AS STRING) AS value", "topic", "partition", "offset"))
        query = (df.writeStream.queryName(A.replace("-", "_")).foreachBatch(sink)
                 .option("checkpointLocation", plan.checkpoint_location).trigger(availableNow=True).start())
        query.awaitTermination(180)
        assert query.exception() is None, query.exception()
        assert listener.flush(60)
    finally:
        spark.streams.removeListener(listener)
        assert listener.close(30)  # its last health report


def test_team_a_runs_every_face_and_team_b_stays_out_of_reach(spark, kafka, team, tmp_path: Path) -> None:
    dsn_a = team["dsn_a"]
    topic = kafka.create_topic(partitions=2)
    produced = [f"a{i}" for i in range(40)]
    kafka.produce(topic, produced)
    owner = make_engine(team["dsn"])
    with make_engine(dsn_a).begin() as conn:  # its target, in its own schema
        conn.execute(text("CREATE TABLE orders_out (id bigserial PRIMARY KEY, value text NOT NULL, topic text, "
                          '"partition" int, "offset" bigint)'))
    root = str(tmp_path / "ck")

    def plan():  # type: ignore[no-untyped-def]
        return start_from_ledger(A, [topic], bootstrap_servers=kafka.bootstrap_servers, checkpoint_root=root,
                                 app_version="1", dsn=dsn_a, first_run="earliest")

    def parts(p):  # type: ignore[no-untyped-def]
        sink = PostgresSink(table="orders_out", checkpoint_location=p.checkpoint_location, pipeline=A, dsn=dsn_a)
        return sink, OffsetLedgerListener(dsn=dsn_a, pipeline=A, app_version="1", spool_dir=tmp_path / "spool")

    b_before = _b_state(team["dsn"])
    first = plan()
    assert first.fresh_checkpoint
    _run(spark, kafka, topic, first, *parts(first))
    kafka.produce(topic, [f"b{i}" for i in range(10)])
    produced += [f"b{i}" for i in range(10)]
    resumed = plan()
    assert not resumed.fresh_checkpoint and resumed.checkpoint_location == first.checkpoint_location
    _run(spark, kafka, topic, resumed, *parts(resumed))

    # The oracle: every record once in the target; the ledger holds what Spark committed.
    with make_engine(dsn_a).connect() as conn:
        assert Counter(conn.execute(text("SELECT value FROM orders_out")).scalars()) == Counter(produced)
    with owner.connect() as conn:
        recorded = conn.execute(select(func.count()).select_from(batches).where(batches.c.pipeline == A)).scalar()
        assert recorded == 3  # 40 records at 20 a trigger, then 10
        assert conn.execute(select(func.sum(positions.c.next_offset)).where(positions.c.pipeline == A)).scalar() == 50
        assert conn.execute(select(func.count()).select_from(sink_batches).where(
            sink_batches.c.pipeline == A)).scalar() == 3
        assert conn.execute(text("SELECT count(*) FROM listener_health WHERE pipeline = :p"), {"p": A}).scalar() == 2

    checkpoint = resumed.checkpoint_location
    for args in (("watch", A, checkpoint, "--once"), ("verify", A), ("replay", A, "--batch", "0", "--format", "json"),
                 ("resolve", A, "--topic", topic, "--bootstrap-server", kafka.bootstrap_servers),
                 ("prune", "--pipeline", A, "--older-than", "1s", "--execute"),
                 ("verify", A)):  # after the prune: the same answer
        done = _cli(*args, "--dsn", dsn_a)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    with owner.connect() as conn:
        assert conn.execute(select(func.count()).select_from(batches).where(batches.c.pipeline == A)).scalar() < 3
        assert conn.execute(text("SELECT count(*) FROM pruned_ranges WHERE pipeline = :p"), {"p": A}).scalar() > 0

    # Team B's pipeline, named by team A: refused, nothing of B changes, nothing of B is told.
    for args in (("verify", "{p}"), ("replay", "{p}", "--batch", "0"),
                 ("resolve", "{p}", "--topic", topic, "--bootstrap-server", kafka.bootstrap_servers),
                 ("prune", "--pipeline", "{p}", "--older-than", "1s", "--execute"),
                 ("watch", "{p}", checkpoint, "--once"), ("history", "{p}"), ("offsets", "{p}")):
        other = _cli(*(a.format(p=B) for a in args), "--dsn", dsn_a)
        unknown = _cli(*(a.format(p=NOBODY) for a in args), "--dsn", dsn_a)
        # resolve writes nothing (a first run's plan for a name it cannot see); watch finds the checkpoint's
        # batches recorded already: both answer as for a name that does not exist, and write nothing
        assert other.returncode != 0 or args[0] in ("resolve", "watch"), (args, other.stdout, other.stderr)
        assert (other.returncode, other.stdout, other.stderr.replace(B, NOBODY)) == \
            (unknown.returncode, unknown.stdout, unknown.stderr), args
    b_topic = kafka.create_topic(partitions=2)
    said = {}
    for name in (B, NOBODY):
        with pytest.raises(Exception) as refused:
            start_from_ledger(name, [b_topic], bootstrap_servers=kafka.bootstrap_servers,
                              checkpoint_root=str(tmp_path / "b"), dsn=dsn_a, first_run="earliest")
        assert permission_denied(refused.value), refused.value  # the database's refusal, as itself
        said[name] = (type(refused.value).__name__, str(refused.value).replace(B, NOBODY))
    assert said[B] == said[NOBODY], said
    rows = spark.createDataFrame([("x", topic, 0, 0)], "value string, topic string, partition int, offset long")
    sunk = {}
    for name in (B, NOBODY):  # a sink of B's pipeline in team A's job: refused by the database
        with pytest.raises(Exception) as refused:
            PostgresSink(table="orders_out", checkpoint_location=checkpoint, pipeline=name, dsn=dsn_a).write(rows, 0)
        assert permission_denied(refused.value), refused.value
        sunk[name] = (type(refused.value).__name__, str(refused.value).replace(B, NOBODY))
    assert sunk[B] == sunk[NOBODY], sunk
    with make_engine(dsn_a).connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM orders_out WHERE value = 'x'")).scalar() == 0
    assert _b_state(team["dsn"]) == b_before
    with owner.connect() as conn:
        assert not conn.execute(select(sinks).where(sinks.c.pipeline == B)).first()
        assert not conn.execute(select(checkpoint_generations).where(
            checkpoint_generations.c.pipeline == NOBODY)).first()
    owner.dispose()
