"""Pure planning of offset resets: positions + watermarks + a request -> per-partition targets.

No I/O here: the caller fetches the pipeline's positions from the ledger and the watermarks (and,
for ``timestamp``, the offsets for that time) from Kafka, and stores the plan through
``offset_ledger.ledger.reset_store``. Every offset is a next offset to read (exclusive end).

Scope: without an explicit scope a reset covers every topic the pipeline has a position on, and
every partition those topics have *now* (so partitions added since the last batch are included).
Partitions that exist in the ledger but no longer on the cluster are left out (the restart helper
drops them with a finding).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from offset_ledger.errors import (
    InvalidInput,
    InvalidOffset,
    OffsetOutOfRange,
    UnknownPartition,
    UnknownTopic,
)
from offset_ledger.rules.model import EARLIEST, LATEST, Position, TopicPartition, Watermarks

ResetMode = Literal["earliest", "latest", "offsets", "timestamp", "shift"]
OutOfRangePolicy = Literal["clamp", "refuse"]
OutOfRangeKind = Literal["below_log_start", "above_log_end"]

RESET_MODES: tuple[str, ...] = ("earliest", "latest", "offsets", "timestamp", "shift")
# Kafka stores offsets as signed 64-bit integers.
MAX_OFFSET = 2**63 - 1
_PARTITION_KEY = re.compile(r"^(0|[1-9][0-9]{0,9})$")


@dataclass(frozen=True)
class ResetRequest:
    """What an operator asked for; ``scope`` maps topic -> partitions (None: all of its partitions)."""

    mode: ResetMode
    scope: Mapping[str, tuple[int, ...] | None] | None = None
    offsets: Mapping[TopicPartition, int] | None = None  # mode "offsets"; -2/-1 allowed
    timestamp_ms: int | None = None                      # mode "timestamp"
    shift_by: int | None = None                          # mode "shift"; negative replays
    out_of_range: OutOfRangePolicy = "refuse"
    # The legacy resetOffsetOfPartitions endpoint requires the body to name every partition.
    require_all_partitions: bool = False

    def topics(self, position_topics: Sequence[str]) -> list[str]:
        """The topics this request touches."""
        if self.mode == "offsets" and self.offsets is not None and not self.scope:
            return sorted({tp.topic for tp in self.offsets})
        if self.scope:
            return sorted(self.scope)
        return sorted(set(position_topics))

    def parameters(self) -> dict[str, Any]:
        """A JSON-ready record of the request for the audit trail."""
        out: dict[str, Any] = {"out_of_range": self.out_of_range}
        if self.scope:
            out["scope"] = {t: (list(p) if p is not None else None) for t, p in sorted(self.scope.items())}
        if self.offsets is not None:
            out["offsets"] = offsets_to_nested({tp: v for tp, v in self.offsets.items()})
        if self.timestamp_ms is not None:
            out["timestamp_ms"] = self.timestamp_ms
            out["timestamp"] = datetime.fromtimestamp(self.timestamp_ms / 1000, tz=timezone.utc).isoformat()
        if self.shift_by is not None:
            out["shift_by"] = self.shift_by
        return out


@dataclass(frozen=True)
class PartitionReset:
    """One partition of a reset plan: where it is, where it goes, and what that costs."""

    topic: str
    partition: int
    before_next_offset: int | None  # None: the pipeline has no position on this partition yet
    requested_next_offset: int      # the target before any clamping (sentinels resolved)
    target_next_offset: int         # what will be written (clamped when the policy is clamp)
    log_start_offset: int
    log_end_offset: int
    out_of_range: OutOfRangeKind | None = None
    clamped: bool = False

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    @property
    def refused(self) -> bool:
        """Out of range and not clamped: the requested offset is no target (executing is refused)."""
        return self.out_of_range is not None and not self.clamped

    @property
    def records_replayed(self) -> int | None:
        """Records that will be read again (target behind the current position); None when refused."""
        if self.refused:
            return None
        return max(0, self._base() - self.target_next_offset)

    @property
    def records_skipped(self) -> int | None:
        """Records that will never be read (target ahead of the current position); None when refused."""
        if self.refused:
            return None
        return max(0, self.target_next_offset - self._base())

    def _base(self) -> int:
        # A partition with no position would start from earliest (the resolver's new-partition rule).
        return self.before_next_offset if self.before_next_offset is not None else self.log_start_offset



@dataclass(frozen=True)
class ResetPlan:
    """The per-partition outcome of a reset request, sorted by topic and partition."""

    mode: ResetMode
    out_of_range_policy: OutOfRangePolicy
    partitions: tuple[PartitionReset, ...]
    parameters: Mapping[str, Any] = field(default_factory=dict)

    @property
    def out_of_range(self) -> list[PartitionReset]:
        return [p for p in self.partitions if p.out_of_range is not None]

    @property
    def refused(self) -> bool:
        """True when executing this plan must be refused (targets out of range, policy refuse)."""
        return self.out_of_range_policy == "refuse" and bool(self.out_of_range)

    def new_positions(self) -> dict[str, dict[str, int]]:
        """``{"topic": {"0": next_offset}}``: the legacy API's shape; a refused partition has no new position."""
        return offsets_to_nested({p.tp: p.target_next_offset for p in self.partitions if not p.refused})

    def check_executable(self) -> None:
        """Raise OffsetOutOfRange when the plan must not be executed."""
        if self.refused:
            raise OffsetOutOfRange([
                {"topic": p.topic, "partition": p.partition, "requested": p.requested_next_offset,
                 "log_start_offset": p.log_start_offset, "log_end_offset": p.log_end_offset,
                 "kind": p.out_of_range}
                for p in self.out_of_range
            ])


