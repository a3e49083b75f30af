"""The Kafka sink's decisions, pure: what a batch must carry, what a task writes, what it commits, what a
restart may record.

``KafkaSink`` (``sinks/kafka.py``) writes one Kafka transaction per *source* partition: the outputs of
that partition's rows and, in the same transaction, the source position (``send_offsets_to_transaction``)
to a consumer group the sink owns. Kafka then holds "output written" and "input consumed up to X" as one
fact, and every attempt reads X first (after ``init_transactions`` fenced the older ones) and writes only
the rows at or past it. These rules are that arithmetic, and the mark each commit carries (the offset
commit's metadata) so that a restart can record a batch the ledger missed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The columns of Spark's Kafka source a batch must keep: which source record each output row comes from.
SOURCE_COLUMNS = ("topic", "partition", "offset")

#: Kafka's default ``offset.metadata.max.bytes`` is 4096; a mark longer than this drops the batch's record
#: (the restart then cannot record that batch from Kafka, and the re-run's skip covers it instead).
MAX_MARK_CHARS = 3500


def missing_columns(columns: Sequence[str], value_column: str) -> list[str]:
    """The columns the sink needs and the batch lacks: the source ones and the value."""
    have = set(columns)
    return [c for c in (*SOURCE_COLUMNS, value_column) if c not in have]


def refusal(sink: str, missing: Sequence[str], columns: Sequence[str]) -> str:
    """Why a batch without its source columns is refused (before anything is written)."""
    return (f"sink {sink!r} needs each row's source record: the batch has no {', '.join(missing)} column(s) "
            f"(it has {', '.join(columns) or 'none'}). Keep Spark's Kafka columns topic, partition and offset "
            f"beside value (and key, headers) in the DataFrame the sink writes; an aggregation or a join that "
            f"loses them cannot be written exactly once per source partition (docs/sinks.md, Kafka): nothing was "
            f"written")


def transactional_id(pipeline: str, sink: str, topic: str, partition: int) -> str:
    """One transactional id per (sink, source partition): every attempt at that partition fences the older."""
    return f"{pipeline}.{sink}.{topic}.{partition}"


def default_group(sink: str) -> str:
    """The consumer group the sink owns: its committed offsets are the sink's position, per source partition."""
    return f"offset-ledger-sink.{sink}"


def to_write(offset: int, committed: int | None) -> bool:
    """Whether a row at ``offset`` is written: not when the sink's group already holds it (a re-run's row)."""
    return committed is None or offset >= committed


def commit_position(until: int | None, last_offset: int | None, committed: int | None) -> int:
    """The source position a partition's transaction commits: the batch's end of the partition (or past its
    last row when the batch's end is unknown), never below what the group holds (a re-run never moves back)."""
    ends = [x for x in (until, None if last_offset is None else last_offset + 1, committed) if x is not None]
    if not ends:
        raise ValueError("a partition with no range end, no row and no committed position has nothing to commit")
    return max(ends)


@dataclass(frozen=True)
class Mark:
    """What a partition's offset commit says of the batch that made it (the commit's metadata)."""

    sink: str
    sequence: int
    generation_id: int
    batch_id: int
    query_id: str
    partitions: int  # how many source partitions the batch commits: the batch is whole when all of them carry it
    batch: dict[str, Any] | None = field(default=None, compare=False)  # rules.sink_batch.batch_doc, when it fits

    def encode(self) -> str:
        doc: dict[str, Any] = {"ol": 1, "sink": self.sink, "s": self.sequence, "g": self.generation_id,
                               "b": self.batch_id, "q": self.query_id, "n": self.partitions}
        if self.batch is not None:
            full = json.dumps({**doc, "doc": self.batch}, separators=(",", ":"))
            if len(full) <= MAX_MARK_CHARS:
                return full
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | None) -> Mark | None:
        """The mark in an offset commit's metadata (None: no metadata, or not a mark of this package)."""
        if not text:
            return None
        try:
            doc = json.loads(text)
            if not isinstance(doc, dict) or doc.get("ol") != 1:
                return None
            return cls(str(doc["sink"]), int(doc["s"]), int(doc["g"]), int(doc["b"]), str(doc["q"]), int(doc["n"]),
                       doc.get("doc") if isinstance(doc.get("doc"), dict) else None)
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True)
class PartitionRun:
    """What one task did for one source partition (returned to the driver: counts, never rows)."""

    topic: str
    partition: int
    written: int
    skipped: int
    committed: int


