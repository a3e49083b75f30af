"""How many records of an offset range a ``read_committed`` consumer gets today (issue 41's verify).

A batch that read fewer rows than its range spans (``offset_ledger.rules.read_shortfall``) lost
records, unless the offsets it did not read were never records a consumer gets: transaction markers
(one control record per commit or abort, invisible to every consumer) and the records of aborted
transactions (invisible to a ``read_committed`` one). Those stay in the log until retention or
compaction removes them, so reading the range again counts them exactly: the offsets of
``[max(from, log-start), until)`` a ``read_committed`` consumer skips. Reading with
``read_committed`` whatever the job's own isolation level (the ledger does not know it) can only
explain more, never report a loss that was not: a ``read_uncommitted`` job's shortfall is at most the
markers. Offsets below today's log-start are gone; nothing can be said about them (``gone``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RangeReading:
    """``[from_offset, until_offset)`` read again: ``gone`` offsets below log-start, ``skipped`` present ones
    a read_committed consumer does not get (markers, aborted records, compacted away); None: not answered."""

    gone: int
    skipped: int | None


def read_ranges(configs: Mapping[str, Any], ranges: Sequence[tuple[str, int, int, int]], *,
                timeout_ms: int = 10_000) -> dict[tuple[str, int, int, int], RangeReading]:
    """Each (topic, partition, from_offset, until_offset) read again with a read_committed consumer."""
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    out: dict[tuple[str, int, int, int], RangeReading] = {}
    if not ranges:
        return out
    consumer = KafkaConsumer(**{**dict(configs), "group_id": None, "enable_auto_commit": False,
                                "isolation_level": "read_committed", "auto_offset_reset": "earliest",
                                "check_crcs": False})
    try:
        tps = sorted({KTP(t, p) for t, p, _, _ in ranges})
        starts = consumer.beginning_offsets(tps)
        for key in sorted(set(ranges)):
            topic, partition, since, until = key
            ktp = KTP(topic, partition)
            first = max(since, int(starts.get(ktp, since)))
            gone = max(0, min(first, until) - since)
            if first >= until:
                out[key] = RangeReading(gone, 0)
                continue
            consumer.assign([ktp])
            consumer.seek(ktp, first)
            got = 0
            deadline = time.monotonic() + timeout_ms / 1000
            # The position moves past markers and aborted batches too: at ``until`` the range is read.
            while consumer.position(ktp) < until and time.monotonic() < deadline:
                for record in consumer.poll(timeout_ms=200).get(ktp, ()):
                    if first <= record.offset < until:
                        got += 1
            done = consumer.position(ktp) >= until
            out[key] = RangeReading(gone, (until - first) - got if done else None)
    finally:
        consumer.close()
    return out
