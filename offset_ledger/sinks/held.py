"""A sink's records of a batch it already holds: found in the ledger, dropped from the batch before it is written.

The restart that opened the batch's generation planned each sink on its own commits
(``rules.sink_ahead.sink_plan``): it starts where the sink furthest behind stopped, and stores, in its
``sink_behind`` finding, where each other sink's output ends past that start. A batch of that
generation drops, for this sink only, the records below that end (``rules.sink_ahead.held_in_batch``):
the whole batch when the sink holds all of it, else the rows whose Kafka ``topic``/``partition``/
``offset`` say so. A batch without those columns cannot be split: it is refused (``SinkFenced``),
never written whole.
"""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy.engine import Connection

from offset_ledger.ledger import sink_store
from offset_ledger.rules.sink_ahead import BatchHolding, held_in_batch

#: The batch's columns a sink needs to drop single records: Spark's Kafka source names them so.
OFFSET_COLUMNS = ("topic", "partition", "offset")


def batch_ranges(records: list[Any]) -> list[tuple[str, int, int | None, int]]:
    """(topic, partition, from, until) of the batch the ledger ``records`` describe (its last record)."""
    if not records:
        return []
    return [(r.topic, r.partition, r.from_offset, r.until_offset)
            for s in records[-1].batch.sources for r in s.ranges]


#: (ledger, generation id, sink) -> its planned reach: written with the generation, in the transaction that
#: opened it, and never changed, so read once per driver process (not on every batch).
_REACH: dict[tuple[str, int, str], dict[tuple[str, int], int]] = {}
_REACH_LOCK = threading.Lock()


def holding(conn: Connection, sink: str, generation_id: int, records: list[Any]) -> BatchHolding:
    """What ``sink`` already holds of the batch ``records`` describe, in generation ``generation_id``."""
    key = (conn.engine.url.render_as_string(hide_password=True), generation_id, sink)
    with _REACH_LOCK:
        reach = _REACH.get(key)
    if reach is None:
        reach = sink_store.planned_reach(conn, generation_id, sink)
        with _REACH_LOCK:
            _REACH[key] = reach
    if not reach:
        return BatchHolding()
    return held_in_batch(batch_ranges(records), reach)


def refusal(sink: str, held: BatchHolding, columns: list[str]) -> str | None:
    """Why the batch cannot drop the records ``held`` (None: it can, or it need not)."""
    if not held.held or held.whole:
        return None
    missing = [c for c in OFFSET_COLUMNS if c not in columns]
    if not missing:
        return None
    return (f"sink {sink!r} already holds {held.partitions()} of this batch (an earlier generation's commit the "
            f"restart planned it to skip) and the batch has no {', '.join(missing)} column(s) to tell those "
            f"records apart: it would write them a second time, so nothing is written. Keep Spark's Kafka "
            f"columns topic, partition and offset in the DataFrame the sink writes (docs/sinks.md, fences per sink)")


def without_held(df: Any, held: BatchHolding) -> Any:
    """``df`` without the records ``held`` says the sink holds (on the executors: a filter, nothing collected)."""
    if not held.held:
        return df
    from pyspark.sql import functions as F

    cond = None
    for topic, partition, start, until in held.held:
        one = (F.col("topic") == topic) & (F.col("partition") == partition) & (F.col("offset") < until)
        if start is not None:
            one = one & (F.col("offset") >= start)
        cond = one if cond is None else cond | one
    return df.filter(~F.coalesce(cond, F.lit(False)))
