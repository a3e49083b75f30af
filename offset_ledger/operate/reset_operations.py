"""Resets over the ledger and the cluster: list them, plan one (a dry run with its cost), carry one out.

Verbs over the context ``operate.operations.Operations``: ``reset(ops, "orders", request, actor=...)``."""

from __future__ import annotations

from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.errors import (
    InvalidInput,
    UnknownTopic,
)
from offset_ledger.ledger import queries
from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.ledger.reset_store import record_reset
from offset_ledger.operate.answers import (
    ResetOutcome,
    audited_parameters,
    audited_partition_dict,
    iso_utc,
)
from offset_ledger.operate.inputs import (
    check_limit,
    check_name,
    check_reason,
    check_topic,
)
from offset_ledger.operate.known import require_topics
from offset_ledger.operate.move_cost import reset_cost
from offset_ledger.operate.operations import Operations, resolve_group
from offset_ledger.rules.model import Position
from offset_ledger.rules.resets import ResetPlan, ResetRequest
from offset_ledger.rules.resets import plan_reset as plan_partitions


def resets(ops: Operations, pipeline: str, consumer_group: str | None = None, *, limit: int = 50,
           dry_runs: bool = True) -> tuple[str, list[dict[str, Any]]]:
    """(consumer group, the audit list of resets, newest first; ``dry_runs=False``: executed ones only)."""
    group, rows, _more = resets_page(ops, pipeline, consumer_group, limit=limit, dry_runs=dry_runs)
    return group, rows


def resets_page(ops: Operations, pipeline: str, consumer_group: str | None = None, *,
                limit: int = 50, dry_runs: bool = True) -> tuple[str, list[dict[str, Any]], bool]:
    """(consumer group, the newest ``limit`` resets, whether older ones exist): ``limit`` is any page
    size (1..MAX_LIMIT), the one row more that tells "there is more" is read here."""
    check_limit(limit)
    with ops.reading() as conn:
        group = resolve_group(conn, pipeline, consumer_group)
        rows = queries.reset_history(conn, pipeline, group, limit=limit + 1, dry_runs=dry_runs)
    more = len(rows) > limit
    return group, [{
        "resetId": r["id"], "mode": r["mode"], "actor": r["actor"], "reason": r["reason"],
        "dryRun": bool(r["dry_run"]), "forced": bool(r["forced"]), "status": r["status"],
        "createdAt": iso_utc(r["created_at"]), "consumedAt": iso_utc(r["consumed_at"]),
        "consumedByGeneration": r["consumed_by_generation"], "parameters": audited_parameters(r["parameters"]),
        "partitions": [audited_partition_dict(p) for p in r["partitions"]],
    } for r in rows[:limit]], more


def plan_reset(
    ops: Operations, pipeline: str, request: ResetRequest, consumer_group: str | None = None,
) -> tuple[str, ResetPlan]:
    """(consumer group, the plan) without writing anything."""
    _check_reset_names(request)
    with ops.reading() as conn:
        group = resolve_group(conn, pipeline, consumer_group)
        require_topics(conn, pipeline, group, request.scope or ())
        positions = queries.current_positions(conn, pipeline, group)
    return group, _plan_against_cluster(ops, pipeline, request, positions)




def _check_reset_names(request: ResetRequest) -> None:
    for topic in (request.scope or {}):
        check_topic(topic)
    for tp in (request.offsets or {}):
        check_topic(tp.topic)


def _plan_against_cluster(ops: Operations, pipeline: str, request: ResetRequest, positions: list[Position]) -> ResetPlan:
    """The plan for ``positions`` against the cluster as it is now (pure planning + Kafka reads)."""
    topics = request.topics([p.topic for p in positions])
    if not topics:
        raise InvalidInput(f"pipeline {pipeline!r} has no positions; name the topics to reset")
    seen = ops.kafka.snapshot(topics)  # partitions and watermarks from one look at the cluster
    missing = [t for t in topics if t not in seen.partitions]
    if request.scope or request.mode == "offsets":
        if missing:
            raise UnknownTopic(missing[0])
    elif missing:
        # Unscoped: a topic deleted since the last batch is left out (the restart drops it too).
        if len(missing) == len(topics):
            raise UnknownTopic(topics[0])
        positions = [p for p in positions if p.topic in seen.partitions]
    marks = seen.watermarks
    times = None
    if request.mode == "timestamp" and request.timestamp_ms is not None:
        times = ops.kafka.offsets_for_time(sorted(marks), request.timestamp_ms)
    return plan_partitions(request, positions, marks, times)


def reset(
    ops: Operations, pipeline: str, request: ResetRequest, *, actor: str, reason: str | None = None,
    dry_run: bool = True, force: bool = False, consumer_group: str | None = None,
) -> ResetOutcome:
    """Plan the reset, audit it, and unless a dry run write the pending positions (409 rules apply).

    The plan is made inside the transaction that writes it, under the pipeline lock, from the
    positions as they are then: concurrent resets apply one after the other, each audited
    with the position it actually replaced.
    """
    check_name("actor", actor)
    check_reason(reason, dry_run=dry_run)
    _check_reset_names(request)
    with ops.reading() as conn:
        group = resolve_group(conn, pipeline, consumer_group)
        require_topics(conn, pipeline, group, request.scope or ())  # a typo is not a new topic
    try:
        plan, stored = record_reset(
            ops.engine, lambda positions: _plan_against_cluster(ops, pipeline, request, positions),
            pipeline=pipeline, consumer_group=group, actor=actor, reason=reason, dry_run=dry_run,
            force=force)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "recording the reset") from exc

    cost = reset_cost(ops.kafka, plan) if plan.partitions else None
    return ResetOutcome(pipeline, group, plan, stored, dry_run, actor, reason, cost)
