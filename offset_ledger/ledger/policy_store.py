"""A pipeline's stored restart policies, audited like resets: every change is a row (who, why, what)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.engine import Connection

from offset_ledger.ledger.locks import lock_pipeline
from offset_ledger.ledger.tables import pipeline_policies
from offset_ledger.rules.policies import merged


@dataclass(frozen=True)
class PolicyChange:
    """One change of a pipeline's policies: the whole set after it."""

    id: int
    pipeline: str
    policies: Mapping[str, Any]
    actor: str
    reason: str | None
    created_at: datetime


def _change(r: Any) -> PolicyChange:
    at = r.created_at if r.created_at.tzinfo else r.created_at.replace(tzinfo=timezone.utc)
    return PolicyChange(r.id, r.pipeline, dict(r.policies or {}), r.actor, r.reason, at)


def current_policies(conn: Connection, pipeline: str) -> dict[str, Any]:
    """The pipeline's policies now ({} when none were ever set)."""
    row = conn.execute(select(pipeline_policies.c.policies).where(pipeline_policies.c.pipeline == pipeline)
                       .order_by(pipeline_policies.c.id.desc()).limit(1)).scalar()
    return dict(row or {})


def set_policies(conn: Connection, pipeline: str, changes: Mapping[str, Any], *, actor: str,
                 reason: str | None, now: datetime | None = None) -> PolicyChange:
    """Apply ``changes`` (None removes a policy) under the pipeline lock; the stored row says who and why."""
    lock_pipeline(conn, pipeline, pipeline)
    after = merged(current_policies(conn, pipeline), changes)
    at = now or datetime.now(timezone.utc)
    new_id = conn.execute(insert(pipeline_policies).values(
        pipeline=pipeline, policies=after, actor=actor, reason=reason, created_at=at,
    ).returning(pipeline_policies.c.id)).scalar_one()
    return PolicyChange(new_id, pipeline, after, actor, reason, at)


def policy_history(conn: Connection, pipeline: str) -> list[PolicyChange]:
    """Every change of the pipeline's policies, oldest first."""
    rows = conn.execute(select(pipeline_policies).where(pipeline_policies.c.pipeline == pipeline)
                        .order_by(pipeline_policies.c.id))
    return [_change(r) for r in rows]
