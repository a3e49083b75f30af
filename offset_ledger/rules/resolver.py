"""Pure restart planning: ledger positions + broker watermarks + policies -> a complete startingOffsets.

No I/O here: the restart helper (``offset_ledger.operate.restart``) and the CLI feed this module what
they read from the ledger and the Kafka adapter. The rules match Spark's Kafka source, which
requires ``startingOffsets`` to name *exactly* the partitions it is assigned:

- a ledger position within ``[log_start_offset, log_end_offset]`` is used as is;
- a current partition the ledger does not know (added while stopped) starts at ``-2`` (earliest),
  as Spark itself reads partitions it discovers;
- a ledger partition (or whole topic) no longer on the cluster is dropped, with a finding;
- a position below log-start (retention removed records) or above log-end (the topic was deleted
  and re-created, or truncated) follows ``on_data_loss``: ``"fail"`` raises ``DataLossError`` naming
  every such partition; ``"earliest"`` clamps to the partition's log-start offset and records a
  finding. Above log-end we clamp to log-start, not log-end: offsets of a re-created log are
  unrelated to the old ones, so every record now in it is one the pipeline has never read;
- with no ledger position for any requested topic, ``first_run`` decides (see ``parse_first_run``);
  "latest" (also a timestamp with no record that new, and an explicit ``-1``) is planned as the
  log-end offset seen now, the number the generation's baseline records, so Spark starts exactly
  there rather than at a later "latest" of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from offset_ledger.errors import (
    DataLossError,
    InvalidRestartOptions,
    UnknownPartition,
    UnknownTopic,
)
from offset_ledger.rules.locations import same_root
from offset_ledger.rules.model import (
    EARLIEST,
    LATEST,
    Finding,
    OnDataLoss,
    Position,
    StartingOffsets,
    TopicPartition,
    Watermarks,
)
from offset_ledger.rules.plan import RestartPlan
from offset_ledger.rules.restart_options import FirstRun, FirstRunOffsets, FirstRunTimestamp, parse_on_data_loss

# ---------------------------------------------------------------------------------------------
# Policy parsing (user input: every failure is an InvalidRestartOptions, nothing else)


# ---------------------------------------------------------------------------------------------
# The resolver


@dataclass(frozen=True)
class TopicIncarnation:
    """A topic re-created since the ledger last saw it: the Kafka topic ids (KIP-516) differ."""

    topic: str
    ledger_topic_id: str
    cluster_topic_id: str
    last_log_end: Mapping[int, int]  # partition -> the old incarnation's log-end when last seen


@dataclass(frozen=True)
class _LossRecord:
    tp: TopicPartition
    next_offset: int
    watermarks: Watermarks
    source: str  # "ledger" | "first_run"
    recreated: TopicIncarnation | None = None

    @property
    def kind(self) -> str:
        if self.recreated is not None:
            return "topic_recreated"
        return "below_log_start" if self.next_offset < self.watermarks.log_start_offset else "above_log_end"

    def details(self) -> dict[str, Any]:
        """The loss as a data_loss finding and DataLossError record it (stored: its snake_case names are data)."""
        w = self.watermarks
        d: dict[str, Any] = {
            "topic": self.tp.topic, "partition": self.tp.partition, "kind": self.kind,
            "next_offset": self.next_offset, "log_start_offset": w.log_start_offset,
            "log_end_offset": w.log_end_offset, "source": self.source,
        }
        if self.recreated is not None:
            old_end = self.recreated.last_log_end.get(self.tp.partition)
            d["old_topic_id"] = self.recreated.ledger_topic_id
            d["new_topic_id"] = self.recreated.cluster_topic_id
            # The old log is gone: what it held past the position is known only as of when the
            # ledger last saw its log-end (a restart or reset), so this is a lower bound.
            d["records_never_read_at_least"] = None if old_end is None else max(0, old_end - self.next_offset)
            d["records_lost"] = None
        elif self.kind == "below_log_start":
            d["records_lost"] = w.log_start_offset - self.next_offset
        else:
            # The old log's records past log-end are unknowable; say how far ahead the position is.
            d["records_lost"] = None
            d["offsets_beyond_log_end"] = self.next_offset - w.log_end_offset
        return d

    def describe(self) -> str:
        w = self.watermarks
        where = f"{self.tp.topic}/{self.tp.partition}"
        if self.recreated is not None:
            old_end = self.recreated.last_log_end.get(self.tp.partition)
            never = ("" if old_end is None or old_end <= self.next_offset
                     else f", at least {old_end - self.next_offset} records of the old topic never read")
            return (f"{where}: the topic was re-created (topic id {self.recreated.ledger_topic_id} -> "
                    f"{self.recreated.cluster_topic_id}); next offset {self.next_offset} belongs to the deleted "
                    f"topic{never}")
        if self.kind == "below_log_start":
            return (f"{where}: next offset {self.next_offset} is below log-start {w.log_start_offset}, "
                    f"{w.log_start_offset - self.next_offset} records lost to retention")
        return (f"{where}: next offset {self.next_offset} is {self.next_offset - w.log_end_offset} beyond "
                f"log-end {w.log_end_offset} (topic re-created or truncated)")


def is_first_run(positions: Sequence[Position], topics: Sequence[str]) -> bool:
    """True when the ledger has no position for any requested topic (the first_run policy applies)."""
    wanted = set(topics)
    return not any(p.topic in wanted for p in positions)


def resolve(
    pipeline: str,
    topics: Sequence[str],
    positions: Sequence[Position],
    watermarks: Mapping[TopicPartition, Watermarks],
    *,
    first_run: FirstRun = "earliest",
    on_data_loss: OnDataLoss = "fail",
    offsets_for_time: Mapping[TopicPartition, int | None] | None = None,
    recreated: Sequence[TopicIncarnation] = (),
) -> RestartPlan:
    """Plan ``startingOffsets`` for every current partition of ``topics`` (read-only plan, no checkpoint).

    ``watermarks`` holds every current partition of the requested topics that exist; a requested
    topic absent from it does not exist on the cluster. ``offsets_for_time`` is required for a
    timestamp ``first_run`` (``None`` per partition: no record that new). Raises ``DataLossError``
    when ``on_data_loss="fail"`` and a position lies outside its partition's log, ``UnknownTopic``
    for a requested topic that neither exists nor has ledger positions, and
    ``InvalidRestartOptions``/``UnknownPartition`` for explicit first-run offsets naming what is not there.
    ``recreated`` names topics whose Kafka topic id changed: their ledger offsets belong to a dead
    incarnation and are never compared with the new log; ``on_data_loss`` applies to each partition.
    """
    parse_on_data_loss(on_data_loss)
    wanted = list(dict.fromkeys(topics))
    wanted_set = set(wanted)
    # Nested {topic: {partition: ...}} dicts rather than TopicPartition keys: hashing 10,000
    # dataclasses several times each dominated the cost of a large resolve.
    logs: dict[str, dict[int, Watermarks]] = {}
    for tp, w in watermarks.items():
        if tp.topic in wanted_set:
            logs.setdefault(tp.topic, {})[tp.partition] = w
    current: dict[str, list[int]] = {t: sorted(logs[t]) for t in sorted(logs)}
    ledger: dict[str, dict[int, int]] = {}
    for position in positions:
        if position.topic in wanted_set:
            ledger.setdefault(position.topic, {})[position.partition] = position.next_offset
    findings: list[Finding] = []

    for topic in wanted:
        if topic not in current and topic not in ledger:
            raise UnknownTopic(topic)

    # Positions of partitions no longer on the cluster: Spark would refuse them, so drop them.
    for topic in sorted(ledger):
        topic_log = logs.get(topic, {})
        for partition in sorted(ledger[topic]):
            if partition not in topic_log:
                gone_topic = topic not in logs
                next_offset = ledger[topic][partition]
                findings.append(Finding(
                    "removed_partition",
                    f"{topic}/{partition} is in the ledger (next offset {next_offset}) but "
                    + ("the topic no longer exists" if gone_topic else "the partition no longer exists")
                    + "; dropped",
                    topic, partition, {"next_offset": next_offset, "topic_deleted": gone_topic}))

    if not ledger:
        chosen, source = _first_run_offsets(current, logs, first_run, offsets_for_time, findings)
    else:
        chosen, source = {}, "ledger"
        for topic, parts in current.items():
            known = ledger.get(topic, {})
            out = chosen[topic] = {}
            for partition in parts:
                if partition in known:
                    out[partition] = known[partition]
                else:
                    out[partition] = EARLIEST
                    w = logs[topic][partition]
                    findings.append(Finding(
                        "new_partition", f"{topic}/{partition} is not in the ledger; reading it from earliest",
                        topic, partition, {"log_start_offset": w.log_start_offset,
                                           "log_end_offset": w.log_end_offset}))

    dead = {r.topic: r for r in recreated if r.topic in ledger}
    losses = [
        _LossRecord(TopicPartition(topic, partition), off, logs[topic][partition], source,
                    dead.get(topic) if partition in ledger.get(topic, {}) else None)
        for topic, parts in chosen.items()
        for partition, off in parts.items()
        if off not in (EARLIEST, LATEST)
        and ((topic in dead and partition in ledger.get(topic, {}))
             or not (logs[topic][partition].log_start_offset <= off <= logs[topic][partition].log_end_offset))
    ]
    if losses and on_data_loss == "fail":
        raise DataLossError(
            f"pipeline {pipeline!r}: {len(losses)} partition(s) cannot resume where the ledger says "
            f"(on_data_loss='fail'): " + "; ".join(loss.describe() for loss in losses),
            lost=[loss.details() for loss in losses])
    for loss in losses:
        clamped = loss.watermarks.log_start_offset
        chosen[loss.tp.topic][loss.tp.partition] = clamped
        findings.append(Finding(
            "data_loss", f"{loss.describe()}; resuming at log-start {clamped}",
            loss.tp.topic, loss.tp.partition, {**loss.details(), "resumed_at": clamped}))

    # ``chosen`` follows ``current``: topics and partitions already sorted.
    starting: StartingOffsets = {
        topic: {str(partition): off for partition, off in parts.items()} for topic, parts in chosen.items()
    }
    return RestartPlan(pipeline=pipeline, starting_offsets=starting, checkpoint_location=None,
                       findings=tuple(findings), fresh_checkpoint=True)


def _first_run_offsets(
    current: Mapping[str, Sequence[int]],
    logs: Mapping[str, Mapping[int, Watermarks]],
    first_run: FirstRun,
    offsets_for_time: Mapping[TopicPartition, int | None] | None,
    findings: list[Finding],
) -> tuple[dict[str, dict[int, int]], str]:
    total = sum(len(parts) for parts in current.values())
    if first_run == "earliest":
        # -2 stays a sentinel: retention may raise log-start before Spark starts, and a number
        # below it would then be data loss; Spark resolves -2 when it starts.
        findings.append(Finding("first_run", "no ledger positions; first run from earliest",
                                details={"mode": first_run, "partitions": total}))
        return {t: {p: EARLIEST for p in parts} for t, parts in current.items()}, "first_run"
    if first_run == "latest":
        findings.append(Finding("first_run", "no ledger positions; first run from latest (the log-end offsets "
                                "seen now, so records produced before Spark starts are read, not skipped)",
                                details={"mode": first_run, "partitions": total}))
        return {t: {p: _log_end(logs, t, p) for p in parts} for t, parts in current.items()}, "first_run"
    if isinstance(first_run, FirstRunTimestamp):
        if offsets_for_time is None:
            raise ValueError("a timestamp first_run needs offsets_for_time")
        chosen: dict[str, dict[int, int]] = {}
        none_that_new: list[str] = []
        for topic, parts in current.items():
            out = chosen[topic] = {}
            for partition in parts:
                found = offsets_for_time.get(TopicPartition(topic, partition))
                # No record at or after the timestamp: every stored record is older, so start after
                # them (at the log-end seen now), like Spark's startingOffsetsByTimestampStrategy=latest.
                out[partition] = _log_end(logs, topic, partition) if found is None else found
                if found is None:
                    none_that_new.append(f"{topic}/{partition}")
        findings.append(Finding(
            "first_run",
            f"no ledger positions; first run from timestamp {first_run.timestamp_ms} ms"
            + (f"; no record that new in {', '.join(none_that_new)} (from the log-end offsets seen now)"
               if none_that_new else ""),
            details={"mode": "timestamp", "timestamp_ms": first_run.timestamp_ms,
                     "latest_partitions": none_that_new, "partitions": total}))
        return chosen, "first_run"
    if isinstance(first_run, FirstRunOffsets):
        explicit = first_run.offsets
        for topic, named in explicit.items():
            if topic not in current:
                raise InvalidRestartOptions(
                    f"first_run names topic {topic!r}, which is not a requested topic on the cluster",
                    option="first_run", topic=topic)
            for partition in named:
                if partition not in logs[topic]:
                    raise UnknownPartition(topic, partition, sorted(logs[topic]))
        chosen = {}
        defaulted: list[str] = []
        for topic, parts in current.items():
            given_parts = explicit.get(topic, {})
            out = chosen[topic] = {}
            for partition in parts:
                given = given_parts.get(partition)
                # A partition the caller did not name is read from earliest: nothing skipped silently.
                out[partition] = (EARLIEST if given is None else _log_end(logs, topic, partition) if given == LATEST
                                  else given)
                if given is None:
                    defaulted.append(f"{topic}/{partition}")
        findings.append(Finding(
            "first_run",
            "no ledger positions; first run from explicit offsets"
            + (f"; not named, from earliest: {', '.join(defaulted)}" if defaulted else ""),
            details={"mode": "offsets", "earliest_partitions": defaulted, "partitions": total}))
        return chosen, "first_run"
    raise InvalidRestartOptions(f"unsupported first_run {first_run!r}", option="first_run")


def _log_end(logs: Mapping[str, Mapping[int, Watermarks]], topic: str, partition: int) -> int:
    """A first run's "latest" as a number: the log-end offset seen now.

    Spark would resolve ``-1`` when it starts, later than this plan; the generation's baseline
    records the log-end seen here, so records produced in between would be skipped by Spark yet
    counted as read by the ledger. Spark accepts an offset equal to the log-end, and log-end only
    grows, so this number is never below log-start when Spark starts (short of records deleted
    up to beyond it, which Spark's failOnDataLoss then reports). The log-end is the high
    watermark: a query reading with ``isolation.level=read_committed`` skips the records of a
    transaction still open now that commits later, where ``-1`` would start at the stable offset.
    """
    return logs[topic][partition].log_end_offset


# ---------------------------------------------------------------------------------------------
# Checkpoint generations: whether the restart may resume the current one

GenerationReason = Literal["first", "reset", "data_loss", "checkpoint_lost", "checkpoint_recreated", "app_version",
                           "checkpoint_root", "requested", "sink_ahead"]


def new_generation_reason(
    *,
    current_app_version: str | None,
    current_checkpoint_root: str | None,
    has_current: bool,
    app_version: str | None,
    checkpoint_root: str,
    pending_resets: bool,
    requested: bool,
    data_loss: bool = False,
    checkpoint_incarnation: str | None = None,
    sink_ahead: bool = False,
) -> GenerationReason | None:
    """Why a fresh checkpoint generation is needed, or None to resume the current one.

    ``app_version=None`` means the caller does not track versions: it never forces a new generation.
    ``checkpoint_incarnation``: the current generation's checkpoint is ``"lost"``, ``"emptied"`` or
    ``"recreated"`` (``rules.incarnation``): Spark would start a new query whose batch ids repeat the
    old one's, so it gets a generation of its own. ``sink_ahead``: the plan was moved past a sink's
    output the positions never counted (``rules.sink_ahead``).
    """
    if not has_current:
        return "first"
    if pending_resets:
        # Spark ignores startingOffsets when a checkpoint exists: a reset needs an empty one.
        return "reset"
    if data_loss:
        # The checkpoint points at offsets the log no longer has (or a dead topic's): the policy's
        # clamped offsets only take effect on an empty checkpoint.
        return "data_loss"
    if checkpoint_incarnation in ("lost", "emptied"):
        return "checkpoint_lost"
    if checkpoint_incarnation == "recreated":
        return "checkpoint_recreated"
    if sink_ahead:
        # A sink's target holds an older generation's output past the positions (``rules.sink_ahead``):
        # the plan starts after it, which only an empty checkpoint takes.
        return "sink_ahead"
    if app_version is not None and app_version != current_app_version:
        return "app_version"
    if not same_root(checkpoint_root, current_checkpoint_root):
        # Compared as locations: "/ck/" and "/ck" (or file:///ck) are one root, and a fresh
        # generation there would throw a stateful job's state away for nothing.
        return "checkpoint_root"
    if requested:
        return "requested"
    return None
