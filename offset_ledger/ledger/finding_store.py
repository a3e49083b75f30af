"""Writing findings: a finding that repeats while its cause lasts is one row with a count.

A zombie, or a run held by a pending reset, reports the same thing on every batch and partition;
one row per (pipeline, consumer group, run, kind, topic, partition) says it with ``occurrences``,
its first sighting (``created_at``) and its latest (``last_seen_at``, message, batch and offsets).
Prune never deletes findings (``ledger.prune``); this rule keeps their number bounded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.engine import Connection

from offset_ledger.ledger.tables import findings

#: Findings that repeat while their cause lasts (a zombie, a pending reset, a shared partition): one
#: row each with a count. Gaps stay one row per occurrence: each is a different range of records.
_REPEATING_KINDS = frozenset({"pending_reset", "regression", "shared_position", "reset_overtaken", "other"})
_LATEST_COLUMNS = ("message", "query_id", "batch_id", "expected_offset", "actual_offset", "details")


def repeat_key(row: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """(pipeline, group, run, kind, topic, partition) of a finding that repeats, else None."""
    if row["kind"] not in _REPEATING_KINDS or row.get("run_id") is None:
        return None
    return (row["pipeline"], row["consumer_group"], row["run_id"], row["kind"], row["topic"], row["partition"])


def store_findings(conn: Connection, insert: Any, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert new findings; a repeated one (``repeat_key``) updates its row's count and last sighting."""
    fresh: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    counts: dict[tuple[Any, ...], int] = {}
    inserts: list[dict[str, Any]] = []
    for row in rows:
        key = repeat_key(row)
        if key is None:
            inserts.append({**row, "occurrences": 1, "last_seen_at": row["created_at"]})
            continue
        fresh[key] = row  # the latest sighting's content
        counts[key] = counts.get(key, 0) + 1
    existing: dict[tuple[Any, ...], int] = {}
    if fresh:
        f = findings
        found = conn.execute(
            select(f.c.id, f.c.pipeline, f.c.consumer_group, f.c.run_id, f.c.kind, f.c.topic, f.c.partition)
            .where(f.c.pipeline.in_(sorted({k[0] for k in fresh})),
                   f.c.consumer_group.in_(sorted({k[1] for k in fresh})),
                   f.c.run_id.in_(sorted({k[2] for k in fresh})),
                   f.c.kind.in_(sorted({k[3] for k in fresh})))
            .order_by(f.c.id))
        for r in found:
            existing[(r.pipeline, r.consumer_group, r.run_id, r.kind, r.topic, r.partition)] = r.id  # newest wins
    updates = []
    for key, row in fresh.items():
        if key in existing:
            updates.append({"_id": existing[key], "_n": counts[key], "_now": row["created_at"],
                            **{c: row[c] for c in _LATEST_COLUMNS}})
        else:
            inserts.append({**row, "occurrences": counts[key], "last_seen_at": row["created_at"]})
    if updates:
        conn.execute(
            update(findings).where(findings.c.id == bindparam("_id")).values(
                occurrences=func.coalesce(findings.c.occurrences, 1) + bindparam("_n"),
                last_seen_at=bindparam("_now"), **{c: bindparam(c) for c in _LATEST_COLUMNS}),
            updates)
    if inserts:
        conn.execute(insert(findings), inserts)