def offsets_to_nested(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """``{TopicPartition: n}`` -> ``{"topic": {"0": n}}`` sorted by topic and partition number."""
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = offsets[tp]
    return out


def validate_offset(topic: str, partition: int | str, value: Any) -> int:
    """An offset from user input: an int (not bool/float/str) >= 0, or -2/-1; else InvalidOffset."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOffset(topic, partition, value)
    if value < 0 and value not in (EARLIEST, LATEST):
        raise InvalidOffset(topic, partition, value)
    if value > MAX_OFFSET:
        raise InvalidOffset(topic, partition, value)
    return value


def parse_partition_key(topic: str, key: Any) -> int:
    """A partition key of a ``{"topic": {"0": n}}`` body: a decimal string (or int) >= 0."""
    if isinstance(key, bool):
        raise InvalidInput(f"invalid partition {key!r} of topic {topic!r}", topic=topic, partition=str(key))
    if isinstance(key, int) and 0 <= key < 2**31:
        return key
    if isinstance(key, str) and _PARTITION_KEY.match(key) and int(key) < 2**31:
        return int(key)
    raise InvalidInput(f"invalid partition {key!r} of topic {topic!r}: use a partition number such as \"0\"",
                       topic=topic, partition=str(key))


def parse_offsets_body(body: Any) -> dict[TopicPartition, int]:
    """Validate a ``{"topic": {"0": n, ...}}`` document (already JSON-decoded) into offsets."""
    if not isinstance(body, dict) or not body:
        raise InvalidInput('expected a JSON object like {"topic": {"0": 1200, "1": -2}}')
    out: dict[TopicPartition, int] = {}
    for topic, parts in body.items():
        if not isinstance(topic, str) or not topic:
            raise InvalidInput(f"invalid topic name {topic!r}")
        if not isinstance(parts, dict) or not parts:
            raise InvalidInput(f'expected an object of partition -> offset for topic {topic!r}, like {{"0": 1200}}',
                               topic=topic)
        for key, value in parts.items():
            partition = parse_partition_key(topic, key)
            out[TopicPartition(topic, partition)] = validate_offset(topic, partition, value)
    return out


def plan_reset(
    request: ResetRequest,
    positions: Sequence[Position],
    watermarks: Mapping[TopicPartition, Watermarks],
    offsets_for_time: Mapping[TopicPartition, int | None] | None = None,
) -> ResetPlan:
    """Compute before/target/log bounds per partition in scope; raises InvalidInput subclasses."""
    if request.mode not in RESET_MODES:
        raise InvalidInput(f"unknown reset mode {request.mode!r}; use one of {', '.join(RESET_MODES)}",
                           mode=request.mode)
    before = {p.tp: p.next_offset for p in positions}
    cluster: dict[str, list[int]] = {}
    for tp in watermarks:
        cluster.setdefault(tp.topic, []).append(tp.partition)

    targets = _scope(request, [tp.topic for tp in before], cluster)
    planned: list[PartitionReset] = []
    for tp in targets:
        marks = watermarks[tp]
        requested = _requested(request, tp, before.get(tp), marks, offsets_for_time)
        # A huge shift must stay a storable 64-bit offset (it is out of range either way).
        requested = max(-MAX_OFFSET, min(requested, MAX_OFFSET))
        planned.append(_bounded(tp, before.get(tp), requested, marks, request.out_of_range))
    return ResetPlan(request.mode, request.out_of_range, tuple(planned), request.parameters())


def _scope(
    request: ResetRequest, position_topics: Sequence[str], cluster: Mapping[str, Sequence[int]],
) -> list[TopicPartition]:
    topics = request.topics(position_topics)
    if not topics:
        raise InvalidInput("nothing to reset: the pipeline has no positions and no topic was named")
    for topic in topics:
        if topic not in cluster:
            raise UnknownTopic(topic)
    chosen: list[TopicPartition] = []
    for topic in topics:
        existing = sorted(cluster[topic])
        wanted = request.scope.get(topic) if request.scope else None
        if wanted is not None:
            for p in wanted:
                if p not in existing:
                    raise UnknownPartition(topic, p, existing)
            existing = sorted(set(wanted))
        if request.mode == "offsets":
            assert request.offsets is not None
            named = sorted(tp.partition for tp in request.offsets if tp.topic == topic)
            for p in named:
                if p not in cluster[topic]:
                    raise UnknownPartition(topic, p, cluster[topic])
            if request.require_all_partitions:
                missing = sorted(set(cluster[topic]) - set(named))
                if missing:
                    raise InvalidInput(
                        f"the body must name every partition of topic {topic!r}; missing {missing}",
                        topic=topic, missing_partitions=missing,
                    )
            existing = [p for p in existing if p in named]
            if not existing:
                raise InvalidInput(f"no offsets given for topic {topic!r} in the requested scope", topic=topic)
        chosen.extend(TopicPartition(topic, p) for p in existing)
    return chosen


def _requested(
    request: ResetRequest, tp: TopicPartition, before: int | None, marks: Watermarks,
    offsets_for_time: Mapping[TopicPartition, int | None] | None,
) -> int:
    if request.mode == "earliest":
        return marks.log_start_offset
    if request.mode == "latest":
        return marks.log_end_offset
    if request.mode == "offsets":
        if request.offsets is None:
            raise InvalidInput("mode 'offsets' needs offsets")
        value = request.offsets[tp]
        return _resolve_sentinel(value, marks)
    if request.mode == "timestamp":
        if request.timestamp_ms is None:
            raise InvalidInput("mode 'timestamp' needs a timestamp")
        found = (offsets_for_time or {}).get(tp)
        # No record at or after the time: start at the end, as kafka-consumer-groups does.
        return marks.log_end_offset if found is None else found
    if request.shift_by is None:
        raise InvalidInput("mode 'shift' needs shiftBy")
    base = before if before is not None else marks.log_start_offset
    return base + request.shift_by


def _resolve_sentinel(value: int, marks: Watermarks) -> int:
    # Positions are stored concrete so the audit trail says exactly where a reset pointed.
    if value == EARLIEST:
        return marks.log_start_offset
    if value == LATEST:
        return marks.log_end_offset
    return value


def _bounded(
    tp: TopicPartition, before: int | None, requested: int, marks: Watermarks, policy: OutOfRangePolicy,
) -> PartitionReset:
    kind: OutOfRangeKind | None = None
    if requested < marks.log_start_offset:
        kind = "below_log_start"
    elif requested > marks.log_end_offset:
        kind = "above_log_end"
    target = requested
    clamped = False
    if kind is not None and policy == "clamp":
        target = min(max(requested, marks.log_start_offset), marks.log_end_offset)
        clamped = True
    return PartitionReset(tp.topic, tp.partition, before, requested, target,
                          marks.log_start_offset, marks.log_end_offset, kind, clamped)
