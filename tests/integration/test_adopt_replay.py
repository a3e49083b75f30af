"""Adopting running pipelines from their checkpoints, and replaying batches, on the real stack.

Pipelines first run *without* the listener, as jobs do before they adopt offset-ledger; what each
micro-batch processed is tagged with foreachBatch's batch id, so every assertion compares the exact
multiset of values Spark read.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path

import httpx
from sqlalchemy import create_engine, inspect, text

from offset_ledger import OffsetLedgerListener, replay_range, start_from_ledger
from offset_ledger.ledger.tables import checkpoint_generations, findings, positions
from offset_ledger.operate.adopt import import_checkpoint
from tests.integration.test_api import serving
from tests.integration.test_restart import _rows, _values


def _run_tagged(spark, bootstrap: str, topic: str, checkpoint: str, *,  # type: ignore[no-untyped-def]
                starting_offsets: str = "earliest", max_per_trigger: int | None = None,
                listener: OffsetLedgerListener | None = None) -> dict[int, Counter]:
    """Run a Kafka query to the end of what is available; the values each batch id processed."""
    seen: dict[int, Counter] = {}

    def sink(df, batch_id):  # type: ignore[no-untyped-def]
        seen[batch_id] = Counter(r.value for r in df.selectExpr("CAST(value AS STRING) AS value").collect())

    reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", starting_offsets))
    if max_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_per_trigger))
    if listener is not None:
        spark.streams.addListener(listener)
    try:
        query = (reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        try:
            assert query.awaitTermination(180), "the query did not finish"
            assert query.exception() is None, query.exception()
        finally:
            query.stop()
        if listener is not None:
            assert listener.flush(60), listener.health()
    finally:
        if listener is not None:
            spark.streams.removeListener(listener)
            listener.close()
    return seen


def _total(batches: dict[int, Counter]) -> Counter:
    out: Counter = Counter()
    for c in batches.values():
        out += c
    return out


def _listener(pg_dsn: str, tmp_path: Path, version: str | None = None) -> OffsetLedgerListener:
    return OffsetLedgerListener(dsn=pg_dsn, pipeline="orders", app_version=version, spool_dir=tmp_path / "spool")


def _has_schema(dsn: str) -> bool:
    engine = create_engine(dsn)
    try:
        return inspect(engine).has_table("positions")
    finally:
        engine.dispose()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "offset-ledger"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)


def test_import_checkpoint_then_upgrade_reads_every_record_once(spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=3)
    kafka.produce(topic, _values("a", 60))
    job = tmp_path / "jobs" / "orders"
    first = _run_tagged(spark, kafka.bootstrap_servers, topic, str(job), max_per_trigger=10)
    assert len(first) >= 5 and _total(first) == Counter(_values("a", 60))

    kafka.produce(topic, _values("b", 30))
    dry = _cli("import-checkpoint", "orders", str(job), "--dsn", pg_dsn)
    assert dry.returncode == 0, dry.stderr
    assert f"last committed batch {max(first)}" in dry.stdout and not _has_schema(pg_dsn)  # wrote nothing
    done = _cli("import-checkpoint", "orders", str(job), "--app-version", "1", "--dsn", pg_dsn,
                "--execute", "--format", "json", "--bootstrap-servers", kafka.bootstrap_servers)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["positions"] == {topic: {"0": 20, "1": 20, "2": 20}}
    (adopted,) = _rows(pg_dsn, checkpoint_generations)
    assert adopted.location == str(job) and set(adopted.topic_ids) == {topic}

    plan = start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers,
                             checkpoint_root=str(tmp_path / "gens"), dsn=pg_dsn, app_version="2")
    assert plan.fresh_checkpoint and plan.starting_offsets == {topic: {"0": 20, "1": 20, "2": 20}}
    second = _run_tagged(spark, kafka.bootstrap_servers, topic, plan.checkpoint_location,
                         starting_offsets=plan.starting_offsets_json, listener=_listener(pg_dsn, tmp_path, "2"))
    assert _total(second) == Counter(_values("b", 30))  # 0 of 60 read again, 0 skipped
    assert {r.next_offset for r in _rows(pg_dsn, positions)} == {30}


def test_import_skips_a_planned_but_uncommitted_batch(spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("a", 50))
    job = tmp_path / "jobs" / "orders"
    first = _run_tagged(spark, kafka.bootstrap_servers, topic, str(job), max_per_trigger=10)
    last = max(first)
    assert last >= 4
    # As if the job died after planning its last batch and before committing it.
    (job / "commits" / str(last)).unlink()
    result = import_checkpoint(str(job), pipeline="orders", dsn=pg_dsn, execute=True)
    assert result.committed_batch_id == last - 1 and result.planned_batch_ids == (last,)

    kafka.produce(topic, _values("b", 20))
    plan = start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers,
                             checkpoint_root=str(tmp_path / "gens"), dsn=pg_dsn, app_version="2")
    second = _run_tagged(spark, kafka.bootstrap_servers, topic, plan.checkpoint_location,
                         starting_offsets=plan.starting_offsets_json)
    committed = _total({b: c for b, c in first.items() if b != last})
    # The uncommitted batch's records come again (it never committed), everything else exactly once.
    assert _total(second) == first[last] + Counter(_values("b", 20))
    assert committed + _total(second) == Counter(_values("a", 50) + _values("b", 20))


def test_adopt_checkpoint_continues_the_running_job_and_replays_its_batches(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=3)
    kafka.produce(topic, _values("a", 30))
    job = tmp_path / "jobs" / "orders"
    first = _run_tagged(spark, kafka.bootstrap_servers, topic, str(job), max_per_trigger=10)
    assert _total(first) == Counter(_values("a", 30))

    kafka.produce(topic, _values("b", 60))
    # The one-line change: the ledger has nothing for "orders", so the checkpoint is adopted and resumed.
    plan = start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers,
                             checkpoint_root=str(tmp_path / "gens"), dsn=pg_dsn, app_version="1",
                             adopt_checkpoint=str(job))
    assert not plan.fresh_checkpoint and plan.checkpoint_location == str(job)
    second = _run_tagged(spark, kafka.bootstrap_servers, topic, plan.checkpoint_location,
                         starting_offsets=plan.starting_offsets_json, max_per_trigger=15,
                         listener=_listener(pg_dsn, tmp_path, "1"))
    assert _total(second) == Counter(_values("b", 60))
    assert min(second) == max(first) + 1 and len(second) >= 4  # Spark continued its own checkpoint
    # Its runs are the adopted generation's: they moved the positions, no foreign_run.
    assert {r.next_offset for r in _rows(pg_dsn, positions)} == {30}
    (gen,) = _rows(pg_dsn, checkpoint_generations)
    assert gen.reason == "adopted" and gen.location == str(job)
    assert {f.kind for f in _rows(pg_dsn, findings)} == {"checkpoint_adopted"}
    # The same call again is a plain resume (the ledger knows the pipeline now).
    again = start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers,
                              checkpoint_root=str(tmp_path / "gens"), dsn=pg_dsn, app_version="1",
                              adopt_checkpoint=str(job))
    assert again.checkpoint_location == str(job) and len(_rows(pg_dsn, checkpoint_generations)) == 1

    def read(r) -> Counter:  # type: ignore[no-untyped-def]
        df = (spark.read.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
              .options(**r.options()).load())
        return Counter(x.value for x in df.selectExpr("CAST(value AS STRING) AS value").collect())

    # One batch: exactly the records that batch processed.
    batch = sorted(second)[1]
    one = replay_range("orders", batch=batch, dsn=pg_dsn, bootstrap_servers=kafka.bootstrap_servers)
    assert one.retention_checked and one.warnings == () and one.batches[0][1] == batch
    assert read(one) == second[batch]

    # A time range: exactly the records of the batches whose batch time lies in it.
    engine = create_engine(pg_dsn)
    try:
        with engine.connect() as conn:
            times = dict(conn.execute(text("SELECT batch_id, batch_time FROM batches ORDER BY batch_id")).all())
    finally:
        engine.dispose()
    ids = sorted(second)[1:3]
    window = replay_range("orders", since=times[ids[0]], until=times[ids[-1]] + timedelta(milliseconds=1),
                          dsn=pg_dsn, bootstrap_servers=kafka.bootstrap_servers)
    assert [b for _q, b in window.batches] == ids
    assert read(window) == second[ids[0]] + second[ids[1]]

    # The CLI and the API print the same range.
    cli = _cli("replay", "orders", "--batch", str(batch), "--dsn", pg_dsn,
               "--bootstrap-servers", kafka.bootstrap_servers)
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout) == {"startingOffsets": one.starting_offsets,
                                      "endingOffsets": one.ending_offsets, "assign": one.assign}
    with serving(pg_dsn, kafka.bootstrap_servers) as server:
        ok = httpx.get(f"{server.url}/api/v1/pipelines/orders/batches/{batch}/range")
        assert ok.status_code == 200 and ok.json()["startingOffsets"] == one.starting_offsets
        missing = httpx.get(f"{server.url}/api/v1/pipelines/orders/batches/999/range")
        assert missing.status_code == 404 and missing.json()["error"] == "UnknownBatch"
        nobody = httpx.get(f"{server.url}/api/v1/pipelines/nobody/batches/0/range")
        assert nobody.status_code == 404 and nobody.json()["error"] == "UnknownPipeline"
        bad = httpx.get(f"{server.url}/api/v1/pipelines/orders/batches/x/range")
        assert bad.status_code == 422
    unknown = _cli("replay", "orders", "--batch", "999", "--dsn", pg_dsn)
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1

    # Records retention deleted since are reported, not silently skipped.
    start = one.starting_offsets[topic]
    partition, from_offset = next(iter(start.items()))
    kafka.delete_records(topic, {int(partition): from_offset + 1})
    lost = replay_range("orders", batch=batch, dsn=pg_dsn, bootstrap_servers=kafka.bootstrap_servers)
    assert [(x["partition"], x["recordsLost"]) for x in lost.lost] == [(int(partition), 1)]
    assert any("deleted by retention" in w for w in lost.warnings)
