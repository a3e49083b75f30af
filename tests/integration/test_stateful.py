"""Upgrading a windowed pipeline on the real stack (issue 12): no window lost, none emitted twice.

Each test runs one uninterrupted query over all records as the oracle (its own checkpoint), and an
upgraded pair: version 1 recorded by the real listener and stopped while windows are open, then
version 2 started from ``start_from_ledger(window=...)`` with the event-time floor filter. Both
write append-mode parquet; the union of version 1 and 2 must equal the oracle window by window.
Event times are a payload column, produced out of order (jitter +-2 s, less than the 15 s delay)
over 3 partitions; a final "flush" record an hour later pushes the watermark past every window.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from offset_ledger import OffsetLedgerListener, start_from_ledger
from offset_ledger.errors import StatefulRestartRefused

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
T0_MS = int(T0.timestamp() * 1000)
DELAY = "15 seconds"
PER_TRIGGER = 30


def _records(first: int, last: int) -> list[str]:
    """``id|event_ms``: one record per 500 ms of event time, each shifted by -2..+2 s (out of order)."""
    return [f"r{i}|{T0_MS + i * 500 + ((i * 7919) % 5 - 2) * 1000}" for i in range(first, last)]


FLUSH = f"flush|{T0_MS + 3_600_000}"


def _expected(records: list[str], length_s: int, slide_s: int) -> Counter:
    """(window start s, count) of every window a record falls in, computed by hand."""
    out: Counter = Counter()
    for r in records:
        ms = int(r.split("|")[1])
        if r.startswith("flush"):
            continue
        k = (ms // 1000) // slide_s
        while k * slide_s + length_s > ms / 1000 and k * slide_s <= ms / 1000:
            out[k * slide_s] += 1
            k -= 1
    return out


def _run(spark, kafka, topic: str, starting: str, checkpoint: str, out: Path, *,  # type: ignore[no-untyped-def]
         window: str, slide: str | None, floor: datetime | None = None, listener: Any = None) -> list[Any]:
    from pyspark.sql import functions as F

    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap_servers)
           .option("subscribe", topic).option("startingOffsets", starting)
           .option("maxOffsetsPerTrigger", str(PER_TRIGGER)).load())
    parts = F.split(F.col("value").cast("string"), r"\|")
    events = raw.select(parts[0].alias("id"), (parts[1].cast("long") / 1000).cast("timestamp").alias("event_time"))
    if floor is not None:
        # The one line an upgraded windowed pipeline adds right after parsing.
        events = events.where(F.col("event_time") >= F.lit(floor))
    win = F.window("event_time", window, slide) if slide else F.window("event_time", window)
    counts = events.withWatermark("event_time", DELAY).groupBy(win.alias("w")).count()
    if floor is not None and slide is not None:
        # Sliding windows: a record after the floor also falls in windows that start before it.
        counts = counts.where(F.col("w.start") >= F.lit(floor))
    rows = counts.select(F.col("w.start").cast("long").alias("start_s"), F.col("count"))
    if listener is not None:
        spark.streams.addListener(listener)
    query = (rows.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", checkpoint)
             .outputMode("append").trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(180), "the query did not finish"
        assert query.exception() is None, query.exception()
        progress = query.recentProgress
    finally:
        query.stop()
        if listener is not None:
            assert listener.flush(60), listener.health()
            spark.streams.removeListener(listener)
            listener.close()
    return progress


def _output(spark, out: Path) -> Counter:  # type: ignore[no-untyped-def]
    """(window start, count) -> how many times the window was emitted."""
    if not out.exists() or not any(out.glob("*.parquet")):
        return Counter()
    return Counter((r.start_s, r["count"]) for r in spark.read.parquet(str(out)).collect())


def _upgrade_matches_oracle(spark, kafka, pg_dsn: str, tmp_path: Path, window: str, slide: str | None,
                            length_s: int, slide_s: int) -> tuple[Any, Counter, Counter]:
    topic = kafka.create_topic(partitions=3)
    phase1, phase2 = _records(0, 90), _records(90, 150)
    kafka.produce(topic, phase1)

    def start(**kw: Any):  # type: ignore[no-untyped-def]
        return start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers,
                                 checkpoint_root=str(tmp_path / "ckpt"), dsn=pg_dsn, **kw)

    def listener() -> OffsetLedgerListener:
        return OffsetLedgerListener(dsn=pg_dsn, pipeline="orders", spool_dir=tmp_path / "spool")

    plan1 = start(app_version="1")
    # Version 1 reads phase 1 in 3 batches and stops with windows open (no flush yet).
    _run(spark, kafka, topic, plan1.starting_offsets_json, plan1.checkpoint_location, tmp_path / "v1",
         window=window, slide=slide, listener=listener())
    kafka.produce(topic, phase2)
    kafka.produce(topic, [FLUSH], partition=0)

    plan2 = start(app_version="2", window=window, slide=slide, watermark_delay=DELAY)
    assert plan2.fresh_checkpoint and plan2.event_time_floor is not None
    rewinds = [f for f in plan2.findings if f.kind == "state_rewind"]
    assert len(rewinds) == 1 and rewinds[0].details["records_reread"] > 0
    # The plan's cost agrees with the rewind's own count, with the records' times and sizes read from Kafka.
    assert plan2.cost is not None and plan2.cost.complete
    assert (plan2.cost.records_reread, plan2.cost.records_skipped) == (rewinds[0].details["records_reread"], 0)
    assert plan2.cost.bytes_reread and plan2.cost.span("reread")[0] is not None
    _run(spark, kafka, topic, plan2.starting_offsets_json, plan2.checkpoint_location, tmp_path / "v2",
         window=window, slide=slide, floor=plan2.event_time_floor, listener=listener())

    _run(spark, kafka, topic, "earliest", str(tmp_path / "oracle-ckpt"), tmp_path / "oracle",
         window=window, slide=slide)
    oracle = _output(spark, tmp_path / "oracle")
    upgraded = _output(spark, tmp_path / "v1") + _output(spark, tmp_path / "v2")
    # Nothing was late in the oracle either: it holds every window of every record, once.
    expected = _expected(phase1 + phase2, length_s, slide_s)
    assert oracle == Counter(expected.items())
    assert upgraded == oracle, (sorted(upgraded - oracle), sorted(oracle - upgraded))
    return plan2, _output(spark, tmp_path / "v1"), _output(spark, tmp_path / "v2")


def test_tumbling_window_upgrade_loses_and_doubles_nothing(spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    plan2, v1, v2 = _upgrade_matches_oracle(spark, kafka, pg_dsn, tmp_path, "10 seconds", None, 10, 10)
    assert v1 and v2  # each version emitted part of the windows
    floor_s = int(plan2.event_time_floor.timestamp())
    assert max(s for s, _ in v1) < floor_s <= min(s for s, _ in v2)


def test_sliding_window_upgrade_loses_and_doubles_nothing(spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    _upgrade_matches_oracle(spark, kafka, pg_dsn, tmp_path, "10 seconds", "5 seconds", 10, 5)


def test_no_watermark_recorded_is_refused_and_writes_nothing(spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    from tests.integration.test_authority import _recorded_run, _start
    from tests.integration.test_restart import _values

    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, _values("a", 20))
    plan = _start(kafka, pg_dsn, topic, tmp_path, app_version="1")
    _recorded_run(spark, kafka, pg_dsn, topic, plan, tmp_path)  # a stateless query: no eventTime
    with pytest.raises(StatefulRestartRefused, match="no watermark"):
        _start(kafka, pg_dsn, topic, tmp_path, app_version="2", window="10 seconds")
    again = _start(kafka, pg_dsn, topic, tmp_path, app_version="1")
    assert again.generation == plan.generation and not again.fresh_checkpoint
