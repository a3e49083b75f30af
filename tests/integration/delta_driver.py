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
import threading
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
    if cfg.get("scenario") == "zombie":
        zombie(spark, cfg)
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


class Paused:
    """A batch's DataFrame whose ``write`` waits for the go-ahead: the sink decided, Delta not yet written."""

    def __init__(self, df: Any, paused: threading.Event, go: threading.Event) -> None:
        self.df, self.paused, self.go = df, paused, go

    @property
    def write(self) -> Any:
        self.paused.set()
        if not self.go.wait(300):
            raise RuntimeError("no go-ahead for the zombie's write")
        return self.df.write

    def __getattr__(self, name: str) -> Any:
        # Anything else the sink reads of its batch (its columns, for the records it holds) is the batch's.
        return getattr(self.df, name)


class Zombie(Seen):
    """Generation 1's driver, still running: its first batch passes its fence, then waits before writing."""

    paused = threading.Event()
    go = threading.Event()
    armed = True

    def write(self, df: Any, batch_id: int) -> Any:
        if Zombie.armed:
            Zombie.armed = False
            df = Paused(df, Zombie.paused, Zombie.go)
        return super().write(df, batch_id)


def zombie(spark: Any, cfg: dict[str, Any]) -> None:
    """A zombie on generation 1 commits into the table after the upgrade opened generation 2.

    Generation 1 reads the topic (40 records, 4 batches); 40 more arrive; its driver is not stopped
    and starts batch 4: it passes its fence (generation 1 is still current) and pauses before Delta's
    write. The upgrade's restart opens generation 2 at 20/20; then the zombie writes batch 4 (offsets
    20-25 of each partition) and records it (a foreign run: no position moves); its batch 5 is
    fenced. Generation 2's batch 0 would write 20-25 again: refused (the late commit). The restart
    with ``sinks=[sink]`` plans from 25/25 (sink_ahead) and its run writes the rest.
    """
    from kafka import KafkaProducer
    from pyspark.errors import StreamingQueryException

    topic, bootstrap, dsn, root = cfg["topic"], cfg["bootstrap"], cfg["dsn"], cfg["root"]
    path = f"{root}/tables/sink"
    ok: dict[str, bool] = {}
    raised: dict[str, list[str]] = {}
    plans: dict[str, Any] = {}

    def plan_for(version: str) -> Any:
        sink = DeltaSink(path=path, pipeline="delta_zom", dsn=dsn)
        plan = start_from_ledger("delta_zom", [topic], bootstrap_servers=bootstrap, checkpoint_root=f"{root}/ck",
                                 app_version=version, dsn=dsn, first_run="earliest", sinks=[sink])
        plans[version] = {"offsets": plan.starting_offsets.get(topic), "fresh": plan.fresh_checkpoint,
                          "findings": {f.kind: f.message for f in plan.findings}}
        return plan

    def start(name: str, location: str, sink: DeltaSink, starting: str) -> Any:
        Seen.raised = []
        df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
              .option("startingOffsets", starting).option("maxOffsetsPerTrigger", "10").load()
              .selectExpr("CAST(value AS STRING) AS value", "partition", "offset"))
        return (df.writeStream.foreachBatch(sink.bind(location)).option("checkpointLocation", location)
                .trigger(availableNow=True).queryName(name).start())

    def finish(name: str, query: Any) -> None:
        try:
            query.awaitTermination()
            ok[name] = True
        except StreamingQueryException:
            ok[name] = False
        raised[name] = list(Seen.raised)

    plan1 = plan_for("1")
    Zombie.armed = False
    finish("1", start("g1", plan1.checkpoint_location, Seen(path=path, pipeline="delta_zom", dsn=dsn),
                      plan1.starting_offsets_json))
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for i in range(cfg["more"]):
        producer.send(topic, value=f"b{i}".encode(), partition=i % 2)
    producer.flush()
    producer.close()
    Zombie.armed = True
    query = start("zombie", plan1.checkpoint_location, Zombie(path=path, pipeline="delta_zom", dsn=dsn),
                  plan1.starting_offsets_json)
    if not Zombie.paused.wait(300):
        raise RuntimeError("the zombie never reached its write")
    plan2 = plan_for("2")  # the upgrade, while the zombie holds batch 4
    Zombie.go.set()
    finish("zombie", query)
    finish("2", start("g2", plan2.checkpoint_location, Seen(path=path, pipeline="delta_zom", dsn=dsn),
                      plan2.starting_offsets_json))
    plan3 = plan_for("3")
    finish("3", start("g3", plan3.checkpoint_location, Seen(path=path, pipeline="delta_zom", dsn=dsn),
                      plan3.starting_offsets_json))
    values = dict(Counter(r.value for r in spark.read.format("delta").load(path).select("value").collect()))
    print("RESULT " + json.dumps({"ok": ok, "raised": raised, "plans": plans, "sink": values}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
