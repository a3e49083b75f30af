"""The audit trail's findings as plain rows: written once (a pass's findings) and read by the operator.

``ledger.finding_store`` is the recorder's path (a finding that repeats is one row with a count);
these are the others: a reconciling pass or the group mirror adds its findings as they are, and the
operator's reads count and page them (``operate.audit``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.engine import Connection

from offset_ledger.ledger.tables import findings
from offset_ledger.rules.model import Finding


def add_findings(conn: Connection, pipeline: str, consumer_group: str, found: Sequence[Finding],
                 at: datetime) -> None:
    """One row per finding, created ``at``."""
    conn.execute(insert(findings), [{
        "pipeline": pipeline, "consumer_group": consumer_group, "kind": f.kind, "topic": f.topic,
        "partition": f.partition, "message": f.message, "details": dict(f.details), "created_at": at}
        for f in found])


def findings_counts(conn: Connection, *, except_kinds: Collection[str] = ()) -> list[tuple[str, str, int]]:
    """(pipeline, consumer group, rows) of every group with findings, leaving out ``except_kinds``."""
    stmt = select(findings.c.pipeline, findings.c.consumer_group, func.count()).group_by(
        findings.c.pipeline, findings.c.consumer_group)
    if except_kinds:
        stmt = stmt.where(findings.c.kind.not_in(sorted(except_kinds)))
    return [(p, g, int(n)) for p, g, n in conn.execute(stmt)]


def findings_page(conn: Connection, pipeline: str, consumer_group: str, *, kind: str | None, since: datetime | None,
                  before_id: int | None, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` findings of the group, newest (highest id) first: of ``kind``, seen at or after
    ``since`` (the last sighting, else the first), with an id below ``before_id``; every column."""
    stmt = select(findings).where(findings.c.pipeline == pipeline, findings.c.consumer_group == consumer_group)
    if kind is not None:
        stmt = stmt.where(findings.c.kind == kind)
    if since is not None:
        stmt = stmt.where(func.coalesce(findings.c.last_seen_at, findings.c.created_at) >= since)
    if before_id is not None:
        stmt = stmt.where(findings.c.id < before_id)
    return [dict(r._mapping) for r in conn.execute(stmt.order_by(findings.c.id.desc()).limit(limit))]
