"""Locations, replays and first runs are exact, on the real stack (issue 20, cases 7, 8 and 9).

Each test compares what Spark read (values tagged per micro-batch) with what the ledger says:
the generation a run belongs to, the records a replay reads, where a first run starts.
"""

from __future__ import annotations

import shutil
from collections import Counter
from datetime import timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from offset_ledger import replay_range, start_from_ledger
from offset_ledger.errors import ReplayNotExact
from offset_ledger.ledger.tables import checkpoint_generations, findings, runs
from tests.integration.test_adopt_replay import _cli, _listener, _run_tagged, _total
from tests.integration.test_authority import _positions, _recorded_run
from tests.integration.test_restart import _rows, _values


def _read(spark, bootstrap: str, r) -> Counter:  # type: ignore[no-untyped-def]
    df = spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).options(**r.options()).load()
    return Counter(x.value for x in df.selectExpr("CAST(value AS STRING) AS value").collect())


def _batch_times(dsn: str, query_id: str) -> dict[int, object]:
    engine = create_engine(dsn)
    try:
        with engine.connect() as conn:
            return dict(conn.execute(text("SELECT batch_id, batch_time FROM batches WHERE query_id = :q "
                                          "ORDER BY batch_id"), {"q": query_id}).all())
    finally:
        engine.dispose()


def test_a_respelled_root_reuses_the_generation_and_a_copy_of_it_is_foreign(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("a", 40))
    root = tmp_path / "check points" / "orders"  # Spark 3+ reports it unescaped (2.4 printed %20)
    plan1 = start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers,
                              checkpoint_root=f"{root}/", dsn=pg_dsn, app_version="1")
    seen1, _ = _recorded_run(spark, kafka, pg_dsn, topic, plan1, tmp_path)
    assert seen1 == Counter(_values("a", 40)) and _positions(pg_dsn) == {0: 20, 1: 20}
    (gen,) = _rows(pg_dsn, checkpoint_generations)
    (run,) = _rows(pg_dsn, runs)
    # The oracle: the location as Spark reported it differs from the one handed out, yet it is the generation.
    assert run.checkpoint_location != gen.location
    assert run.generation_id == gen.id

    kafka.produce(topic, _values("b", 10))
    # The same root spelled another way: the same generation (a stateful job keeps its state).
    plan2 = start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers,
                              checkpoint_root=f"file://{root}", dsn=pg_dsn, app_version="1")
    assert not plan2.fresh_checkpoint and plan2.checkpoint_location == plan1.checkpoint_location
    assert len(_rows(pg_dsn, checkpoint_generations)) == 1

    # A copy of the generation elsewhere, under the very same gen-<n>-<id> name.
    copy = tmp_path / "copy" / Path(plan1.checkpoint_location).name
    shutil.copytree(plan1.checkpoint_location, copy)
    # The generation itself moves positions.
    seen2, _ = _recorded_run(spark, kafka, pg_dsn, topic, plan2, tmp_path)
    assert seen2 == Counter(_values("b", 10)) and _positions(pg_dsn) == {0: 25, 1: 25}

    # A job started on the copy is a foreign run: history, never a position. (Its batch 1 has the
    # generation's query id and batch id, so the ledger takes it for the batch it already has; its
    # batch 2 is new.) Before issue 20 the copy matched by its directory name and moved positions to 30.
    kafka.produce(topic, _values("c", 10))
    seen_copy, _ = _recorded_run(spark, kafka, pg_dsn, topic, plan2, tmp_path, checkpoint=str(copy),
                                 max_per_trigger=10)
    assert seen_copy == Counter(_values("b", 10) + _values("c", 10))  # Spark resumed the copy
    assert _positions(pg_dsn) == {0: 25, 1: 25}
    foreign = [f for f in _rows(pg_dsn, findings) if f.kind == "foreign_run"]
    assert len(foreign) == 1 and "copy" in foreign[0].message