def batch_partitions(ranges: Iterable[tuple[str, int, int | None, int]],
                     ) -> dict[tuple[str, int], tuple[int | None, int]]:
    """The source partitions a batch commits, with their (from, until): those it read anything of."""
    return {(t, p): (f, u) for t, p, f, u in ranges if f is None or u > f}


def unrecorded(marks: Mapping[tuple[str, int], Mark | None], sink: str, known_sequence: int) -> list[Mark]:
    """The batches the group holds whole and the ledger lacks (sequence past ``known_sequence``), oldest first.

    A batch is whole when as many partitions carry its mark as it commits; one partially committed (the
    driver or an executor died between two partitions' transactions) is not: its partitions are read
    again from the ledger's positions and each task skips what its partition's group already holds.
    """
    found: dict[tuple[int, int, int, str], list[Mark]] = {}
    for mark in marks.values():
        if mark is not None and mark.sink == sink and mark.sequence > known_sequence:
            found.setdefault((mark.sequence, mark.generation_id, mark.batch_id, mark.query_id), []).append(mark)
    # A sequence decided twice (a batch that died half-committed, then the batch a restart gave the same
    # sequence) leaves partitions marked by each; only the one all of whose partitions carry it is whole.
    whole = [ms for ms in found.values() if len(ms) == ms[0].partitions]
    sequences = [ms[0].sequence for ms in whole]
    out = []
    for ms in sorted(whole, key=lambda ms: ms[0].sequence):
        with_doc = next((m for m in ms if m.batch is not None), None)
        if with_doc is not None and sequences.count(ms[0].sequence) == 1:
            out.append(with_doc)
    return out


def scan_assignment(scan: Sequence[Sequence[tuple[str, int, int, int]]] | None,
                    ranges: Mapping[tuple[str, int], tuple[int | None, int]],
                    ) -> tuple[list[tuple[str, int] | None] | None, str]:
    """Which source partition each Spark partition of the batch holds, when its own scan already groups them.

    ``scan``: per Spark partition of the rows the sink writes, the Kafka ranges (topic, partition, from,
    until) its input split reads, traced through a lineage of one-to-one dependencies back to Spark's
    Kafka scan (None: the lineage is not such a chain: a shuffle, a union, a coalesce, another source).
    The shuffle that groups rows by source partition can be skipped only when every Spark partition
    reads exactly one source partition, no source partition is split over two (``minPartitions``,
    ``maxRecordsPerPartition``), and each reads the batch's own range of it: then each task is the one
    transaction of its partition, as after the shuffle. Returns (the source partition per Spark
    partition, None for an empty range the batch does not commit; or None, and why not).
    """
    if scan is None:
        return None, "the rows' lineage is not a one-to-one chain over Spark's Kafka scan"
    out: list[tuple[str, int] | None] = []
    seen: set[tuple[str, int]] = set()
    for index, split in enumerate(scan):
        if len(split) != 1:
            return None, f"Spark partition {index} reads {len(split)} Kafka ranges, not one"
        topic, partition, from_offset, until = split[0]
        tp = (topic, int(partition))
        if tp in seen:
            return None, f"{topic}[{partition}] is read by more than one Spark partition (a split range)"
        seen.add(tp)
        if tp not in ranges:
            if int(until) > int(from_offset):
                return None, f"the scan reads {topic}[{partition}], which the batch's ranges do not hold"
            out.append(None)
            continue
        want_from, want_until = ranges[tp]
        if int(until) != want_until or (want_from is not None and int(from_offset) != want_from):
            return None, f"the scan reads {topic}[{partition}] {from_offset}-{until}, the batch {want_from}-{want_until}"
        out.append(tp)
    return out, ""


def task_totals(timings: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """The tasks' timings of one batch summed per phase (executor time, not wall time: tasks run in parallel)."""
    keys = ("connect_ms", "init_ms", "fenced_ms", "group_read_ms", "send_offsets_ms", "rows_ms", "commit_ms",
            "new_producers")
    return {f"tasks_{k}": sum(float(t.get(k, 0.0)) for t in timings) for k in keys}
