"""What the operations answer: plain frozen values the REST API, the CLI and /metrics render.

Each ``to_dict`` is the JSON shape the API returns (camelCase keys, ISO 8601 times).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: a read command does not pay for the reset and cost modules
    from offset_ledger.ledger.activity import RunActivity
    from offset_ledger.ledger.reset_store import StoredReset
    from offset_ledger.rules.move_cost import MoveCost
    from offset_ledger.rules.resets import PartitionReset, ResetPlan
    from offset_ledger.rules.retention import Headroom


def iso_utc(value: datetime | None) -> str | None:
    """The API's time format: ISO 8601 with its offset (a naive time, as SQLite returns it, is UTC)."""
    if value is None:
        return None
    if value.tzinfo is None:  # SQLite hands back naive datetimes; the ledger writes UTC
        value = value.replace(tzinfo=timezone.utc)
    return value.isoformat()


@dataclass(frozen=True)
class PipelineSummary:
    """One pipeline (and consumer group) as the pipelines list shows it."""

    pipeline: str
    consumer_group: str
    # running | uncertain (no listener: inferred from the last batch) | stale (unterminated runs, none heard
    # from within its bound) | stopped; ``state_reason`` says why with the evidence (offset_ledger.rules.liveness)
    state: str
    active_run_ids: tuple[str, ...]
    partitions: int
    last_batch_time: datetime | None
    last_batch_id: int | None
    lag: int | None  # records behind log-end over all partitions; None when Kafka was not asked/reachable
    runs: tuple[RunActivity, ...] = ()  # every unterminated run, with why it counts as active or stale
    generation: dict[str, Any] | None = None  # the current checkpoint generation, if any
    foreign_run_ids: tuple[str, ...] = ()  # active runs not on the current generation's checkpoint
    status: str | None = None  # OK | LAGGING | STALLED | STOPPED | REWOUND (offset_ledger.rules.status); None: lag unknown
    headroom: Headroom | None = None  # its most severe partition's retention headroom (offset_ledger.rules.retention)
    state_reason: str | None = None  # "last event 12 s ago from run 0374a913 (silence bound 60 s)"
    state_run_id: str | None = None  # the run the state rests on
    last_event_at: datetime | None = None  # that run's last event (or end, when stopped)
    records_lost: int = 0  # records its batches never read, unexplained (issue 41: status ERR)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline, "consumerGroup": self.consumer_group, "state": self.state,
            "stateReason": self.state_reason, "stateRunId": self.state_run_id,
            "lastEventAt": iso_utc(self.last_event_at),
            "activeRunIds": list(self.active_run_ids), "partitions": self.partitions,
            "lastBatchTime": iso_utc(self.last_batch_time), "lastBatchId": self.last_batch_id, "lag": self.lag,
            "runs": [r.to_dict() for r in self.runs],
            "generation": None if self.generation is None else {
                "generation": self.generation["generation"], "appVersion": self.generation["app_version"],
                "checkpointLocation": self.generation["location"]},
            "foreignRunIds": list(self.foreign_run_ids),
            "status": self.status,
            "recordsLost": self.records_lost,
            **_headroom_dict(self.headroom),
        }


@dataclass(frozen=True)
class PartitionLag:
    """A partition's position against its log: lag = log-end minus the next offset to read."""

    topic: str
    partition: int
    next_offset: int | None
    log_start_offset: int | None
    log_end_offset: int | None
    lag_seconds: float | None = None  # age of the record at the position (0 when caught up)
    committed_offset: int | None = None  # the Kafka consumer group's committed offset, if any
    status: str | None = None  # offset_ledger.rules.status
    headroom: Headroom | None = None  # offset_ledger.rules.retention (None: not asked)

    @property
    def lag(self) -> int | None:
        if self.next_offset is None or self.log_end_offset is None:
            return None
        return max(0, self.log_end_offset - self.next_offset)

    @property
    def drift(self) -> int | None:
        """The group's committed offset minus the ledger position (None when the group committed none)."""
        if self.committed_offset is None or self.next_offset is None:
            return None
        return self.committed_offset - self.next_offset

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "nextOffset": self.next_offset,
                "logStartOffset": self.log_start_offset, "logEndOffset": self.log_end_offset, "lag": self.lag,
                "lagSeconds": None if self.lag_seconds is None else round(self.lag_seconds, 3),
                "committedOffset": self.committed_offset, "drift": self.drift, "status": self.status,
                **_headroom_dict(self.headroom)}


def _headroom_dict(h: Headroom | None) -> dict[str, Any]:
    """headroomSeconds (None: no figure), headroomStatus (OK | WARN | ERR | None), headroomBasis (why)."""
    if h is None:
        return {"headroomSeconds": None, "headroomStatus": None, "headroomBasis": None}
    return {"headroomSeconds": None if h.seconds is None else round(h.seconds, 3), "headroomStatus": h.status,
            "headroomBasis": h.basis}


