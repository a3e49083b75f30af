"""Writes resets: the audit rows and, for executed resets, the pending positions, in one transaction.

A reset row's ``status`` is ``dry_run`` for a dry run (audited, positions untouched) and
``pending`` for an executed reset: the positions now carry its ``reset_id`` and the restart helper
applies them through a fresh checkpoint generation, then marks the reset ``consumed``. Several
resets may be pending at once (e.g. one per topic); the positions already reflect all of them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import insert
from sqlalchemy.engine import Engine

from offset_ledger.errors import ActiveRunConflict
from offset_ledger.ledger import position_store
from offset_ledger.ledger.activity import open_runs, verdict
from offset_ledger.ledger.locks import lock_pipeline
from offset_ledger.ledger.position_store import Placed
from offset_ledger.ledger.queries import current_positions
from offset_ledger.ledger.tables import reset_partitions, resets
from offset_ledger.rules.model import Position
from offset_ledger.rules.resets import ResetPlan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredReset:
    """What was written: the reset's id, its status and the active runs seen at the time."""

    reset_id: int
    status: str
    created_at: datetime
    active_run_ids: tuple[str, ...]


def record_reset(
    engine: Engine, planner: Callable[[list[Position]], ResetPlan], *, pipeline: str, consumer_group: str,
    actor: str, reason: str | None, dry_run: bool, force: bool = False, now: datetime | None = None,
) -> tuple[ResetPlan, StoredReset]:
    """Plan the reset from the positions as they are under the pipeline lock, audit it and, unless a
    dry run, move the positions, all in one transaction; refuses while a run is active.

    ``planner`` turns the locked positions into the plan (it may ask Kafka). Raises
    ActiveRunConflict (nothing written) for an executed, unforced reset of a pipeline with an
    active run, and OffsetOutOfRange (nothing written) for an executed plan that must be refused.
    """
    created_at = now or datetime.now(timezone.utc)
    with engine.begin() as conn:
        # Exclusive: other resets, restarts and the recorder's position moves of this pipeline
        # wait until we commit, so the plan's "before" is the value we replace.
        lock_pipeline(conn, pipeline, consumer_group)
        plan = planner(current_positions(conn, pipeline, consumer_group))
        if not dry_run:
            plan.check_executable()
        acts = open_runs(conn, pipeline, consumer_group, now=created_at).get((pipeline, consumer_group), [])
        active = [a.run_id for a in acts if a.state == "active"]
        if active and not dry_run and not force:
            # The same answer and evidence the pipelines list shows (ledger.activity).
            judged = verdict(acts, None, now=created_at)
            raise ActiveRunConflict(pipeline, active, f"{judged.state}: {judged.reason}")
        status = "dry_run" if dry_run else "pending"
        parameters: dict[str, Any] = dict(plan.parameters)
        if active:
            parameters["active_run_ids"] = list(active)
        reset_id = conn.execute(insert(resets).values(
            pipeline=pipeline, consumer_group=consumer_group, mode=plan.mode, parameters=parameters,
            actor=actor, reason=reason, dry_run=dry_run, forced=bool(force),
            created_at=created_at, status=status,
        ).returning(resets.c.id)).scalar_one()
        if plan.partitions:
            conn.execute(insert(reset_partitions), [
                {"reset_id": reset_id, "topic": p.topic, "partition": p.partition,
                 "before_next_offset": p.before_next_offset, "after_next_offset": p.target_next_offset,
                 "log_start_offset": p.log_start_offset, "log_end_offset": p.log_end_offset}
                for p in plan.partitions
            ])
        if not dry_run:
            # The placed positions: pending until a restart applies them (one write per topic, 0024).
            position_store.write(conn, pipeline, consumer_group, {
                (p.topic, p.partition): Placed(p.target_next_offset, created_at, None, None, reset_id)
                for p in plan.partitions}, keep_generation=True)
    log.info("reset %s of %s/%s (%s, %s partitions, actor %s)", reset_id, pipeline, consumer_group,
             status, len(plan.partitions), actor)
    return plan, StoredReset(reset_id, status, created_at, tuple(active))

