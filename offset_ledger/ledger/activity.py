"""When a run counts as active: the rule behind 409 on resets and the pipelines' running/stale state.

A run is active until Spark reports its termination or it misses heartbeats (progress or idle
events; Spark posts one at least every 10 s while a query waits for data) for longer than its
timeout: ``max(run timeout, 3 x the longest batch it reported)``. The run timeout comes from
``OFFSET_LEDGER_RUN_TIMEOUT`` (default 10m): a query whose micro-batches take 20 minutes sends no
event during a batch, and must not look stopped (and open to resets) in the middle of one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from functools import cache
from typing import Any, Literal

from sqlalchemy import Select, select
from sqlalchemy.engine import Connection

from offset_ledger.ledger.tables import runs

RunState = Literal["active", "stale", "terminated"]


def run_timeout() -> timedelta:
    """The configured run timeout (``OFFSET_LEDGER_RUN_TIMEOUT``; InvalidDuration when malformed)."""
    from offset_ledger.config import settings
    from offset_ledger.rules.durations import parse_duration

    return parse_duration(settings().run_timeout, "OFFSET_LEDGER_RUN_TIMEOUT")


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


@dataclass(frozen=True)
class RunActivity:
    """One run's state and why."""

    run_id: str
    query_id: str
    state: RunState
    last_seen: datetime
    timeout: timedelta
    why: str
    generation_id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"runId": self.run_id, "queryId": self.query_id, "state": self.state,
                "lastSeen": self.last_seen.isoformat(), "timeoutSeconds": int(self.timeout.total_seconds()),
                "why": self.why}


def assess(
    run_id: str, query_id: str, terminated_at: datetime | None, last_heartbeat_at: datetime | None,
    started_at: datetime, max_batch_ms: int | None, *, now: datetime, timeout: timedelta | None = None,
) -> RunActivity:
    """The state of one run at ``now`` and a sentence that says why."""
    base = timeout if timeout is not None else run_timeout()
    longest = timedelta(milliseconds=max_batch_ms or 0)
    limit = max(base, 3 * longest)
    seen = _utc(last_heartbeat_at) or _utc(started_at)
    assert seen is not None
    basis = (f"timeout {_human(limit)} = 3 x its longest batch {_human(longest)}" if limit > base
             else f"timeout {_human(limit)}")
    if terminated_at is not None:
        return RunActivity(run_id, query_id, "terminated", seen, limit, "Spark reported its termination")
    silent = now - seen
    if silent <= limit:
        return RunActivity(run_id, query_id, "active", seen, limit,
                           f"last heartbeat {_human(silent)} ago ({basis})")
    return RunActivity(run_id, query_id, "stale", seen, limit,
                       f"no heartbeat for {_human(silent)} and no termination reported ({basis}): "
                       f"presumed crashed")


def run_is_active(
    terminated_at: datetime | None, last_heartbeat_at: datetime | None, started_at: datetime,
    max_batch_ms: int | None, *, now: datetime, timeout: timedelta | None = None,
) -> bool:
    return assess("", "", terminated_at, last_heartbeat_at, started_at, max_batch_ms, now=now,
                  timeout=timeout).state == "active"


@cache
def _open_runs_stmt() -> Select[Any]:
    # Built once (the pipelines list asks on every request); .where() on it makes a new statement.
    return select(runs.c.pipeline, runs.c.consumer_group, runs.c.run_id, runs.c.query_id, runs.c.started_at,
                  runs.c.last_heartbeat_at, runs.c.max_batch_ms, runs.c.generation_id
                  ).where(runs.c.terminated_at.is_(None)).order_by(runs.c.started_at)


def open_runs(
    conn: Connection, pipeline: str | None = None, consumer_group: str | None = None, *,
    now: datetime | None = None, timeout: timedelta | None = None,
) -> dict[tuple[str, str], list[RunActivity]]:
    """Every unterminated run (of one pipeline and group, or all), assessed, oldest first."""
    at = now or datetime.now(timezone.utc)
    limit = timeout if timeout is not None else run_timeout()
    stmt = _open_runs_stmt()
    if pipeline is not None:
        stmt = stmt.where(runs.c.pipeline == pipeline, runs.c.consumer_group == (consumer_group or pipeline))
    out: dict[tuple[str, str], list[RunActivity]] = {}
    for r in conn.execute(stmt):
        act = assess(r.run_id, r.query_id, None, r.last_heartbeat_at, r.started_at, r.max_batch_ms,
                     now=at, timeout=limit)
        out.setdefault((r.pipeline, r.consumer_group), []).append(replace(act, generation_id=r.generation_id))
    return out


def _human(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
