"""What the operations answer: plain frozen values the REST API, the CLI and /metrics render, and the
one writer of each kind of answer's JSON names (camelCase keys, ISO 8601 times).

The values of ``rules/``, ``ledger/`` and ``kafka/`` carry no JSON names of their own: what a face
shows of a finding, a move's cost, a run, a failover's partition or a mirror's decision is written
here, once (``finding_answer``, ``move_cost_answer``, ...); the verbs' outcomes built from them are
written by ``operate.action_answers``. Each ``to_dict`` below is the JSON shape the API returns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: a read command does not pay for the reset and cost modules
    from offset_ledger.errors import OffsetLedgerError
    from offset_ledger.kafka.mirror import MirrorDecision, SyncResult
    from offset_ledger.ledger.activity import RunActivity
    from offset_ledger.ledger.reset_store import StoredReset
    from offset_ledger.rules.failover import FailoverPartition, FailoverProblem
    from offset_ledger.rules.model import Finding, TopicPartition, Watermarks
    from offset_ledger.rules.move_cost import MoveCost, PartitionCost
    from offset_ledger.rules.resets import PartitionReset, ResetPlan
    from offset_ledger.rules.retention import Headroom
    from offset_ledger.rules.verify import BatchRef, Reason


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
            "runs": [run_answer(r) for r in self.runs],
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
                "committedNextOffset": self.committed_offset, "drift": self.drift, "status": self.status,
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
            "cost": None if self.cost is None else move_cost_answer(self.cost),
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


def topic_answer(topic: str, marks: Mapping[TopicPartition, Watermarks]) -> dict[str, Any]:
    """A topic's partitions with their log bounds, named by convention: ``logEndOffset`` is the next
    offset Kafka writes (the lag answers' name for it), never a record's."""
    return {"name": topic, "partitions": {
        str(tp.partition): {"logStartOffset": m.log_start_offset, "logEndOffset": m.log_end_offset}
        for tp, m in sorted(marks.items())}}


def legacy_topic_answer(topic: str, marks: Mapping[TopicPartition, Watermarks]) -> dict[str, Any]:
    """The legacy ``/v1/getTopicDetails`` answer, pinned as the tool it replaces wrote it: ``firstOffset``
    the log-start, ``lastOffset`` the log-end (the next offset to be written, despite the name)."""
    return {"name": topic, "partitions": {
        str(tp.partition): {"firstOffset": m.log_start_offset, "lastOffset": m.log_end_offset}
        for tp, m in sorted(marks.items())}}


def run_answer(r: RunActivity) -> dict[str, Any]:
    """One unterminated run, its state and why (a pipeline's ``runs``)."""
    return {"runId": r.run_id, "queryId": r.query_id, "state": r.state,
            "lastSeen": iso_utc(r.last_seen), "timeoutSeconds": int(r.timeout.total_seconds()),
            "why": r.why, "inferred": r.inferred, "heartbeat": r.heartbeat}


def finding_answer(f: Finding) -> dict[str, Any]:
    """A finding a verb made (a restart's, a failover's) as every face names it."""
    return {"kind": f.kind, "message": f.message, "topic": f.topic, "partition": f.partition,
            "details": details_answer(f.details)}


def details_answer(details: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A finding's details under the answer's camelCase names (``log_start_offset`` -> ``logStartOffset``).

    The ledger stores them as written (``findings.details``, snake_case: the SQL views and
    ``Finding.details`` keep those names). Its field names are renamed, and those of the records in
    its lists (a data_loss finding's ``lost`` entries); a map under a field is data keyed by a
    topic, a sink or a partition (``topic_map``, ``reaches``) and is kept as it is.
    """
    if details is None:
        return None
    return {_camel(k): _records_camel(v) for k, v in details.items()}


def error_answer(exc: OffsetLedgerError) -> dict[str, Any]:
    """An error as every face writes it (the API's error body, the CLI's ``-f json`` on a failure):
    ``{"error": <class name>, "message": ..., **details}``, the details under the answers' camelCase
    names by the rule of ``details_answer`` (``log_start_offset`` -> ``logStartOffset``, in the records
    of a list too; a map under a field is data and kept). The exception keeps its Python names
    (``exc.details``): this is only how the faces write them."""
    return {"error": type(exc).__name__, "message": exc.message, **(details_answer(exc.details) or {})}


def _records_camel(value: Any) -> Any:
    # A tuple too: an error's details are Python values (a finding's come back from JSON as lists).
    if isinstance(value, (list, tuple)):
        return [{_camel(k): _records_camel(v) for k, v in item.items()} if isinstance(item, Mapping)
                else _records_camel(item) for item in value]
    return value


def ms_iso(ms: int | None) -> str | None:
    """An epoch-milliseconds record time in the API's time format."""
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat()


def ms_seconds(ms: int | None) -> float | None:
    return None if ms is None else round(ms / 1000, 3)


def partition_cost_answer(p: PartitionCost) -> dict[str, Any]:
    """One partition of a move's cost: both ends as next offsets, the records between, their span."""
    return {
        "topic": p.tp.topic, "partition": p.tp.partition, "direction": p.direction,
        "fromNextOffset": p.from_next, "toNextOffset": p.to_next, "records": p.records,
        "approxBytes": p.approx_bytes, "spanSeconds": ms_seconds(p.span_ms),
        "firstRecordTime": ms_iso(p.first_timestamp_ms), "lastRecordTime": ms_iso(p.last_timestamp_ms),
    }


def move_cost_answer(cost: MoveCost) -> dict[str, Any]:
    """What a move re-reads and skips, in total and per moving partition."""
    out: dict[str, Any] = {}
    for direction, records, size in (("reread", cost.records_reread, cost.bytes_reread),
                                     ("skip", cost.records_skipped, cost.bytes_skipped)):
        first, last = cost.span(direction)  # type: ignore[arg-type]
        out[direction] = {"records": records, "approxBytes": size,
                          "firstRecordTime": ms_iso(first), "lastRecordTime": ms_iso(last),
                          "spanSeconds": ms_seconds(None if first is None or last is None else last - first)}
    out["complete"] = cost.complete
    out["partitions"] = [partition_cost_answer(p) for p in cost.partitions if p.direction != "none"]
    return out


def failover_partition_answer(p: FailoverPartition) -> dict[str, Any]:
    """One partition of a failover plan: where the ledger was, what MM2 translated, where the backup starts."""
    return {"sourceTopic": p.source_topic, "targetTopic": p.target_topic, "partition": p.partition,
            "status": p.status, "ledgerNextOffset": p.ledger_next_offset,
            "checkpointUpstreamOffset": p.checkpoint_upstream_offset,
            "startNextOffset": p.start_next_offset, "behindCheckpoint": p.behind_checkpoint,
            "rereadMax": p.reread_max, "rereadFromMs": p.reread_from_ms, "rereadUntilMs": p.reread_until_ms}


def failover_problem_answer(p: FailoverProblem) -> dict[str, Any]:
    """A partition a failover cannot start by MM2's translation, and why."""
    return {"sourceTopic": p.source_topic, "targetTopic": p.target_topic, "partition": p.partition,
            "reason": p.reason, "detail": p.detail}


def reason_answer(r: Reason) -> dict[str, Any]:
    """Why a verify stretch is accounted for: a reset or a finding, with its id."""
    return {"kind": r.kind, "id": r.id, "detail": r.detail}


def batch_ref_answer(ref: BatchRef, generation: int | None) -> dict[str, Any]:
    """A batch bordering or reading a verify stretch, with the checkpoint generation its query ran in."""
    return {"queryId": ref.query_id, "batchId": ref.batch_id, "generation": generation}


def mirror_decision_answer(d: MirrorDecision) -> dict[str, Any]:
    """What the group mirror does with one partition."""
    # Both are next offsets (a Kafka commit is the next offset to consume): the names say so.
    return {"topic": d.tp.topic, "partition": d.tp.partition, "ledgerNextOffset": d.ledger_offset,
            "committedNextOffset": d.committed_offset, "action": d.action}


def sync_answer(r: SyncResult) -> dict[str, Any]:
    """One sync of a Kafka group to the ledger's positions."""
    return {"pipeline": r.pipeline, "consumerGroup": r.consumer_group, "epoch": r.epoch,
            "committed": r.committed, "partitions": [mirror_decision_answer(d) for d in r.decisions]}


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
