"""A Spark driver running a Kafka-to-Kafka query in real-time mode with the listener; the test SIGKILLs it.

``python tests/integration/realtime_driver.py CONFIG_JSON``. The plan comes from
``start_from_ledger`` (``app_version`` names the deployment), the query reads ``topic`` and writes
each record to ``out_topic`` as ``<partition>:<offset>:<value>`` (so the test's oracle knows which
input a record of the output is) with ``trigger(realTime=...)``: each batch spans the trigger
interval and rows are emitted while it runs. ``OffsetLedgerListener`` records the batches. The
driver prints ``PLAN ...`` and ``STARTED <query id>`` and then runs until it is killed, or, with
``run_s``, stops the query after that many seconds (or, with ``until_ends``, as soon as a completed
batch reached those ends) and exits 0.
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


def main(cfg: dict[str, Any]) -> None:
    plan = start_from_ledger(cfg["pipeline"], [cfg["topic"]], bootstrap_servers=cfg["bootstrap"],
                             checkpoint_root=cfg["checkpoint_root"], app_version=cfg["app_version"], dsn=cfg["dsn"],
                             first_run="earliest")
    print(f"PLAN {plan.checkpoint_location} fresh={plan.fresh_checkpoint} {plan.starting_offsets_json}", flush=True)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("realtime-driver")
             .config("spark.jars", cfg["jars"]).config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "1g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    listener = OffsetLedgerListener(dsn=cfg["dsn"], pipeline=cfg["pipeline"], app_version=cfg["app_version"],
                                    spool_dir=cfg["spool_dir"])
    spark.streams.addListener(listener)
    df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", cfg["bootstrap"])
          .option("subscribe", cfg["topic"]).option("startingOffsets", plan.starting_offsets_json).load()
          .selectExpr("CAST(CONCAT_WS(':', CAST(partition AS STRING), CAST(offset AS STRING), "
                      "CAST(value AS STRING)) AS STRING) AS value"))
    query = (df.writeStream.format("kafka").option("kafka.bootstrap.servers", cfg["bootstrap"])
             .option("topic", cfg["out_topic"]).option("checkpointLocation", plan.checkpoint_location)
             .queryName(cfg["pipeline"]).outputMode("update").trigger(realTime=cfg.get("trigger", "5 seconds")).start())
    print(f"STARTED {query.id}", flush=True)
    if cfg.get("run_s"):
        # With ``until_ends`` ({partition: exclusive end}): stop once a batch Spark completed reached
        # them (a fixed sleep was too short on a loaded machine: Spark had not re-read the killed
        # batch yet), ``run_s`` then being only the limit.
        deadline = time.monotonic() + float(cfg["run_s"])
        until = {str(p): int(e) for p, e in (cfg.get("until_ends") or {}).items()}
        while time.monotonic() < deadline:
            if until and any(_reached(progress, cfg["topic"], until) for progress in query.recentProgress):
                break
            time.sleep(0.5)
        query.stop()
        listener.close(10)
        spark.stop()
        print("DONE", flush=True)
        return
    query.awaitTermination()


def _reached(progress: Any, topic: str, until: dict[str, int]) -> bool:
    """Whether the completed batch of ``progress`` ended at or past ``until`` on every partition."""
    for source in progress.sources:
        end = source.endOffset
        ends = json.loads(end) if isinstance(end, str) else end
        if isinstance(ends, dict) and topic in ends:
            return all(int(ends[topic].get(p, -1)) >= e for p, e in until.items())
    return False


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main(json.loads(sys.argv[1]))
