"""When a run counts as active, read from the ledger: the rule (``rules.liveness``) over ``runs`` rows.

It decides 409 on resets, the pipelines' running/uncertain/stale/stopped state and its evidence.
Two settings feed it: ``OFFSET_LEDGER_RUN_SILENCE_FLOOR`` (60 s), the least silence after which a run
the listener watches is presumed crashed, and ``OFFSET_LEDGER_RUN_TIMEOUT`` (10 min), how long a run
only a sink or the watcher records (no listener heartbeats) counts as running after its last batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import cache
from typing import Any

from sqlalchemy import Select, and_, func, or_, select
from sqlalchemy.engine import Connection

from offset_ledger.config import settings
from offset_ledger.ledger.tables import runs
from offset_ledger.rules.durations import parse_duration
from offset_ledger.rules.liveness import (
    Bounds,
    Liveness,
    PipelineVerdict,
    RunFacts,
    RunState,
    assess_runs,
    pipeline_verdict,
)

__all__ = ["RunActivity", "RunState", "bounds", "last_ends", "open_runs", "run_is_active", "run_timeout",
           "verdict"]


def run_timeout() -> timedelta:
    """``OFFSET_LEDGER_RUN_TIMEOUT``: how long a run without listener heartbeats is inferred running."""
    return parse_duration(settings().run_timeout, "OFFSET_LEDGER_RUN_TIMEOUT")


def bounds(timeout: timedelta | None = None) -> Bounds:
    """The configured bounds (InvalidDuration when malformed); ``timeout`` overrides both."""
    if timeout is not None:
        return Bounds(floor=timeout, inferred=timeout)

    return Bounds(floor=parse_duration(settings().run_silence_floor, "OFFSET_LEDGER_RUN_SILENCE_FLOOR"),
                  inferred=run_timeout())


@dataclass(frozen=True)
class RunActivity:
    """One run's state and why (the API's ``runs`` entries)."""

    run_id: str
    query_id: str
    state: RunState
    last_seen: datetime
    timeout: timedelta
    why: str
    generation_id: int | None = None
    inferred: bool = False  # no listener heartbeats: the state is inferred from the last batch
    follows: str | None = None  # a sink's or watcher's run: the listener run whose state it takes
    heartbeat: bool = False  # judged on the driver's own heartbeat (``rules.liveness``)

    @classmethod
    def of(cls, lv: Liveness, generation_id: int | None) -> RunActivity:
        return cls(lv.run_id, lv.query_id, lv.state, lv.last_seen, lv.bound, lv.why, generation_id, lv.inferred,
                   lv.follows, lv.heartbeat)


def facts(row: Any) -> RunFacts:
    """A ``runs`` row (with the columns of ``_open_runs_stmt``) as the rule's input."""
    return RunFacts(row.run_id, row.query_id, row.started_at, row.terminated_at, row.last_heartbeat_at,
                    row.max_batch_ms, row.max_gap_ms, row.beat_at, row.beat_every_ms)


def run_is_active(rows: Iterable[Any], run_id: str | None = None, *, now: datetime,
                  timeout: timedelta | None = None) -> bool:
    """Whether any of ``rows`` (runs of one query; or only ``run_id``) counts as active at ``now``."""
    lives = assess_runs([facts(r) for r in rows], now=now, bounds=bounds(timeout))
    return any(lv.state == "active" for lv in lives if run_id is None or lv.run_id == run_id)


def _columns() -> tuple[Any, ...]:
    return (runs.c.pipeline, runs.c.consumer_group, runs.c.run_id, runs.c.query_id, runs.c.started_at,
            runs.c.terminated_at, runs.c.last_heartbeat_at, runs.c.max_batch_ms, runs.c.max_gap_ms,
            runs.c.beat_at, runs.c.beat_every_ms, runs.c.generation_id)


