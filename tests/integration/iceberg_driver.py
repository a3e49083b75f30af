"""A Spark driver writing a Kafka topic to an Iceberg table (Hadoop catalog) through the sink; the test SIGKILLs it.

``python tests/integration/iceberg_driver.py CONFIG_JSON`` in an interpreter whose PySpark has an
Iceberg runtime (PySpark 4.1: the test picks it). ``runs`` are run one after the other in one
Spark session, each planned by ``start_from_ledger`` (``app_version``: a new one is an upgrade on a
clean checkpoint) and run ``availableNow`` with ``maxOffsetsPerTrigger`` 10:

- ``"kind": "sink"``: through ``IcebergSink``; ``kill_at`` ``[point, n]`` SIGKILLs the whole
  process group in the n-th batch this run writes: ``write`` (the sequence decided, before the
  append), ``commit`` (after Iceberg's commit, before the ledger's) or ``after`` (after the
  ledger's, before Spark's ``commits/<batch>``).
- ``"kind": "plain"``: what people write for ``foreachBatch`` without the ledger: the batch id in
  the snapshot summary, a batch whose id the table already has is skipped.

``produce``: values to send before a run (``{"before": i, "values": [...]}``). Prints ``PLAN``,
``BATCH`` and ``KILL`` lines and at the end ``RESULT {...}`` with what each table holds.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from offset_ledger import devstack, start_from_ledger
from offset_ledger.sinks import IcebergSink

CATALOG = "lake"


def _die(what: str) -> None:
    print(f"KILL {what}", flush=True)
    os.killpg(os.getpgid(0), signal.SIGKILL)


class KilledSink(IcebergSink):
    """The sink, dying at a chosen point of a chosen batch (the test's crash injection)."""

    kill_at: list[Any] | None = None
    writes = 0

    def write(self, df: Any, batch_id: int) -> Any:
        self.writes += 1
        done = super().write(df, batch_id)
        print(f"BATCH {batch_id} {done.verdict} {done.sequence}", flush=True)
        if self._kill("after"):
            _die(f"after {batch_id}")
        return done

    def _kill(self, point: str) -> bool:
        return bool(self.kill_at) and self.kill_at[0] == point and self.writes >= self.kill_at[1]  # type: ignore[index]

    def _ensure_catalog(self, spark: Any) -> None:
        if self._kill("write"):
            _die("write")
        super()._ensure_catalog(spark)

    def _record(self, *args: Any, **kwargs: Any) -> None:
        if self._kill("commit"):
            _die("commit")
        super()._record(*args, **kwargs)


def main(cfg: dict[str, Any]) -> None:
    from kafka import KafkaProducer
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    jars = ",".join(str(p) for p in [*devstack.spark_kafka_jars(), *devstack.iceberg_spark_jars()])
    warehouse = cfg["warehouse"]
    spark = (SparkSession.builder.master("local[2]").appName("iceberg-sink").config("spark.jars", jars)
             .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
             .config(f"spark.sql.catalog.{CATALOG}", "org.apache.iceberg.spark.SparkCatalog")
             .config(f"spark.sql.catalog.{CATALOG}.type", "hadoop")
             .config(f"spark.sql.catalog.{CATALOG}.warehouse", warehouse)
             # foreachBatch's writes go through the batch's own session; without this the outer
             # session's cached table (and its .snapshots) would stay at the state it first loaded.
             .config(f"spark.sql.catalog.{CATALOG}.cache-enabled", "false")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "1g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    topic, bootstrap, dsn = cfg["topic"], cfg["bootstrap"], cfg["dsn"]
    for table in ("db.sink", "db.plain"):
        spark.sql(f"CREATE TABLE IF NOT EXISTS {CATALOG}.{table} (value string, `partition` int, `offset` bigint) "
                  "USING iceberg")
    findings: dict[str, list[str]] = {}

    def plain(df: Any, batch_id: int) -> None:  # the batch id as the idempotence key, as people write it
        seen = {r.summary.get("plain.batch-id") for r in spark.sql(
            f"SELECT summary FROM {CATALOG}.db.plain.snapshots").collect()}
        if str(batch_id) in seen:
            print(f"PLAIN {batch_id} skip", flush=True)
            return
        df.writeTo(f"{CATALOG}.db.plain").option("snapshot-property.plain.batch-id", str(batch_id)).append()

    for i, run in enumerate(cfg["runs"]):
        if run.get("produce"):
            producer = KafkaProducer(bootstrap_servers=bootstrap)
            for n, value in enumerate(run["produce"]):
                producer.send(topic, value=value.encode(), partition=n % 2)
            producer.flush()
            producer.close()
        pipeline = f"ice_{run['kind']}"
        sink = KilledSink(table=f"db.{run['kind']}", warehouse=warehouse, catalog=CATALOG, pipeline=pipeline, dsn=dsn)
        sink.kill_at = run.get("kill_at")
        plan = start_from_ledger(pipeline, [topic], bootstrap_servers=bootstrap,
                                 checkpoint_root=f"{cfg['root']}/{pipeline}", app_version=run["app_version"], dsn=dsn,
                                 first_run="earliest", sinks=[sink] if run["kind"] == "sink" else [])
        findings[f"{i}:{pipeline}:{run['app_version']}"] = [f.kind for f in plan.findings]
        print(f"FINDINGS {json.dumps([f.kind for f in plan.findings])}", flush=True)
        print(f"PLAN {pipeline} {plan.checkpoint_location} fresh={plan.fresh_checkpoint} "
              f"{plan.starting_offsets_json}", flush=True)
        df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
              .option("startingOffsets", plan.starting_offsets_json).option("maxOffsetsPerTrigger", "10").load()
              .selectExpr("CAST(value AS STRING) AS value", "partition", "offset"))
        fn = sink.bind(plan.checkpoint_location) if run["kind"] == "sink" else plain
        query = (df.writeStream.foreachBatch(fn).option("checkpointLocation", plan.checkpoint_location)
                 .trigger(availableNow=True).start())
        query.awaitTermination()

    def values(table: str) -> dict[str, int]:
        return dict(Counter(r.value for r in spark.read.table(f"{CATALOG}.{table}").select("value").collect()))

    snapshots = [(r.snapshot_id, dict(r.summary)) for r in spark.sql(
        f"SELECT snapshot_id, summary FROM {CATALOG}.db.sink.snapshots ORDER BY committed_at").collect()]
    print("RESULT " + json.dumps({"sink": values("db.sink"), "plain": values("db.plain"), "findings": findings,
                                  "snapshots": snapshots}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
