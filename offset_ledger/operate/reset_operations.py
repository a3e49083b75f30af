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


class _ClusterView:
    """What a plan needs of the cluster, read once: partitions and watermarks of ``topics``, and the
    offsets for the request's timestamp when it has one."""

    def __init__(self, ops: Operations, request: ResetRequest, topics: list[str]) -> None:
        self.topics = frozenset(topics)
        self.seen = ops.kafka.snapshot(topics)  # partitions and watermarks from one look at the cluster
        self.times = None
        if request.mode == "timestamp" and request.timestamp_ms is not None:
            self.times = ops.kafka.offsets_for_time(sorted(self.seen.watermarks), request.timestamp_ms)


def _plan_topics(pipeline: str, request: ResetRequest, positions: list[Position]) -> list[str]:
    topics = request.topics([p.topic for p in positions])
    if not topics:
        raise InvalidInput(f"pipeline {pipeline!r} has no positions; name the topics to reset")
    return topics


def _plan_against_cluster(ops: Operations, pipeline: str, request: ResetRequest, positions: list[Position],
                          view: _ClusterView | None = None) -> ResetPlan:
    """The plan for ``positions`` against the cluster: ``view`` when it covers their topics (read before
    the pipeline lock was taken), else read now."""
    topics = _plan_topics(pipeline, request, positions)
    if view is None or not view.topics.issuperset(topics):
        view = _ClusterView(ops, request, topics)
    seen = view.seen
    missing = [t for t in topics if t not in seen.partitions]
    if request.scope or request.mode == "offsets":
        if missing:
            raise UnknownTopic(missing[0])
    elif missing:
        # Unscoped: a topic deleted since the last batch is left out (the restart drops it too).
        if len(missing) == len(topics):
            raise UnknownTopic(topics[0])
        positions = [p for p in positions if p.topic in seen.partitions]
    marks = {tp: m for tp, m in seen.watermarks.items() if tp.topic in topics}
    times = None if view.times is None else {tp: t for tp, t in view.times.items() if tp.topic in topics}
    return plan_partitions(request, positions, marks, times)


def reset(
    ops: Operations, pipeline: str, request: ResetRequest, *, actor: str, reason: str | None = None,
    dry_run: bool = True, force: bool = False, consumer_group: str | None = None,
) -> ResetOutcome:
    """Plan the reset, audit it, and unless a dry run write the pending positions (409 rules apply).

    The plan is made inside the transaction that writes it, under the pipeline lock, from the
    positions as they are then (against the cluster as read just before the lock): concurrent resets
    apply one after the other, each audited with the position it actually replaced.
    """
    check_name("actor", actor)
    check_reason(reason, dry_run=dry_run)
    _check_reset_names(request)
    with ops.reading() as conn:
        group = resolve_group(conn, pipeline, consumer_group)
        require_topics(conn, pipeline, group, request.scope or ())  # a typo is not a new topic
        before = queries.current_positions(conn, pipeline, group)
    # The cluster is read before the pipeline lock, which holds the pipeline's recorder and restarts
    # while it is held: a slow or unreachable cluster (a timeout is tens of seconds) must not stall
    # them. Under the lock the plan is made from the positions as they are then, against this view;
    # only a topic it does not cover (the positions gained one in between) is read under the lock.
    view = _ClusterView(ops, request, _plan_topics(pipeline, request, before))
    try:
        plan, stored = record_reset(
            ops.engine, lambda positions: _plan_against_cluster(ops, pipeline, request, positions, view),
            pipeline=pipeline, consumer_group=group, actor=actor, reason=reason, dry_run=dry_run,
            force=force)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "recording the reset") from exc

    cost = reset_cost(ops.kafka, plan) if plan.partitions else None
    return ResetOutcome(pipeline, group, plan, stored, dry_run, actor, reason, cost)
