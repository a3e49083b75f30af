"""Pure: the offsets of the batch a ``foreachBatch`` function is running, from its checkpoint.

Spark writes ``offsets/<n>`` (the batch's end offsets) before it runs batch ``n`` and
``commits/<n>`` after: inside ``foreachBatch(df, n)`` the first exists and the second does not yet.
The batch starts where ``offsets/<n-1>`` ended, or at the sources' initial offsets
(``sources/<i>/0``) for batch 0. Reading the files (not the listener) makes the sink work with and
without the listener, on classic Spark and on Spark Connect.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from offset_ledger.errors import CheckpointFormatError
from offset_ledger.rules.checkpoint import (
    CheckpointFiles,
    CommittedBatch,
    SourceOffset,
    parse_initial_offsets,
    parse_metadata,
    parse_offsets_file,
)
from offset_ledger.rules.model import BatchOffsets, PartitionRange, SourceProgress


def _ids(names: list[str]) -> list[int]:
    return sorted(int(n) for n in names if n.isdigit())


def running_batch(location: str, files: CheckpointFiles, batch_id: int) -> tuple[str, CommittedBatch]:
    """(query id, the batch's start and end offsets) of batch ``batch_id`` as planned in the checkpoint."""
    root = location.rstrip("/")
    meta = files.read("metadata")
    if meta is None:
        raise CheckpointFormatError(f"{root}/metadata", "missing: is this the query's checkpoint location?")
    query_id = parse_metadata(meta, f"{root}/metadata")
    data = files.read(f"offsets/{batch_id}")
    if data is None:
        raise CheckpointFormatError(f"{root}/offsets/{batch_id}",
                                    "missing: Spark writes it before the batch runs (is this the query's checkpoint?)")
    _, timestamp_ms, ends = parse_offsets_file(data, f"{root}/offsets/{batch_id}")
    starts: tuple[SourceOffset, ...] | None = None
    if batch_id > 0:
        before = files.read(f"offsets/{batch_id - 1}")
        if before is not None:
            starts = parse_offsets_file(before, f"{root}/offsets/{batch_id - 1}")[2]
    else:
        initial = []
        for index in _ids(files.list("sources")):
            raw = files.read(f"sources/{index}/0")
            if raw is not None:
                initial.append(parse_initial_offsets(raw, index, f"{root}/sources/{index}/0"))
        starts = tuple(initial) or None
    return query_id, CommittedBatch(batch_id, timestamp_ms, starts, ends)


def batch_doc(batch: BatchOffsets, checkpoint_location: str) -> dict[str, Any]:
    """A batch's ledger record as JSON, kept in a remote target's commit log to reconcile the ledger from."""
    return {"query_id": batch.query_id, "batch_id": batch.batch_id, "batch_time": batch.batch_time.isoformat(),
            "input_rows": batch.input_rows, "checkpoint_location": checkpoint_location,
            "sources": [{"index": s.source_index, "name": s.description, "rows": s.input_rows,
                         "ranges": [[r.topic, r.partition, r.from_offset, r.until_offset] for r in s.ranges]}
                        for s in batch.sources]}


def batch_from_doc(doc: dict[str, Any], run_id: str, recorded_by: str) -> BatchOffsets:
    """The inverse of ``batch_doc``."""
    sources = tuple(
        SourceProgress(s["index"], s["name"], tuple(PartitionRange(t, int(p), f, int(u)) for t, p, f, u in s["ranges"]),
                       int(s["rows"])) for s in doc["sources"])
    return BatchOffsets(doc["query_id"], run_id, None, int(doc["batch_id"]), datetime.fromisoformat(doc["batch_time"]),
                        int(doc["input_rows"]), sources, recorded_by=recorded_by)
