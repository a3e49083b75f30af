"""A Spark driver writing a Kafka topic to Postgres through the sink; the crash tests SIGKILL it.

``python tests/integration/sink_driver.py CONFIG_JSON``. The config names the stack, the topic,
the pipeline and where to die: ``kill_at`` is ``[point, n]`` with point ``stage`` (in the n-th batch
this process runs, after the executors staged its rows and before the commit transaction) or
``commit`` (after the sink's transaction committed, before Spark writes ``commits/<batch>``). The
whole process group dies with SIGKILL, the JVM with it, exactly as a lost driver host would. Without
``kill_at`` the driver runs ``availableNow`` to the end of the topic and exits 0. ``select``: the
batch's columns (Spark SQL expressions over the Kafka source); ``executor_env``: environment of the
Python workers (``spark.executorEnv.*``, e.g. their ``TZ``); ``probe``: expressions the workers
render first, printed as ``PROBE [...]`` (what PySpark hands a worker for them).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from offset_ledger import start_from_ledger
from offset_ledger.sinks import PostgresSink


def _die() -> None:
    sys.stdout.flush()
    os.killpg(os.getpgid(0), signal.SIGKILL)


class KilledSink(PostgresSink):
    """The sink, dying at a chosen point of a chosen batch (the test's crash injection)."""

    def __init__(self, kill_at: list[Any] | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kill_at = kill_at
        self.calls = 0
        self.moves = 0  # batches that reached the move (a re-run the sink skips never does)

    def _move(self, conn, staging, stage_table, columns):  # type: ignore[no-untyped-def]
        self.moves += 1
        if self.kill_at and self.kill_at[0] == "stage" and self.moves == self.kill_at[1]:
            print(f"KILL stage {stage_table}", flush=True)
            _die()
        return super()._move(conn, staging, stage_table, columns)

    def write(self, df, batch_id):  # type: ignore[no-untyped-def]
        self.calls += 1
        done = super().write(df, batch_id)
        print(f"BATCH {batch_id} {done.verdict} {done.sequence}", flush=True)
        if self.kill_at and self.kill_at[0] == "commit" and self.calls == self.kill_at[1]:
            print(f"KILL commit {batch_id}", flush=True)
            _die()
        return done


def main(cfg: dict[str, Any]) -> None:
    plan = start_from_ledger(cfg["pipeline"], [cfg["topic"]], bootstrap_servers=cfg["bootstrap"],
                             checkpoint_root=cfg["checkpoint_root"], app_version=cfg["app_version"], dsn=cfg["dsn"],
                             first_run="earliest")
    print(f"PLAN {plan.checkpoint_location} fresh={plan.fresh_checkpoint} {plan.starting_offsets_json}", flush=True)
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the workers stage rows with psycopg2
    builder = (SparkSession.builder.master("local[2]").appName("sink-driver")
               .config("spark.jars", cfg["jars"]).config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "1g"))
    for key, value in cfg.get("executor_env", {}).items():
        builder = builder.config(f"spark.executorEnv.{key}", value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if cfg.get("probe"):
        rendered = (spark.range(1).selectExpr(*cfg["probe"]).rdd
                    .map(lambda row: [v.isoformat() if hasattr(v, "isoformat") else v for v in row]).collect())
        print("PROBE " + json.dumps(rendered[0]), flush=True)
    df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", cfg["bootstrap"])
          .option("subscribe", cfg["topic"]).option("startingOffsets", plan.starting_offsets_json)
          .option("maxOffsetsPerTrigger", str(cfg.get("max_per_trigger", 10))).load()
          .selectExpr(*cfg.get("select", ["CAST(value AS STRING) AS value", "topic", "partition", "offset"])))
    sink = KilledSink(cfg.get("kill_at"), table=cfg["table"], checkpoint_location=plan.checkpoint_location,
                      pipeline=cfg["pipeline"], dsn=cfg["dsn"], stage=cfg.get("stage", "copy"))
    query = (df.writeStream.foreachBatch(sink).option("checkpointLocation", plan.checkpoint_location)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    spark.stop()
    print("DONE", flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
