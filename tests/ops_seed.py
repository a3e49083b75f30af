"""Writes ledger rows the way the listener does, for operations tests (API, CLI, benchmark)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone

from sqlalchemy import insert
from sqlalchemy.engine import Engine

from offset_ledger.ledger.tables import batch_offsets, batches, positions, runs


def seed_pipeline(
    engine: Engine, pipeline: str, ends: Mapping[str, Mapping[int, int]], *, consumer_group: str | None = None,
    n_batches: int = 3, active: bool = False, start: datetime | None = None,
) -> dict[str, str]:
    """Record ``n_batches`` batches that end at ``ends`` ({topic: {partition: next_offset}}); returns ids.

    Batch k (1-based) reads [prev, end * k / n_batches) on each partition; the run is terminated
    unless ``active``.
    """
    group = consumer_group or pipeline
    query_id, run_id = str(uuid.uuid4()), str(uuid.uuid4())
    t0 = start or datetime.now(timezone.utc) - timedelta(minutes=n_batches)
    now = datetime.now(timezone.utc)
    with engine.begin() as conn:
        conn.execute(insert(runs).values(
            run_id=run_id, query_id=query_id, pipeline=pipeline, consumer_group=group, query_name=pipeline,
            started_at=t0, terminated_at=None if active else now, last_heartbeat_at=now,
            last_batch_id=n_batches - 1, beat_at=now, beat_every_ms=10_000,  # this release's listener beats
        ))
        prev = {(t, p): 0 for t, parts in ends.items() for p in parts}
        for k in range(n_batches):
            bt = t0 + timedelta(minutes=k)
            conn.execute(insert(batches).values(
                pipeline=pipeline, consumer_group=group, query_id=query_id, run_id=run_id, batch_id=k,
                batch_time=bt, recorded_at=bt, input_rows=0,
            ))
            rows = []
            for t, parts in ends.items():
                for p, end in parts.items():
                    until = end * (k + 1) // n_batches
                    rows.append({"pipeline": pipeline, "consumer_group": group, "query_id": query_id,
                                 "batch_id": k, "source_index": 0, "topic": t, "partition": p,
                                 "from_offset": prev[(t, p)] if k else None, "until_offset": until,
                                 "batch_time": bt})
                    prev[(t, p)] = until
            conn.execute(insert(batch_offsets), rows)
        conn.execute(insert(positions), [
            {"pipeline": pipeline, "consumer_group": group, "topic": t, "partition": p, "next_offset": end,
             "updated_at": now, "query_id": query_id, "batch_id": n_batches - 1}
            for t, parts in ends.items() for p, end in parts.items()
        ])
    return {"query_id": query_id, "run_id": run_id}
