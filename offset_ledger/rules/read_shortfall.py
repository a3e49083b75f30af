"""Pure: a batch that read fewer rows than its ranges span skipped records (issue 41).

Spark's Kafka source with ``failOnDataLoss=false`` jumps over offsets that retention deleted before
it fetched them, but the batch's range stays the *planned* one, so the recorded ranges still tile.
What tells the skip is the row count: on a topic that neither compacts nor carries transaction
markers every offset in ``[from_offset, until_offset)`` (``until`` exclusive) is one record, so the
rows a Kafka source read (Spark's ``numInputRows`` per source) equal the offsets it spanned. Fewer
rows: records the job never saw. ``verify`` later decides whether the topic explains them
(compaction, transaction markers: ``offset_ledger.operate.verify_loss``); here only the arithmetic.

Rows are trusted only where Spark counted them: a batch read back from a checkpoint or recorded by a
transactional sink (``recorded_by`` set) carries the offsets spanned as its rows, so it never has a
shortfall. Per source when Spark reported per-source counts; otherwise (every source 0 but the batch
read rows: an older or partial report) the batch total against every source's span, which non-Kafka
sources can only make smaller, never a false loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from offset_ledger.rules.model import BatchOffsets, PartitionRange

#: ``details.kind`` of the ``data_loss`` finding a shortfall is recorded as.
READ_SHORTFALL = "read_shortfall"


@dataclass(frozen=True)
class Shortfall:
    """One source of one batch (``source_index`` None: the batch as a whole) read ``rows`` of ``spanned`` offsets."""

    source_index: int | None
    ranges: tuple[PartitionRange, ...]  # every range of the source with a start (from_offset set)
    spanned: int
    rows: int

    @property
    def missing(self) -> int:
        return self.spanned - self.rows

    @property
    def partition_range(self) -> PartitionRange | None:
        """The one range that spans offsets, when there is one: the shortfall is then exactly that partition's."""
        spanning = [r for r in self.ranges if r.from_offset is not None and r.until_offset > r.from_offset]
        return spanning[0] if len(spanning) == 1 else None

    def details(self) -> dict[str, Any]:
        """The finding's ``details`` (JSON)."""
        return {"kind": READ_SHORTFALL, "source_index": self.source_index, "rows_read": self.rows,
                "offsets_spanned": self.spanned, "missing": self.missing,
                "per_partition": self.partition_range is not None,
                "ranges": [[r.topic, r.partition, r.from_offset, r.until_offset] for r in self.ranges]}

    def message(self, batch_id: int) -> str:
        where = ", ".join(f"{r.topic}-{r.partition} [{r.from_offset}, {r.until_offset})" for r in self.ranges
                          if r.from_offset is not None and r.until_offset > r.from_offset)
        whose = "" if self.source_index is None else f"source {self.source_index} of "
        return (f"{whose}batch {batch_id} read {self.rows:,} rows of {self.spanned:,} offsets ({where}): "
                f"{self.missing:,} records not read (deleted before they were fetched, unless compaction "
                f"or transaction markers explain them)")


def _span(ranges: tuple[PartitionRange, ...]) -> int:
    return sum(r.until_offset - r.from_offset for r in ranges if r.from_offset is not None)


def read_shortfalls(batch: BatchOffsets) -> list[Shortfall]:
    """The batch's shortfalls; empty when every offset spanned was read or the rows were not counted."""
    if batch.recorded_by is not None or not batch.sources:
        return []  # rows not counted by Spark (the offsets spanned stand in for them)
    if any(r.from_offset is None for s in batch.sources for r in s.ranges):
        return []  # a span not known: nothing to compare the rows with
    if batch.input_rows > 0 and not any(s.input_rows for s in batch.sources):
        # Per-source counts not reported: the batch total (non-Kafka sources' rows in it too) is all there is.
        total_span = sum(_span(s.ranges) for s in batch.sources)
        if total_span <= batch.input_rows:
            return []
        ranges = tuple(r for s in batch.sources for r in s.ranges)
        return [Shortfall(None, ranges, total_span, batch.input_rows)]
    # Per source: a non-Kafka source's rows (in the batch total) never hide a Kafka source's shortfall.
    out = []
    for s in batch.sources:
        spanned = _span(s.ranges)
        if s.input_rows < spanned:
            out.append(Shortfall(s.source_index, s.ranges, spanned, s.input_rows))
    return out
