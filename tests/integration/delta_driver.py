"""Delta Lake through the sink vs a plain ``txnVersion=batchId`` writer, across a clean-checkpoint upgrade.

``python tests/integration/delta_driver.py CONFIG_JSON`` in an interpreter whose PySpark delta-spark
supports (the test picks it); prints one JSON line ``RESULT {...}`` with what each table holds.

1. generation 1: the sink pipeline dies after Delta committed its 3rd batch and before the ledger
   heard of it; the plain pipeline runs to the end of the topic (txnVersion 0, 1, 2, 3).
2. more records; generation 2 of both (an upgrade: clean checkpoints, batch ids from 0 again). The
   plain writer's batches 0-3 carry txn versions Delta already has: skipped, their rows lost. The
   sink's restart reconciles from the Delta log first and writes with the next sequences.

With ``"scenario": "collision"`` (case 3 of issue 33), instead: generation 1 dies after Delta
committed its 3rd batch (sequence 3) and before the ledger heard of it; more records; an upgrade
restarts *without* ``sinks=[sink]`` and with bigger batches, so its batch 0 gets sequence 3 again
while reading other records. Delta skips that write as a duplicate; the sink must refuse, not
record the older version as this batch's commit. A restart with ``sinks=[sink]`` then records the
colliding version from the Delta log, plans from where that version's batch ended, and runs.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from offset_ledger import devstack, start_from_ledger
from offset_ledger.sinks import DeltaSink


class LostBeforeTheLedger(DeltaSink):
    def __init__(self, crash_at: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.crash_at, self.calls = crash_at, 0

    def _record(self, *args: Any, **kwargs: Any) -> None:
        self.calls += 1
        if self.calls == self.crash_at:
            raise RuntimeError("driver lost between Delta's commit and the ledger's")
        super()._record(*args, **kwargs)


def main(cfg: dict[str, Any]) -> None:
    from kafka import KafkaProducer
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    jars = ",".join([*(str(p) for p in devstack.spark_kafka_jars()), *cfg["delta_jars"]])
    spark = (SparkSession.builder.master("local[2]").appName("delta-sink").config("spark.jars", jars)
             .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
             .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    topic, bootstrap, dsn, root = cfg["topic"], cfg["bootstrap"], cfg["dsn"], cfg["root"]
    findings: dict[str, list[str]] = {}

    if cfg.get("scenario") == "collision":
        collision(spark, cfg)
        return

    def run(pipeline: str, version: str, write: Any, sinks: list[Any]) -> bool:
        plan = start_from_ledger(pipeline, [topic], bootstrap_servers=bootstrap, checkpoint_root=f"{root}/{pipeline}",
                                 app_version=version, dsn=dsn, first_run="earliest", sinks=sinks)
        findings.setdefault(f"{pipeline}:{version}", []).extend(f.kind for f in plan.findings)
        fn = write.bind(plan.checkpoint_location) if hasattr(write, "bind") else write
        df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
              .option("startingOffsets", plan.starting_offsets_json).option("maxOffsetsPerTrigger", "10").load()
              .selectExpr("CAST(value AS STRING) AS value", "partition", "offset"))
        query = (df.writeStream.foreachBatch(fn).option("checkpointLocation", plan.checkpoint_location)
                 .trigger(availableNow=True).start())
        try:
            query.awaitTermination()
        except StreamingQueryException:
            return False
        return True

    sink_path, plain_path = f"{root}/tables/sink", f"{root}/tables/plain"

    def plain(df: Any, batch_id: int) -> None:  # what people write: Spark's batch id as the txn version
        (df.write.format("delta").mode("append").option("txnAppId", "plain").option("txnVersion", batch_id)
         .save(plain_path))

    crashing = LostBeforeTheLedger(3, path=sink_path, pipeline="delta_sink", dsn=dsn)
    ok = {"sink_1": run("delta_sink", "1", crashing, [crashing]), "plain_1": run("delta_plain", "1", plain, [])}
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for i in range(cfg["more"]):
        producer.send(topic, value=f"b{i}".encode(), partition=i % 2)
    producer.flush()
    producer.close()
    sink = DeltaSink(path=sink_path, pipeline="delta_sink", dsn=dsn)
    ok["sink_2"] = run("delta_sink", "2", sink, [sink])
    ok["plain_2"] = run("delta_plain", "2", plain, [])

    def values(path: str) -> dict[str, int]:
        return dict(Counter(r.value for r in spark.read.format("delta").load(path).select("value").collect()))

    print("RESULT " + json.dumps({"ok": ok, "sink": values(sink_path), "plain": values(plain_path),
                                  "findings": findings}), flush=True)
    spark.stop()


class Seen(DeltaSink):
    """The sink, keeping what each batch raised (classic Spark runs foreachBatch in the driver)."""

    raised: list[str] = []

    def write(self, df: Any, batch_id: int) -> Any:
        try:
            return super().write(df, batch_id)
        except Exception as exc:
            Seen.raised.append(f"{type(exc).__name__}: {exc}")
            raise


class SeenLost(LostBeforeTheLedger, Seen):
    pass


def collision(spark: Any, cfg: dict[str, Any]) -> None:
    from kafka import KafkaProducer
    from pyspark.errors import StreamingQueryException

    topic, bootstrap, dsn, root = cfg["topic"], cfg["bootstrap"], cfg["dsn"], cfg["root"]
    path = f"{root}/tables/sink"
    findings: dict[str, list[str]] = {}
    raised: dict[str, list[str]] = {}

    plans: dict[str, Any] = {}

    def run(version: str, sink: DeltaSink, sinks: list[Any], per_trigger: int) -> bool:
        plan = start_from_ledger("delta_col", [topic], bootstrap_servers=bootstrap, checkpoint_root=f"{root}/ck",
                                 app_version=version, dsn=dsn, first_run="earliest", sinks=sinks)
        findings[version] = [f.kind for f in plan.findings]
        plans[version] = {"offsets": plan.starting_offsets.get(topic), "fresh": plan.fresh_checkpoint,
                          "messages": {f.kind: f.message for f in plan.findings}}
        Seen.raised = []
        df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
              .option("startingOffsets", plan.starting_offsets_json)
              .option("maxOffsetsPerTrigger", str(per_trigger)).load()
              .selectExpr("CAST(value AS STRING) AS value", "partition", "offset"))
        query = (df.writeStream.foreachBatch(sink.bind(plan.checkpoint_location))
                 .option("checkpointLocation", plan.checkpoint_location).trigger(availableNow=True).start())
        try:
            query.awaitTermination()
            ok = True
        except StreamingQueryException:
            ok = False
        raised[version] = list(Seen.raised)
        return ok

    ok = {"1": run("1", SeenLost(3, path=path, pipeline="delta_col", dsn=dsn), [], 10)}
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for i in range(cfg["more"]):
        producer.send(topic, value=f"b{i}".encode(), partition=i % 2)
    producer.flush()
    producer.close()
    sink = Seen(path=path, pipeline="delta_col", dsn=dsn)
    ok["2"] = run("2", sink, [], 15)  # the upgrade forgot sinks=[sink]: the ledger lags the Delta log
    def table() -> dict[str, int]:
        return dict(Counter(r.value for r in spark.read.format("delta").load(path).select("value").collect()))

    values = table()
    # The restart the refusal asks for: it records the colliding version from the Delta log, plans
    # from where that version's batch ended, and runs.
    ok["3"] = run("3", Seen(path=path, pipeline="delta_col", dsn=dsn), [sink], 15)
    print("RESULT " + json.dumps({"ok": ok, "sink": values, "findings": findings, "raised": raised,
                                  "plan_3": plans["3"]["offsets"], "plans": plans, "after": table()}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
