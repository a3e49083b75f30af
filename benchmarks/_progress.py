"""Spark-shaped progress JSON for the benchmarks (shared by bench_record.py and bench_fleet.py; no PySpark import)."""

from __future__ import annotations

import json

TOPIC = "bench"


def progress_json(query_id: str, batch_id: int, partitions: int, per_batch: int = 10, topic: str = TOPIC) -> str:
    """A Spark-shaped progress event whose batch reads ``per_batch`` records from each partition."""
    since = {str(p): batch_id * per_batch for p in range(partitions)}
    until = {str(p): (batch_id + 1) * per_batch for p in range(partitions)}
    return json.dumps({
        "id": query_id, "runId": query_id[::-1], "name": None, "timestamp": "2026-11-22T20:42:12.804Z",
        "batchId": batch_id, "batchDuration": 10, "numInputRows": per_batch * partitions,
        "durationMs": {"triggerExecution": 10}, "stateOperators": [],
        "sources": [{"description": f"KafkaV2[Subscribe[{topic}]]",
                     "startOffset": {topic: since} if batch_id else None,
                     "endOffset": {topic: until}, "latestOffset": {topic: until},
                     "numInputRows": per_batch * partitions}],
        "sink": {"description": "NoopSink", "numOutputRows": -1}})
