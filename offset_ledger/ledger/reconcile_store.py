"""What the ledger already recorded, as a reconciling pass asks it: a checkpoint's or a sink target's.

``capture.reconcile`` compares a checkpoint's commit log with the batches, runs and prune islands
recorded here; a restart asks whether a query ran on the current generation; the sinks' reconcile
(and their commits) ask whether the ledger knows a run, and how far it has a sink's commits.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from offset_ledger.ledger.tables import batches, pruned_ranges, runs, sink_batches


@dataclass(frozen=True)
class RecordedBatches:
    """The batches the ledger holds of one query, as far as a checkpoint still holds them."""

    first_batch_id: int | None
    last_batch_id: int | None
    #: the batch ids recorded from ``since_batch_id`` on
    recorded: frozenset[int]
    #: (from_batch_id, until_batch_id) of the prune islands reaching ``since_batch_id``: pruned, not missed
    pruned: tuple[tuple[int, int], ...]
    #: the ledger knows the run the pass records under
    run_known: bool


def query_ran(conn: Connection, pipeline: str, consumer_group: str, query_id: str) -> bool:
    """Whether the ledger has a run of ``query_id`` for the pipeline and group."""
    return conn.execute(
        select(runs.c.run_id).where(runs.c.pipeline == pipeline, runs.c.consumer_group == consumer_group,
                                    runs.c.query_id == query_id).limit(1)
    ).first() is not None


def run_recorded(conn: Connection, run_id: str) -> bool:
    """Whether the ledger knows run ``run_id`` (else a record of its batches starts with the run)."""
    return conn.execute(select(runs.c.run_id).where(runs.c.run_id == run_id)).first() is not None


def recorded_batches(conn: Connection, query_id: str, since_batch_id: int, run_id: str) -> RecordedBatches:
    """The batches of ``query_id`` the ledger holds: its first and last, the ids from ``since_batch_id`` on
    (a long-running query has many more; only those the checkpoint still holds matter), the prune islands
    reaching that far, and whether it knows ``run_id``."""
    first_recorded, last_recorded = conn.execute(
        select(func.min(batches.c.batch_id), func.max(batches.c.batch_id))
        .where(batches.c.query_id == query_id)).one()
    recorded = frozenset(conn.execute(select(batches.c.batch_id).where(
        batches.c.query_id == query_id, batches.c.batch_id >= since_batch_id)).scalars())
    pruned = tuple((r.from_batch_id, r.until_batch_id) for r in conn.execute(
        select(pruned_ranges.c.from_batch_id, pruned_ranges.c.until_batch_id).distinct().where(
            pruned_ranges.c.query_id == query_id, pruned_ranges.c.until_batch_id >= since_batch_id)))
    return RecordedBatches(first_recorded, last_recorded, recorded, pruned, run_recorded(conn, run_id))


def generation_has_sink_commits(conn: Connection, generation_id: int) -> bool:
    """Whether a sink committed a batch of generation ``generation_id`` (then a query ran on it)."""
    return conn.execute(
        select(sink_batches.c.id).where(sink_batches.c.generation_id == generation_id).limit(1)
    ).first() is not None


def sink_sequence_and_version(conn: Connection, sink: str) -> tuple[int, int]:
    """(the highest sequence the ledger recorded for ``sink``, 0: none; its highest table version, -1: none)."""
    known, last_version = conn.execute(
        select(func.coalesce(func.max(sink_batches.c.sequence), 0),
               func.coalesce(func.max(sink_batches.c.table_version), -1))
        .where(sink_batches.c.sink == sink)).one()
    return int(known), int(last_version)
