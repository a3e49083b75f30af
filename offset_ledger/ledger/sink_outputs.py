"""What transactional sinks wrote, as the history, a replay and the command line report it.

Reads of ``sinks`` and ``sink_batches`` (with the generation numbers), apart from ``sink_store``'s
transactional bookkeeping: a read of a pipeline's history needs none of the sinks' write path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection

from offset_ledger.ledger.tables import checkpoint_generations, sink_batches, sinks


def pipeline_sinks(conn: Connection, pipeline: str, consumer_group: str | None = None) -> list[dict[str, Any]]:
    """The sinks of a pipeline, with their last commit."""
    query = select(sinks).where(sinks.c.pipeline == pipeline)
    if consumer_group is not None:
        query = query.where(sinks.c.consumer_group == consumer_group)
    return [dict(r._mapping) for r in conn.execute(query.order_by(sinks.c.sink))]


def batch_outputs(conn: Connection, pipeline: str, *, query_id: str | None = None,
                  batch_ids: Sequence[int] | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """What each batch of a pipeline wrote (sink, target, sequence, rows, table version), newest first."""
    query = (select(sink_batches.c.sink, sinks.c.kind, sink_batches.c.target, sinks.c.target_database,
                    sink_batches.c.sequence, sink_batches.c.generation_id, checkpoint_generations.c.generation,
                    sink_batches.c.query_id, sink_batches.c.batch_id, sink_batches.c.row_count,
                    sink_batches.c.table_version, sink_batches.c.committed_at, sink_batches.c.recorded_at)
             .join(sinks, sinks.c.sink == sink_batches.c.sink)
             .outerjoin(checkpoint_generations, checkpoint_generations.c.id == sink_batches.c.generation_id)
             .where(sink_batches.c.pipeline == pipeline))
    if query_id is not None:
        query = query.where(sink_batches.c.query_id == query_id)
    if batch_ids is not None:
        query = query.where(sink_batches.c.batch_id.in_(list(batch_ids)))
    query = query.order_by(sink_batches.c.sequence.desc())
    if limit is not None:
        query = query.limit(limit)
    return [dict(r._mapping) for r in conn.execute(query)]


def outputs_by_batch(conn: Connection, pipeline: str, keys: Sequence[tuple[str, int]]
                     ) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """What each (query id, batch id) of ``keys`` wrote through a sink (batches without a sink are absent)."""
    if not keys:
        return {}
    wanted = set(keys)
    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in batch_outputs(conn, pipeline, batch_ids=sorted({b for _, b in wanted})):
        key = (row["query_id"], row["batch_id"])
        if key in wanted:
            out.setdefault(key, []).append(row)
    return out


def describe_output(row: dict[str, Any]) -> str:
    """One line: ``sink orders:out wrote 10 rows to orders_out (sequence 4)``, with the table version if any."""
    what = f"{row['row_count']} rows" if row.get("row_count") is not None else "rows"
    version = f", table version {row['table_version']}" if row.get("table_version") is not None else ""
    return f"sink {row['sink']} wrote {what} to {row['target']} (sequence {row['sequence']}{version})"
