"""Fences per sink: one sink's commit never lets the plan skip records another sink lacks (issue 47, case 4).

Two transactional sinks in one ``foreachBatch``. Generation 1's driver commits batch 2 into sink A, then an
upgrade opens generation 2 and the driver is fenced at sink B. Before, the plan started where A's commit
ended (the positions it moved, or ``sink_ahead`` past a remote target's late commit) for both sinks, so B
never received batch 2's records. Now the plan starts where the sink furthest behind stopped, and a sink
skips, within a batch, the records it already holds. Oracle: the topic's records, each exactly once in
*each* sink's table.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from offset_ledger import start_from_ledger
from offset_ledger.errors import SinkFenced
from offset_ledger.sinks import PostgresSink
from tests.integration.conftest import fresh_database
from tests.integration.sink_helper import create_target, target_values
from tests.integration.test_adopt_replay import _cli
from tests.integration.test_restart import _values
from tests.integration.test_sink_remote_target import _Zombie


@pytest.fixture
def target_dsn(stack) -> Iterator[str]:  # type: ignore[no-untyped-def]
    with fresh_database(stack, f"target_{uuid.uuid4().hex[:8]}") as dsn:
        yield dsn


class _Both:
    """The job's ``foreachBatch``: sink A, then sink B; ``between(batch_id)`` runs after A's write."""

    def __init__(self, a: Any, b: Any, between: Callable[[int], None] | None = None) -> None:
        self.a, self.b, self.between = a, b, between
        self.raised: list[BaseException] = []
        self.verdicts: list[tuple[int, str, str]] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        try:
            for name, sink in (("a", self.a), ("b", self.b)):
                done = sink.write(df, batch_id)
                self.verdicts.append((batch_id, name, done.verdict))
                if name == "a" and self.between is not None:
                    self.between(batch_id)
        except BaseException as exc:
            self.raised.append(exc)
            raise


def _run(spark, kafka, topic: str, plan, fn, per_trigger: int = 10) -> bool:  # type: ignore[no-untyped-def]
    df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
          .option("subscribe", topic).option("startingOffsets", plan.starting_offsets_json)
          .option("maxOffsetsPerTrigger", str(per_trigger)).load()
          .selectExpr("CAST(value AS STRING) AS value", "topic", "partition", "offset"))
    query = (df.writeStream.foreachBatch(fn).option("checkpointLocation", plan.checkpoint_location)
             .trigger(availableNow=True).start())
    from pyspark.errors import StreamingQueryException

    try:
        query.awaitTermination()
    except StreamingQueryException:
        return False
    return query.exception() is None


def _once(dsn: str, table: str) -> Counter:  # type: ignore[type-arg]
    held = target_values(dsn, table)
    twice = sorted(v for v, n in held.items() if n > 1)
    assert not twice, f"{table}: records written twice: {twice}"
    return held


def _outputs(dsn: str) -> list[tuple[str, int, int, int]]:
    engine = create_engine(dsn)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(  # type: ignore[misc]
                "SELECT sink, sequence, generation, row_count FROM v_batch_outputs ORDER BY sink, sequence"))]
    finally:
        engine.dispose()


def test_a_driver_fenced_at_one_sink_after_the_other_committed_leaves_no_hole_in_either(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    """Both sinks in the ledger's database: A commits batch 2, the upgrade opens generation 2, B is fenced.

    On main generation 2 started where A's commit moved the positions, and B's table lacked batch 2.
    """
    topic = kafka.create_topic(partitions=2)
    produced = _values("f", 40)
    kafka.produce(topic, produced)
    create_target(pg_dsn, "out_a")
    create_target(pg_dsn, "out_b")
    root = str(tmp_path / "ck")
    a = PostgresSink(table="out_a", pipeline="orders", dsn=pg_dsn)
    b = PostgresSink(table="out_b", pipeline="orders", dsn=pg_dsn)

    def plan(version: str):  # type: ignore[no-untyped-def]
        return start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers, checkpoint_root=root,
                                 app_version=version, dsn=pg_dsn, first_run="earliest", sinks=[a, b])

    upgraded: list[Any] = []

    def upgrade_at_batch_2(batch_id: int) -> None:
        if batch_id == 2 and not upgraded:
            upgraded.append(plan("2"))  # between A's commit and B's: the old driver is now a zombie

    p1 = plan("1")
    first = _Both(a.bind(p1.checkpoint_location), b.bind(p1.checkpoint_location), upgrade_at_batch_2)
    assert not _run(spark, kafka, topic, p1, first)
    assert [type(e) for e in first.raised] == [SinkFenced]
    assert first.verdicts[-1] == (2, "a", "commit")
    assert len(_once(pg_dsn, "out_a")) == 30 and len(_once(pg_dsn, "out_b")) == 20

    p2, = upgraded
    assert p2.fresh_checkpoint
    # B stopped at 10/10: the plan starts there, and A skips what it holds (10-15 of each partition).
    assert sum(p2.starting_offsets[topic].values()) == 20, p2.starting_offsets
    behind = [f for f in p2.findings if f.kind == "sink_behind"]
    assert behind and "orders:out_b" in behind[0].message and "orders:out_a" in behind[0].message
    print("SINK_BEHIND", behind[0].message)  # docs/sinks.md
    second = _Both(a.bind(p2.checkpoint_location), b.bind(p2.checkpoint_location))
    # Batches of 20 (10 a partition): A holds the first half of batch 0 and drops those rows only.
    assert _run(spark, kafka, topic, p2, second, per_trigger=20), second.raised
    rows = {(r[0], r[3]) for r in _outputs(pg_dsn) if r[2] == 2}
    assert ("orders:out_a", 10) in rows and ("orders:out_b", 20) in rows, rows
    assert _once(pg_dsn, "out_a") == Counter(produced)
    assert _once(pg_dsn, "out_b") == Counter(produced)

    # The second and third restarts after it: nothing skipped again, nothing leaked.
    more = _values("g", 20)
    kafka.produce(topic, more)
    for version in ("3", "4"):
        p = plan(version)
        assert p.fresh_checkpoint and not [f for f in p.findings if f.kind in ("sink_behind", "sink_ahead")]
        assert _run(spark, kafka, topic, p, _Both(a.bind(p.checkpoint_location), b.bind(p.checkpoint_location)))
    assert _once(pg_dsn, "out_a") == Counter(produced + more)
    assert _once(pg_dsn, "out_b") == Counter(produced + more)
    # verify: generation 2 read 10-15 of each partition again on purpose (the sink_behind finding).
    done = _cli("verify", "orders", "--dsn", pg_dsn, "-f", "json")
    print("VERIFY", done.stdout[:2000], done.stderr[-2000:])
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["summary"]["unexplained"] == 0


def test_a_zombies_late_commit_at_one_sink_does_not_starve_the_other(
        spark, kafka, pg_dsn: str, target_dsn: str, tmp_path: Path) -> None:
    """Case 4 as filed: A (a remote target) takes generation 1's batch 2 after generation 2 opened, B (in
    the ledger's database) fences it. On main the restart planned past A's late commit (``sink_ahead``) for
    both sinks, and B never received offsets 10-15 of each partition."""
    topic = kafka.create_topic(partitions=2)
    produced = _values("z", 40)
    kafka.produce(topic, produced)
    create_target(target_dsn, "out_a")
    create_target(pg_dsn, "out_b")
    root = str(tmp_path / "ck")
    a = PostgresSink(table="out_a", pipeline="orders", dsn=pg_dsn, target_dsn=target_dsn)
    b = PostgresSink(table="out_b", pipeline="orders", dsn=pg_dsn)

    def plan(version: str):  # type: ignore[no-untyped-def]
        return start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers, checkpoint_root=root,
                                 app_version=version, dsn=pg_dsn, first_run="earliest", sinks=[a, b])

    upgraded: list[Any] = []
    zombie = _Zombie(lambda: upgraded.append(plan("2")), 2, False, table="out_a", pipeline="orders", dsn=pg_dsn,
                     target_dsn=target_dsn)
    p1 = plan("1")
    first = _Both(zombie.bind(p1.checkpoint_location), b.bind(p1.checkpoint_location))
    assert not _run(spark, kafka, topic, p1, first)
    assert [type(e) for e in first.raised] == [SinkFenced]  # B fences the zombie's batch 2
    assert len(_once(target_dsn, "out_a")) == 30 and len(_once(pg_dsn, "out_b")) == 20
    p2, = upgraded
    assert sum(p2.starting_offsets[topic].values()) == 20

    # Generation 2's batch 0 would write A's late records again: A refuses it (its own late commit).
    second = _Both(a.bind(p2.checkpoint_location), b.bind(p2.checkpoint_location))
    assert not _run(spark, kafka, topic, p2, second)
    assert second.raised and isinstance(second.raised[0], SinkFenced)

    # The restart: A holds 10-15 of each partition, B does not. The plan starts where B stopped.
    p3 = plan("3")
    assert p3.fresh_checkpoint
    assert sum(p3.starting_offsets[topic].values()) == 20, p3.starting_offsets
    third = _Both(a.bind(p3.checkpoint_location), b.bind(p3.checkpoint_location))
    assert _run(spark, kafka, topic, p3, third), third.raised
    assert _once(target_dsn, "out_a") == Counter(produced)
    assert _once(pg_dsn, "out_b") == Counter(produced)
    p4 = plan("4")
    assert not [f for f in p4.findings if f.kind in ("sink_behind", "sink_ahead")]
    assert sum(p4.starting_offsets[topic].values()) == 40
