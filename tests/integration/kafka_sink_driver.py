"""A Spark driver on a standalone cluster writing Kafka to Kafka through ``KafkaSink``; the crash test kills it.

``python tests/integration/kafka_sink_driver.py CONFIG_JSON``. Each batch goes first through Spark's own
``format("kafka")`` sink (the at-least-once anchor, topic ``anchor``), then through the sink (topic ``out``).
``kill_at`` is ``[point, n]``: in the n-th batch this process writes through the sink, ``write`` dies while the
executors are in their transactions (after ``delay`` seconds), ``commit`` after Kafka's commits and before the
ledger's record, ``after`` after the ledger's record and before Spark's ``commits/<batch>``. The whole process
group dies with SIGKILL (the driver's JVM with it); the executors, on the cluster's worker, live on until the
master notices, as a lost driver host's would. Without ``kill_at`` it runs ``availableNow`` to the end and
prints ``DONE``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from offset_ledger import start_from_ledger
from offset_ledger.sinks import KafkaSink


def _die(why: str) -> None:
    print(f"KILL {why}", flush=True)
    os.killpg(os.getpgid(0), signal.SIGKILL)


class KilledSink(KafkaSink):
    def __init__(self, kill_at: list[Any] | None, delay: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Per point, how often this process reached it (a batch the sink skips reaches neither write nor commit).
        self.kill_at, self.delay, self.reached = kill_at, delay, Counter[str]()

    def _at(self, point: str) -> bool:
        self.reached[point] += 1
        return bool(self.kill_at) and self.kill_at[0] == point and self.reached[point] == self.kill_at[1]

    def _write_partitions(self, *args: Any, **kwargs: Any) -> Any:
        if self._at("write"):
            threading.Timer(self.delay, _die, ("write",)).start()
        return super()._write_partitions(*args, **kwargs)

    def _record(self, *args: Any, **kwargs: Any) -> None:
        if self._at("commit"):
            _die("commit")
        super()._record(*args, **kwargs)

    def write(self, df: Any, batch_id: int) -> Any:
        done = super().write(df, batch_id)
        print(f"BATCH {batch_id} {done.verdict} {done.sequence} "
              f"{json.dumps([[r.partition, r.written, r.skipped, r.committed] for r in self.last_runs])}", flush=True)
        if self._at("after"):
            _die("after")
        return done


def main(cfg: dict[str, Any]) -> None:
    sink = KilledSink(cfg.get("kill_at"), float(cfg.get("delay", 0.5)), topic=cfg["out"],
                      bootstrap_servers=cfg["bootstrap"], pipeline=cfg["pipeline"], dsn=cfg["dsn"])
    plan = start_from_ledger(cfg["pipeline"], [cfg["topic"]], bootstrap_servers=cfg["bootstrap"],
                             checkpoint_root=cfg["checkpoint_root"], app_version=cfg["app_version"], dsn=cfg["dsn"],
                             first_run="earliest", sinks=[sink])
    print(f"PLAN fresh={plan.fresh_checkpoint} findings={[f.kind for f in plan.findings]} "
          f"{plan.starting_offsets_json}", flush=True)
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the executors' Python workers import the sink
    spark = (SparkSession.builder.master(cfg["master"]).appName("kafka-sink-driver")
             .config("spark.jars", cfg["jars"]).config("spark.ui.enabled", "false")
             .config("spark.pyspark.python", sys.executable).config("spark.pyspark.driver.python", sys.executable)
             .config("spark.executor.memory", "600m").config("spark.driver.memory", "700m")
             .config("spark.cores.max", "2").config("spark.sql.shuffle.partitions", "2")
             .config("spark.task.maxFailures", "8").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", cfg["bootstrap"])
          .option("subscribe", cfg["topic"]).option("startingOffsets", plan.starting_offsets_json)
          .option("maxOffsetsPerTrigger", str(cfg.get("max_per_trigger", 60))).load()
          .selectExpr("topic", "partition", "offset", "key",
                      "CAST(concat('out-', CAST(value AS STRING)) AS BINARY) AS value"))
    bound = sink.bind(plan.checkpoint_location)

    def both(batch: Any, batch_id: int) -> None:
        # Spark's own sink on the same batch, the same crashes: what a Kafka -> Kafka job has without the sink.
        (batch.select("key", "value").write.format("kafka").option("kafka.bootstrap.servers", cfg["bootstrap"])
         .option("topic", cfg["anchor"]).save())
        bound.write(batch, batch_id)

    query = (df.writeStream.foreachBatch(both).option("checkpointLocation", plan.checkpoint_location)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    spark.stop()
    print("DONE", flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
