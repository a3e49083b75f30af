"""Request bodies of the resource API (strict: strings or floats are never taken as offsets)."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

from offset_ledger.errors import InvalidInput
from offset_ledger.operate.inputs import check_topic, parse_timestamp, to_epoch_ms
from offset_ledger.rules.model import TopicPartition
from offset_ledger.rules.resets import ResetRequest, parse_partition_key, validate_offset


class TopicScope(BaseModel):
    """One topic of a reset's scope; without ``partitions`` every partition of the topic."""

    model_config = ConfigDict(extra="forbid")

    topic: StrictStr = Field(min_length=1, max_length=249)
    partitions: Optional[list[StrictInt]] = Field(default=None, min_length=1, max_length=10_000)


class ResetBody(BaseModel):
    """``POST /api/v1/pipelines/{pipeline}/resets``: a dry run unless ``dryRun`` is false."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [
            {"mode": "earliest", "dryRun": True, "reason": "replay after bug fix"},
            {"mode": "offsets", "offsets": {"orders": {"0": 1200, "1": -2}}, "dryRun": False,
             "reason": "skip poison records", "outOfRange": "refuse"},
            {"mode": "timestamp", "timestamp": "2024-05-01T12:00:00Z", "topics": [{"topic": "orders"}]},
            {"mode": "shift", "shiftBy": -100, "topics": [{"topic": "orders", "partitions": [0, 2]}]},
        ]},
    )

    mode: Literal["earliest", "latest", "offsets", "timestamp", "shift"]
    topics: Optional[list[TopicScope]] = Field(default=None, max_length=1000,
                                               description="scope; default: every topic the pipeline reads")
    offsets: Optional[dict[str, dict[str, StrictInt]]] = Field(
        default=None, description='mode=offsets: {"topic": {"0": next_offset}}; -2 earliest, -1 latest')
    timestamp: Optional[Union[StrictInt, StrictStr]] = Field(
        default=None, description="mode=timestamp: ISO 8601 or epoch milliseconds")
    shiftBy: Optional[StrictInt] = Field(default=None, description="mode=shift: records to move (negative replays)")
    dryRun: StrictBool = True
    reason: Optional[StrictStr] = Field(default=None, max_length=10_000)
    actor: Optional[StrictStr] = Field(default=None, min_length=1, max_length=255)
    force: StrictBool = Field(default=False, description="reset even while the pipeline has an active run")
    outOfRange: Literal["clamp", "refuse"] = Field(
        default="refuse", description="targets outside [log-start, log-end]: clamp them or refuse the reset")
    consumerGroup: Optional[StrictStr] = Field(default=None, min_length=1, max_length=255)

    @model_validator(mode="after")
    def _mode_parameters(self) -> ResetBody:
        needs = {"offsets": self.offsets, "timestamp": self.timestamp, "shift": self.shiftBy}
        if self.mode in needs and needs[self.mode] is None:
            field = {"offsets": "offsets", "timestamp": "timestamp", "shift": "shiftBy"}[self.mode]
            raise ValueError(f"mode {self.mode!r} needs {field!r}")
        return self

    def to_request(self) -> ResetRequest:
        """The pure reset request (raises InvalidInput subclasses for bad offsets or names)."""
        scope = None
        if self.topics:
            scope = {}
            for t in self.topics:
                check_topic(t.topic)
                if t.partitions is not None:
                    for p in t.partitions:
                        parse_partition_key(t.topic, p)
                scope[t.topic] = tuple(sorted(set(t.partitions))) if t.partitions is not None else None
        offsets = None
        if self.mode == "offsets" and self.offsets is not None:
            offsets = {}
            for topic, parts in self.offsets.items():
                check_topic(topic)
                for key, value in parts.items():
                    partition = parse_partition_key(topic, key)
                    offsets[TopicPartition(topic, partition)] = validate_offset(topic, partition, value)
            if not offsets:
                raise InvalidInput("mode 'offsets' needs at least one partition offset")
        timestamp_ms = None
        if self.mode == "timestamp" and self.timestamp is not None:
            timestamp_ms = to_epoch_ms(parse_timestamp(self.timestamp))
        return ResetRequest(
            mode=self.mode, scope=scope, offsets=offsets, timestamp_ms=timestamp_ms,
            shift_by=self.shiftBy if self.mode == "shift" else None, out_of_range=self.outOfRange,
        )
