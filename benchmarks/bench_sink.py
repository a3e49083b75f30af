"""Cost of the transactional Postgres sink per micro-batch against a plain foreachBatch JDBC write.

    source .devstack/stack.env   # or pass --dsn / --bootstrap-servers / --jars
    .venv/bin/python benchmarks/bench_sink.py [--rows-per-batch 10000] [--batches 8] [--rounds 3]

A real streaming query reads a Kafka topic (``maxOffsetsPerTrigger`` = rows per batch) and writes
each batch to a Postgres table, two ways, on the same data, rounds interleaved (the machine may be
busy with other work):

- ``jdbc``: the baseline people write: ``foreachBatch`` with ``df.write.jdbc(..., mode="append")``
  (Spark's JDBC writer on the executors, PostgreSQL's JDBC driver, at-least-once);
- ``sink-jdbc``: ``PostgresSink(stage="jdbc")``: Spark's JDBC writer puts the batch into a staging
  table, then one driver transaction moves it into the target and records the batch, its positions
  and its sequence in the ledger (exactly once);
- ``sink-copy``: ``PostgresSink(stage="copy")``: the same with the executors' Python workers
  COPYing the batch (psycopg2) instead of the JVM's JDBC writer.

Time per batch is measured around the write inside ``foreachBatch`` (reading Kafka included, as
both evaluate the batch once); the first batch of each run is a warm-up and left out. Median of
each round, best round reported, after one unmeasured warm-up run. Target: ``sink-jdbc`` within
1.10x of ``jdbc`` at 10,000 rows per batch; exits 1 when missed. The JDBC driver comes from Maven Central (``mvn dependency:get``).

``--iceberg`` measures the Iceberg sink instead, in an interpreter whose PySpark has an Iceberg
runtime (iceberg-spark-runtime-4.1 needs PySpark 4.1: the matrix's ``.venv-pyspark-4.1.1``)::

    .venv-pyspark-4.1.1/bin/python benchmarks/bench_sink.py --iceberg [--rows-per-batch 10000] [--batches 8] [--rounds 3]

The same batches appended to a table of a Hadoop catalog in a scratch warehouse directory, two ways:

- ``iceberg`` (the baseline): ``foreachBatch`` with ``df.writeTo(table).append()`` (at-least-once);
- ``sink-iceberg``: ``IcebergSink``: the ledger's sequence decided in one transaction, the append
  with the batch's identity in the snapshot summary, the snapshot found again in the table's
  metadata, then the batch, its offsets and the snapshot id recorded in a second transaction.

The Kafka connector and Iceberg jars are resolved for the running PySpark (``--jars`` is ignored);
the ledger is a scratch Postgres database as above. No target: the ratio is reported, exit 0.

``--kafka`` measures the Kafka sink: the same batches (``--partitions`` source partitions, default 6)
written to a fresh output topic, two ways:

- ``kafka`` (the baseline): ``foreachBatch`` with Spark's own ``df.write.format("kafka")`` (the JVM's
  producer, at-least-once);
- ``sink-kafka``: ``KafkaSink``: one Kafka transaction per source partition on the executors (Python
  workers, confluent-kafka), the source position sent to the sink's group in it, then the ledger's record.

Records/s is rows per batch over the batch's time; the target is ``sink-kafka`` at >= 0.5x the baseline's
records/s; exits 1 when missed. Then one run of each with one record per source partition per batch:
the per-batch fixed cost (the sink's phases: prepare, the executors' Kafka transactions, the record).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _scratch import ScratchDatabase
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

TARGET_RATIO = 1.10
KAFKA_TARGET = 0.5  # the Kafka sink's records/s against Spark's own Kafka sink
JDBC_DRIVER = "org.postgresql:postgresql:42.7.4"


def jdbc_jar() -> str:
    group, artifact, version = JDBC_DRIVER.split(":")
    jar = Path.home() / ".m2" / "repository" / group.replace(".", "/") / artifact / version / f"{artifact}-{version}.jar"
    if not jar.exists():
        subprocess.run(["mvn", "-q", "-B", "dependency:get", f"-Dartifact={JDBC_DRIVER}"], check=True)
    return str(jar)


def produce(bootstrap: str, topic: str, records: int, partitions: int = 2) -> None:
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, partitions, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=1 << 18)
    payload = "x" * 80
    for i in range(records):
        producer.send(topic, value=f"{i:09d}-{payload}".encode(), partition=i % partitions)
    producer.flush()
    producer.close()


def create_table(dsn: str, name: str) -> None:
    engine = create_engine(dsn)
    with engine.begin() as conn:
        conn.execute(text(f'CREATE TABLE "{name}" (value text, topic text, "partition" int, "offset" bigint)'))
    engine.dispose()


CATALOG = "bench"


def create_topic(bootstrap: str, name: str, partitions: int = 2) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(name, partitions, 1)])
    admin.close()


def committed_count(bootstrap: str, topic: str) -> int:
    """How many records a read_committed consumer finds in ``topic`` (transaction markers take offsets too)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    parts = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in parts}
    count, idle = 0, 0
    while idle < 6:
        msgs = consumer.consume(10_000, 0.5)
        count += sum(1 for m in msgs if m.error() is None)
        done = all(tp.offset >= ends[tp.partition] for tp in consumer.position(
            [TopicPartition(topic, p) for p in parts]) if ends[tp.partition] > 0)
        idle = idle + 1 if not msgs and done else 0
    consumer.close()
    return count