def test_replay_of_batch_0_is_exact_a_partition_without_a_known_start_is_refused_and_later_batches_replay_exactly(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("a", 40))
    job = str(tmp_path / "job")  # a job on its own checkpoint, with the listener, never the restart helper
    first = _run_tagged(spark, kafka.bootstrap_servers, topic, job, max_per_trigger=10,
                        listener=_listener(pg_dsn, tmp_path))
    assert _total(first) == Counter(_values("a", 40)) and len(first) >= 3
    dsn_args = ("--dsn", pg_dsn, "--bootstrap-servers", kafka.bootstrap_servers)

    # Batch 0 of a fresh checkpoint: Spark reports no start and no generation resolved one, but the
    # listener took the start Spark wrote in the checkpoint (sources/0/0): its replay is exact.
    zero = replay_range("orders", batch=0, dsn=pg_dsn, bootstrap_servers=kafka.bootstrap_servers)
    assert _read(spark, kafka.bootstrap_servers, zero) == first[0]
    one = replay_range("orders", batch=1, dsn=pg_dsn, bootstrap_servers=kafka.bootstrap_servers)
    assert _read(spark, kafka.bootstrap_servers, one) == first[1]

    # A partition added, then the job resumes its checkpoint: Spark discovers it without a start.
    kafka.add_partitions(topic, 3)
    kafka.produce(topic, _values("b", 300))
    second = _run_tagged(spark, kafka.bootstrap_servers, topic, job, max_per_trigger=60,
                         listener=_listener(pg_dsn, tmp_path))
    assert _total(second) == Counter(_values("b", 300))
    ids = sorted(second)
    assert ids[0] == max(first) + 1 and len(ids) >= 3
    query = next(r.query_id for r in _rows(pg_dsn, runs))
    times = _batch_times(pg_dsn, query)
    # The range through the discovery: before issue 20 partition 2 was silently left out.
    with pytest.raises(ReplayNotExact) as inexact:
        replay_range("orders", since=times[ids[0]], until=times[ids[-1]] + timedelta(milliseconds=1),
                     dsn=pg_dsn, bootstrap_servers=kafka.bootstrap_servers)
    assert f"{topic}-2 in batch {ids[0]}" in inexact.value.message
    cli = _cli("replay", "orders", "--from", times[ids[0]].isoformat(), "--to",
               (times[ids[-1]] + timedelta(milliseconds=1)).isoformat(), *dsn_args)
    assert cli.returncode == 2 and f"{topic}-2" in cli.stderr
    # Later batches know every start: their replay reads exactly what they read, partition 2 included.
    later = replay_range("orders", since=times[ids[1]], until=times[ids[-1]] + timedelta(milliseconds=1),
                         dsn=pg_dsn, bootstrap_servers=kafka.bootstrap_servers)
    assert "2" in later.starting_offsets[topic]
    expected: Counter = Counter()
    for b in ids[1:]:
        expected += second[b]
    assert _read(spark, kafka.bootstrap_servers, later) == expected
    # An aware bound in another zone selects the same batches.
    zone = times[ids[1]].astimezone(timezone(timedelta(hours=5, minutes=30)))
    zoned = replay_range("orders", since=zone, until=times[ids[-1]] + timedelta(milliseconds=1), dsn=pg_dsn)
    assert zoned.batches == later.batches


def test_a_first_run_from_latest_starts_where_the_ledger_says(spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("old", 20))
    plan = start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers,
                             checkpoint_root=str(tmp_path / "gens"), dsn=pg_dsn, first_run="latest")
    assert plan.starting_offsets == {topic: {"0": 10, "1": 10}}
    between = _values("between", 6)  # produced after planning, before Spark starts
    kafka.produce(topic, between)
    batches = _run_tagged(spark, kafka.bootstrap_servers, topic, plan.checkpoint_location,
                          starting_offsets=plan.starting_offsets_json, listener=_listener(pg_dsn, tmp_path))
    assert _total(batches) == Counter(between)  # with -1 Spark skipped them, while the ledger counted them read
    assert _positions(pg_dsn) == {0: 13, 1: 13}
    # The ledger's account of batch 0 is what batch 0 read.
    r = replay_range("orders", batch=0, dsn=pg_dsn, bootstrap_servers=kafka.bootstrap_servers)
    assert r.starting_offsets == {topic: {"0": 10, "1": 10}}
    assert _read(spark, kafka.bootstrap_servers, r) == batches[0]