@dataclass(frozen=True)
class HistoryPage:
    """A page of batch history, newest first; ``next_cursor`` is None on the last page."""

    items: tuple[dict[str, Any], ...]
    next_cursor: str | None


@dataclass(frozen=True)
class ResetOutcome:
    """A planned (dry run) or executed reset and its audit id."""

    pipeline: str
    consumer_group: str
    plan: ResetPlan
    stored: StoredReset
    dry_run: bool
    actor: str
    reason: str | None
    #: what the move re-reads or skips (records, about how many bytes, the time span), when Kafka answered
    cost: MoveCost | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "resetId": self.stored.reset_id, "pipeline": self.pipeline, "consumerGroup": self.consumer_group,
            "mode": self.plan.mode, "dryRun": self.dry_run, "status": self.stored.status,
            "actor": self.actor, "reason": self.reason, "createdAt": iso_utc(self.stored.created_at),
            "outOfRangePolicy": self.plan.out_of_range_policy,
            "wouldBeRefused": self.plan.refused,
            "activeRunIds": list(self.stored.active_run_ids),
            "partitions": [partition_reset_dict(p) for p in self.plan.partitions],
            "newPositions": self.plan.new_positions(),
            "cost": None if self.cost is None else self.cost.to_dict(),
        }


def position_answer(row: Mapping[str, Any]) -> dict[str, Any]:
    """One position (a ``queries.position_details`` row) as every face names it; ``placedBy`` says what
    wrote it: a reset, a checkpoint generation's start (no query yet) or a batch."""
    placed_by = ("reset" if row["reset_id"] is not None
                 else "generation" if row.get("generation_id") is not None and row["query_id"] is None
                 else "batch")
    return {"topic": row["topic"], "partition": row["partition"], "nextOffset": row["next_offset"],
            "updatedAt": iso_utc(row["updated_at"]), "placedBy": placed_by, "queryId": row["query_id"],
            "batchId": row["batch_id"], "resetId": row["reset_id"]}


def partition_reset_dict(p: PartitionReset) -> dict[str, Any]:
    """One partition of a reset plan as every face names it (the API's JSON, the CLI's columns, the
    console): a refused partition has no target and moves nothing, whatever it requested."""
    return {
        "topic": p.topic, "partition": p.partition,
        "beforeNextOffset": p.before_next_offset,
        "requestedNextOffset": p.requested_next_offset,
        "targetNextOffset": None if p.refused else p.target_next_offset,
        "logStartOffset": p.log_start_offset, "logEndOffset": p.log_end_offset,
        "recordsReplayed": p.records_replayed, "recordsSkipped": p.records_skipped,
        "outOfRange": p.out_of_range, "clamped": p.clamped, "refused": p.refused,
    }


def audited_parameters(stored: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """An audited reset's request (``ResetRequest.parameters``, stored as written: ``out_of_range``,
    ``shift_by``, ...) under the answer's camelCase names; the maps below a key (topics, partitions) are
    data and kept as they are."""
    if stored is None:
        return None
    return {_camel(k): v for k, v in stored.items()}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def audited_partition_dict(p: Mapping[str, Any]) -> dict[str, Any]:
    """One partition of an audited reset (a ``reset_partitions`` row) in the names of
    ``partition_reset_dict``. The audit stores the requested offset; outside the log it stood in when
    audited it was refused (only a dry run keeps one) and is no target. ``afterNextOffset`` is that
    stored offset under the name scripts read before; ``targetNextOffset`` is the one to read."""
    after, start, end = p["after_next_offset"], p["log_start_offset"], p["log_end_offset"]
    refused = start is not None and end is not None and not start <= after <= end
    return {
        "topic": p["topic"], "partition": p["partition"],
        "beforeNextOffset": p["before_next_offset"], "targetNextOffset": None if refused else after,
        "afterNextOffset": after, "logStartOffset": start, "logEndOffset": end, "refused": refused,
    }


@dataclass(frozen=True)
class MetricsSnapshot:
    """Everything /metrics renders."""

    pipelines: tuple[PipelineSummary, ...]
    partitions: tuple[tuple[str, str, PartitionLag], ...]  # (pipeline, consumer group, lag)
    listeners: tuple[dict[str, Any], ...]
    kafka_up: bool | None  # None: no Kafka configured
    now: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    #: records lost per (pipeline, consumer group, topic, partition), unexplained (issue 41)
    records_lost: tuple[tuple[str, str, str, int, int], ...] = ()
    #: executed resets per (pipeline, consumer group): (pipeline, group, still pending, newest one's time)
    resets: tuple[tuple[str, str, int, datetime | None], ...] = ()
    #: findings recorded per (pipeline, consumer group, kind)
    findings: tuple[tuple[str, str, str, int], ...] = ()