@cache
def _open_runs_stmt() -> Select[Any]:
    # Built once (the pipelines list asks on every request); .where() on it makes a new statement.
    # Open: never ended, or (a sink's or watcher's run, which a later run of the query reuses) a batch
    # recorded after its end.
    return select(*_columns()).where(or_(
        runs.c.terminated_at.is_(None),
        and_(runs.c.last_heartbeat_at > runs.c.terminated_at,
             or_(runs.c.run_id.like("sink:%"), runs.c.run_id.like("checkpoint:%"))),
    )).order_by(runs.c.started_at)


def open_runs(
    conn: Connection, pipeline: str | None = None, consumer_group: str | None = None, *,
    now: datetime | None = None, timeout: timedelta | None = None,
) -> dict[tuple[str, str], list[RunActivity]]:
    """Every open run (of one pipeline and group, or all), assessed, oldest first."""
    at = now or datetime.now(timezone.utc)
    limits = bounds(timeout)
    stmt = _open_runs_stmt()
    if pipeline is not None:
        stmt = stmt.where(runs.c.pipeline == pipeline, runs.c.consumer_group == (consumer_group or pipeline))
    rows = conn.execute(stmt).all()
    open_ids = {r.run_id for r in rows}
    # A sink's or watcher's run follows the listener's runs of its query, ended ones included.
    inferred_queries = sorted({r.query_id for r in rows if facts(r).inferred})
    extra = conn.execute(select(*_columns()).where(runs.c.query_id.in_(inferred_queries))).all() \
        if inferred_queries else []
    by_query: dict[str, list[Any]] = {}
    for r in [*rows, *(x for x in extra if x.run_id not in open_ids)]:
        by_query.setdefault(r.query_id, []).append(r)
    lives: dict[str, Liveness] = {}
    for group_rows in by_query.values():
        for lv in assess_runs([facts(r) for r in group_rows], now=at, bounds=limits):
            lives[lv.run_id] = lv
    out: dict[tuple[str, str], list[RunActivity]] = {}
    for r in rows:
        lv = lives[r.run_id]
        if lv.state != "terminated":
            out.setdefault((r.pipeline, r.consumer_group), []).append(RunActivity.of(lv, r.generation_id))
    return out


def last_ends(conn: Connection, pipeline: str | None = None,
              consumer_group: str | None = None) -> dict[tuple[str, str], tuple[str, datetime]]:
    """(run id, time) of the most recent recorded termination per pipeline and group: ``stopped``'s evidence."""
    newest = select(runs.c.pipeline, runs.c.consumer_group, func.max(runs.c.terminated_at).label("at"))
    if pipeline is not None:
        newest = newest.where(runs.c.pipeline == pipeline, runs.c.consumer_group == (consumer_group or pipeline))
    sub = newest.where(runs.c.terminated_at.is_not(None)).group_by(runs.c.pipeline, runs.c.consumer_group).subquery()
    stmt = select(runs.c.pipeline, runs.c.consumer_group, runs.c.run_id, runs.c.terminated_at).join(
        sub, and_(sub.c.pipeline == runs.c.pipeline, sub.c.consumer_group == runs.c.consumer_group,
                  sub.c.at == runs.c.terminated_at)).order_by(runs.c.started_at.desc(), runs.c.run_id)
    out: dict[tuple[str, str], tuple[str, datetime]] = {}
    for r in conn.execute(stmt):
        # Runs ended with the query share its end: the newest listener run is the one Spark reported,
        # the sink's record and older crashed runs are its echo.
        key = (r.pipeline, r.consumer_group)
        if key not in out or out[key][0].startswith(("sink:", "checkpoint:")):
            out[key] = (r.run_id, r.terminated_at)
    return out


def verdict(acts: Iterable[RunActivity], last_end: tuple[str, datetime] | None, *,
            now: datetime | None = None) -> PipelineVerdict:
    """The pipeline's state and evidence from its open runs (``open_runs``) and last end (``last_ends``)."""
    lives = [Liveness(a.run_id, a.query_id, a.state, a.last_seen, a.timeout, a.why, a.inferred, a.follows,
                      a.heartbeat) for a in acts]
    return pipeline_verdict(lives, now=now or datetime.now(timezone.utc), last_end=last_end)
