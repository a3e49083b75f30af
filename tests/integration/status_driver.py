"""A Spark driver with the listener and the Postgres sink, running until it is killed (the status tests).

``python tests/integration/status_driver.py CONFIG_JSON``: a processing-time query reads the topic
into the target through ``PostgresSink``, with ``OffsetLedgerListener`` attached and Spark's idle
events every ``idle_interval`` (``spark.sql.streaming.noDataProgressEventInterval``). It prints
``BATCH n`` per batch and never stops by itself: the test SIGKILLs its process group, as a lost
driver host would die.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from offset_ledger import OffsetLedgerListener, start_from_ledger
from offset_ledger.sinks import PostgresSink


class PrintingSink(PostgresSink):
    def write(self, df, batch_id):  # type: ignore[no-untyped-def]
        done = super().write(df, batch_id)
        print(f"BATCH {batch_id} {done.verdict}", flush=True)
        return done


def main(cfg: dict[str, Any]) -> None:
    plan = start_from_ledger(cfg["pipeline"], [cfg["topic"]], bootstrap_servers=cfg["bootstrap"],
                             checkpoint_root=cfg["checkpoint_root"], app_version="1", dsn=cfg["dsn"],
                             first_run="earliest")
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").appName("status-driver")
             .config("spark.jars", cfg["jars"]).config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "1g")
             .config("spark.sql.streaming.noDataProgressEventInterval", cfg["idle_interval"]).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.streams.addListener(OffsetLedgerListener(dsn=cfg["dsn"], pipeline=cfg["pipeline"],
                                                   spool_dir=cfg["spool_dir"]))
    df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", cfg["bootstrap"])
          .option("subscribe", cfg["topic"]).option("startingOffsets", plan.starting_offsets_json)
          .option("maxOffsetsPerTrigger", "10").load()
          .selectExpr("CAST(value AS STRING) AS value", "topic", "partition", "offset"))
    sink = PrintingSink(table=cfg["table"], checkpoint_location=plan.checkpoint_location, pipeline=cfg["pipeline"],
                        dsn=cfg["dsn"])
    (df.writeStream.foreachBatch(sink).option("checkpointLocation", plan.checkpoint_location)
     .trigger(processingTime=cfg["trigger"]).start())
    print("STARTED", flush=True)
    while True:  # until SIGKILL
        time.sleep(1)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