def iceberg_session():  # type: ignore[no-untyped-def]
    """A local session with the Kafka connector and Iceberg's runtime for this PySpark, catalog ``bench``."""
    from pyspark.sql import SparkSession

    from offset_ledger import devstack

    jars = ",".join(str(p) for p in [*devstack.spark_kafka_jars(), *devstack.iceberg_spark_jars()])
    warehouse = tempfile.mkdtemp(prefix="bench-sink-warehouse-")
    spark = (SparkSession.builder.master("local[2]").appName("bench-sink-iceberg").config("spark.jars", jars)
             .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
             .config(f"spark.sql.catalog.{CATALOG}", "org.apache.iceberg.spark.SparkCatalog")
             .config(f"spark.sql.catalog.{CATALOG}.type", "hadoop")
             .config(f"spark.sql.catalog.{CATALOG}.warehouse", warehouse)
             # As tests/integration/iceberg_driver.py: foreachBatch's session must see each new snapshot.
             .config(f"spark.sql.catalog.{CATALOG}.cache-enabled", "false")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "2g").getOrCreate())
    return spark, warehouse


def timed_iceberg_sink(**kwargs):  # type: ignore[no-untyped-def]
    """An IcebergSink that keeps where each batch's time went in ``last_timings`` (ms), as PostgresSink does.

    ``prepare``: the checkpoint's offsets and the deciding ledger transaction; ``snapshots``: reading the
    table's metadata for its own snapshot (before and after the append); ``append``: Spark's append
    (reading the batch from Kafka included: the baseline's whole write); ``record``: the ledger's
    second transaction (the batch, its offsets, the snapshot id).
    """
    from offset_ledger.sinks import IcebergSink

    class Timed(IcebergSink):
        def write(self, df, batch_id):  # type: ignore[no-untyped-def]
            self._t = {"start": time.perf_counter(), "first": 0.0, "snapshots": 0.0, "record": 0.0}
            done = super().write(df, batch_id)
            t, total = self._t, time.perf_counter() - self._t["start"]
            prepare = (t["first"] or time.perf_counter()) - t["start"]
            self.last_timings = {"prepare": prepare * 1000, "snapshots": t["snapshots"] * 1000,
                                 "append": (total - prepare - t["snapshots"] - t["record"]) * 1000,
                                 "record": t["record"] * 1000}
            return done

        def _snapshots(self):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            self._t["first"] = self._t["first"] or t0
            try:
                return super()._snapshots()
            finally:
                self._t["snapshots"] += time.perf_counter() - t0

        def _record(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            try:
                return super()._record(*args, **kwargs)
            finally:
                self._t["record"] += time.perf_counter() - t0

    return Timed(**kwargs)


def run(spark, method: str, dsn: str, bootstrap: str, topic: str, rows: int, total: int,  # type: ignore[no-untyped-def]
        root: str, warehouse: str = "") -> list[float]:
    from offset_ledger import start_from_ledger
    from offset_ledger.sinks import PostgresSink

    table = f"{method.replace('-', '_')}_{uuid.uuid4().hex[:6]}"
    iceberg = "iceberg" in method
    kafka = "kafka" in method
    if kafka:
        create_topic(bootstrap, table)
    elif iceberg:
        spark.sql(f"CREATE TABLE {CATALOG}.db.{table} (value string, topic string, `partition` int, `offset` bigint) "
                  "USING iceberg")
    else:
        create_table(dsn, table)
    pipeline = f"bench_{table}"
    plan = start_from_ledger(pipeline, [topic], bootstrap_servers=bootstrap, checkpoint_root=f"{root}/{table}",
                             dsn=dsn, first_run="earliest")
    times: list[float] = []
    if method.startswith("sink-kafka"):
        from offset_ledger.sinks import KafkaSink

        write = KafkaSink(topic=table, bootstrap_servers=bootstrap, pipeline=pipeline, dsn=dsn,
                          checkpoint_location=plan.checkpoint_location, skip_shuffle=method != "sink-kafka-shuffle")
        # sink-kafka-workers: each Python worker keeps its own producers (the design before the executor's owner).
        write.producer_owner = method != "sink-kafka-workers"
    elif kafka:
        def write(df, batch_id):  # type: ignore[no-untyped-def]
            (df.select("value").write.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("topic", table).save())
    elif method == "sink-iceberg":
        write = timed_iceberg_sink(table=f"db.{table}", warehouse=warehouse, catalog=CATALOG, pipeline=pipeline,
                                   dsn=dsn, checkpoint_location=plan.checkpoint_location)
    elif iceberg:
        def write(df, batch_id):  # type: ignore[no-untyped-def]
            df.writeTo(f"{CATALOG}.db.{table}").append()
    elif method.startswith("sink"):
        write = PostgresSink(table=table, pipeline=pipeline, dsn=dsn, checkpoint_location=plan.checkpoint_location,
                             stage="jdbc" if method == "sink-jdbc" else "copy")
    else:
        url = make_url(dsn)
        jdbc_url = f"jdbc:postgresql://{url.host}:{url.port or 5432}/{url.database}"
        props = {"user": url.username or "", "password": url.password or "", "driver": "org.postgresql.Driver"}

        def write(df, batch_id):  # type: ignore[no-untyped-def]
            df.write.jdbc(jdbc_url, f'"{table}"', mode="append", properties=props)

    phases: list[dict[str, float]] = []

    def timed(df, batch_id):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        write(df, batch_id)
        times.append(time.perf_counter() - t0)
        if getattr(write, "last_timings", None):
            phases.append(dict(write.last_timings))

    df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
          .option("startingOffsets", plan.starting_offsets_json).option("maxOffsetsPerTrigger", str(rows)).load()
          .selectExpr("CAST(value AS STRING) AS value", "topic", "partition", "offset"))
    query = (df.writeStream.foreachBatch(timed).option("checkpointLocation", plan.checkpoint_location)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    if kafka:
        count = committed_count(bootstrap, table)
    elif iceberg:
        count = spark.read.table(f"{CATALOG}.db.{table}").count()
    else:
        engine = create_engine(dsn)
        with engine.connect() as conn:
            count = conn.execute(text(f'SELECT count(*) FROM "{table}"')).scalar()
        engine.dispose()
    assert count == total, (method, count, total)  # every record once, whatever the batches' sizes
    if len(phases) > 2:
        print(f"  {method} phases (median ms): " + ", ".join(
            f"{k} {statistics.median(p[k] for p in phases[1:-1]):.0f}" for k in phases[0]), flush=True)
    if getattr(write, "last_path", None):
        print(f"  {method}: rows reached their transactions by {write.last_path}", flush=True)
    # Kafka splits maxOffsetsPerTrigger over partitions: the last batch may be a small remainder.
    return times[1:-1] if len(times) > 2 else times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("OFFSET_LEDGER_TEST_DSN"))
    parser.add_argument("--bootstrap-servers", default=os.environ.get("OFFSET_LEDGER_TEST_BOOTSTRAP_SERVERS"))
    parser.add_argument("--jars", default=os.environ.get("OFFSET_LEDGER_SPARK_JARS"))
    parser.add_argument("--rows-per-batch", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kafka", action="store_true",
                        help="the Kafka sink against Spark's own format('kafka') sink (target >= 0.5x records/s)")
    parser.add_argument("--profile", action="store_true",
                        help="with --kafka: also the sink with its producers kept per Python worker instead of one "
                             "owner per executor (producer_owner=False), and with its rows grouped by a shuffle "
                             "(skip_shuffle=False)")
    parser.add_argument("--partitions", type=int, default=None,
                        help="source partitions (default 2; 6 with --kafka)")
    parser.add_argument("--iceberg", action="store_true",
                        help="the Iceberg sink against a plain Iceberg append (needs PySpark 4.1, see the docstring)")
    args = parser.parse_args()
    if args.kafka and args.iceberg:
        parser.error("--kafka and --iceberg measure different sinks: one at a time")
    if not (args.dsn and args.bootstrap_servers and (args.jars or args.iceberg)):
        parser.error("needs --dsn, --bootstrap-servers and --jars (or source .devstack/stack.env)")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the sink's workers stage with psycopg2
    from pyspark.sql import SparkSession

    warehouse = ""
    partitions = args.partitions or (6 if args.kafka else 2)
    if args.iceberg:
        spark, warehouse = iceberg_session()
        methods: tuple[str, ...] = ("iceberg", "sink-iceberg")
    elif args.kafka:
        spark = (SparkSession.builder.master("local[2]").appName("bench-sink-kafka").config("spark.jars", args.jars)
                 .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
                 .config("spark.driver.memory", "2g").getOrCreate())
        methods = (("kafka", "sink-kafka", "sink-kafka-workers", "sink-kafka-shuffle") if args.profile
                   else ("kafka", "sink-kafka"))
    else:
        spark = (SparkSession.builder.master("local[2]").appName("bench-sink")
                 .config("spark.jars", f"{args.jars},{jdbc_jar()}").config("spark.ui.enabled", "false")
                 .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "2g").getOrCreate())
        methods = ("jdbc", "sink-jdbc", "sink-copy")
    spark.sparkContext.setLogLevel("ERROR")
    db = ScratchDatabase(args.dsn, "bench_sink")
    root = tempfile.mkdtemp(prefix="bench-sink-")
    topic = f"bench_sink_{uuid.uuid4().hex[:8]}"
    try:
        produce(args.bootstrap_servers, topic, args.rows_per_batch * args.batches, partitions)
        medians: dict[str, list[float]] = {m: [] for m in methods}
        # One unmeasured run first: the JVM's JIT warms up on whichever method goes first.
        run(spark, methods[0], db.dsn, args.bootstrap_servers, topic, args.rows_per_batch,
            args.rows_per_batch * args.batches, root, warehouse)
        for r in range(args.rounds):
            for method in (methods if r % 2 == 0 else tuple(reversed(methods))):
                times = run(spark, method, db.dsn, args.bootstrap_servers, topic, args.rows_per_batch,
                            args.rows_per_batch * args.batches, root, warehouse)
                medians[method].append(statistics.median(times) * 1000)
                print(f"round {r + 1} {method}: median {medians[method][-1]:.0f} ms/batch "
                      f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}, {len(times)} batches)", flush=True)
        if args.kafka:  # the fixed cost: one record per source partition per batch
            small = f"{topic}_small"
            produce(args.bootstrap_servers, small, partitions * 8, partitions)
            fixed = {m: statistics.median(run(spark, m, db.dsn, args.bootstrap_servers, small, partitions,
                                              partitions * 8, root)) * 1000 for m in methods}
    finally:
        spark.stop()
        db.drop()
        shutil.rmtree(root, ignore_errors=True)
        if warehouse:
            shutil.rmtree(warehouse, ignore_errors=True)
    base = min(medians[methods[0]])
    print(f"\n{args.rows_per_batch} rows/batch, best round's median: {methods[0]} {base:.0f} ms/batch (the baseline)")
    ratios = {}
    for method in methods[1:]:
        best = min(medians[method])
        ratios[method] = best / base
        target = "" if args.iceberg or args.kafka else f" (target <= {TARGET_RATIO:.2f}x)"
        print(f"  {method}: {best:.0f} ms/batch, {ratios[method]:.2f}x {methods[0]}, "
              f"+{best - base:.0f} ms/batch{target}")
    if args.kafka:
        rate = {m: args.rows_per_batch / (min(medians[m]) / 1000) for m in methods}
        ratio = rate["sink-kafka"] / rate["kafka"]
        print(f"  records/s: kafka {rate['kafka']:,.0f}, sink-kafka {rate['sink-kafka']:,.0f}: {ratio:.2f}x "
              f"(target >= {KAFKA_TARGET:.2f}x)")
        for method in methods[2:]:
            print(f"  records/s: {method} {rate[method]:,.0f}: {rate[method] / rate['kafka']:.2f}x")
        print(f"  fixed cost, {partitions} records per batch: kafka {fixed['kafka']:.0f} ms/batch, " + ", ".join(
            f"{m} {fixed[m]:.0f} ms/batch (+{fixed[m] - fixed['kafka']:.0f} ms)" for m in methods[1:]))
        return 0 if ratio >= KAFKA_TARGET else 1
    return 0 if args.iceberg or ratios["sink-jdbc"] <= TARGET_RATIO else 1


if __name__ == "__main__":
    raise SystemExit(main())
