"""Pure: a restart's input as values, read and checked once: which pipeline and group, the call's options,
first_run, on_data_loss, explicit offsets JSON.

``start_from_ledger`` builds ``PipelineRef`` and ``RestartOptions`` (with ``rules.policies.Policies``
and ``rules.stateful.WindowSpec``) in its first lines and hands them down as they are; ``Pipeline``
derives the arguments it accepts from their fields. Every failure is an InvalidRestartOptions (or
InvalidOffset) naming the option, nothing else; the resolver (``offset_ledger.rules.resolver``)
plans with the values these return.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal, Union

from offset_ledger.errors import (
    AmbiguousConsumerGroup,
    ConfigError,
    InvalidOffset,
    InvalidRestartOptions,
)
from offset_ledger.rules.model import (
    EARLIEST,
    LATEST,
    OnDataLoss,
)

ON_DATA_LOSS_POLICIES: tuple[str, ...] = ("fail", "earliest")


_SENTINELS = (EARLIEST, LATEST)


@dataclass(frozen=True)
class PipelineRef:
    """A pipeline, and the consumer group its caller named (None: the ledger's choice, ``resolve``)."""

    pipeline: str
    consumer_group: str | None = None

    def resolve(self, groups: Collection[str]) -> GroupRef:
        """The one rule a restart resolves its group by, given the groups the ledger holds for the pipeline.

        A named group is used as named (one the ledger lacks is a first run: ``FirstRunRefused``
        guards a pipeline the ledger knows); none named: the pipeline's only group,
        AmbiguousConsumerGroup when it has several, and the pipeline's own name when the ledger
        does not know it yet (what the listener records under by default). The operator verbs
        (``operate.operations.resolve_group``) apply it to a pipeline they first require to exist
        (and a named group to be one of its groups).
        """
        if self.consumer_group is not None:
            return GroupRef(self.pipeline, self.consumer_group, named=True)
        known = sorted(groups)
        if len(known) > 1:
            raise AmbiguousConsumerGroup(self.pipeline, known)
        return GroupRef(self.pipeline, known[0] if known else self.pipeline, named=False)


@dataclass(frozen=True)
class GroupRef:
    """A pipeline and its consumer group, resolved (``PipelineRef.resolve``): what a restart reads and writes."""

    pipeline: str
    consumer_group: str
    #: the caller named the group; else the ledger's only one (or the pipeline's name: a guess a
    #: run reporting its own group overrules, ``group_adopted``)
    named: bool


@dataclass(frozen=True)
class RestartOptions:
    """A restart's options besides its policies: the subscription, the checkpoint and what to allow.

    ``topics`` (like ``subscribe``; a comma-separated string is split) or ``topic_pattern`` (like
    ``subscribePattern``), exactly one. ``checkpoint_root`` as Spark will see it (the caller makes
    a relative local path absolute); None only for a read-only plan (``offset-ledger resolve``).
    """

    topics: tuple[str, ...] | None = None
    topic_pattern: str | None = None
    checkpoint_root: str | None = None
    app_version: str | None = None
    new_checkpoint: bool = False
    allow_first_run: bool = False
    adopt_checkpoint: str | None = None

    def __post_init__(self) -> None:
        if self.checkpoint_root is not None and not str(self.checkpoint_root).strip():
            raise ConfigError("checkpoint_root is required")
        if (self.topics is None) == (self.topic_pattern is None):
            raise InvalidRestartOptions("give exactly one of topics or topic_pattern (like subscribe / subscribePattern)",
                                        option="topics")
        if self.topics is not None:
            named: Sequence[str] = self.topics
            if isinstance(named, str):
                named = [t.strip() for t in named.split(",")]
            wanted = tuple(dict.fromkeys(t for t in named if t))
            if not wanted:
                raise InvalidRestartOptions("topics is empty", option="topics")
            object.__setattr__(self, "topics", wanted)


@dataclass(frozen=True)
class FirstRunTimestamp:
    """First run from the first record whose timestamp is at or after ``timestamp_ms``."""

    timestamp_ms: int


@dataclass(frozen=True)
class FirstRunOffsets:
    """First run from explicit offsets: ``{topic: {partition: next_offset | -1 | -2}}``."""

    offsets: Mapping[str, Mapping[int, int]]


FirstRun = Union[Literal["earliest", "latest"], FirstRunTimestamp, FirstRunOffsets]


def parse_on_data_loss(value: str) -> OnDataLoss:
    """Validate an ``on_data_loss`` policy name."""
    if value not in ON_DATA_LOSS_POLICIES:
        raise InvalidRestartOptions(
            f"on_data_loss must be one of {', '.join(ON_DATA_LOSS_POLICIES)}, not {value!r}",
            option="on_data_loss", value=str(value))
    return value  # type: ignore[return-value]


def parse_first_run(value: object) -> FirstRun:
    """Read a ``first_run`` policy from Python or CLI input.

    Accepted: ``"earliest"``, ``"latest"``; a timestamp as a ``datetime`` (naive means UTC), an
    ``int`` of epoch milliseconds, or a string of either (ISO-8601 or digits); explicit offsets as a
    ``dict`` or a JSON string ``{"topic": {"0": 12, "1": -2}}``.
    """
    if isinstance(value, (FirstRunTimestamp, FirstRunOffsets)):
        return value
    if isinstance(value, bool):  # bool is an int subclass; True is not a timestamp
        raise InvalidRestartOptions(f"first_run cannot be {value!r}", option="first_run")
    if isinstance(value, datetime):
        return FirstRunTimestamp(_datetime_ms(value))
    if isinstance(value, int):
        if value < 0:
            raise InvalidRestartOptions(f"first_run timestamp must be >= 0 epoch ms, not {value}",
                                        option="first_run")
        return FirstRunTimestamp(value)
    if isinstance(value, Mapping):
        return FirstRunOffsets(parse_offsets(value, what="first_run"))
    if isinstance(value, str):
        text = value.strip()
        if text in ("earliest", "latest"):
            return text  # type: ignore[return-value]
        if text.startswith("{"):
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                raise InvalidRestartOptions(f"first_run is not valid JSON: {exc.msg} at position {exc.pos}",
                                            option="first_run") from exc
            return FirstRunOffsets(parse_offsets(data, what="first_run"))
        if re.fullmatch(r"\d+", text):
            return FirstRunTimestamp(int(text))
        try:
            return FirstRunTimestamp(_datetime_ms(datetime.fromisoformat(text)))
        except ValueError:
            pass
    raise InvalidRestartOptions(
        f"first_run must be 'earliest', 'latest', a timestamp (ISO-8601 or epoch ms) or JSON offsets, "
        f"not {value!r}", option="first_run")


def _datetime_ms(value: datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return int(value.timestamp() * 1000)


def parse_offsets(data: object, *, what: str = "offsets") -> dict[str, dict[int, int]]:
    """Validate ``{"topic": {"0": n}}``: partitions are non-negative ints, offsets ints >= 0 or -1/-2."""
    if not isinstance(data, Mapping) or not data:
        raise InvalidRestartOptions(f'{what} must be a non-empty JSON object like {{"topic": {{"0": 12}}}}',
                                    option=what)
    out: dict[str, dict[int, int]] = {}
    for topic, parts in data.items():
        if not isinstance(topic, str) or not topic:
            raise InvalidRestartOptions(f"{what}: topic names must be non-empty strings", option=what)
        if not isinstance(parts, Mapping) or not parts:
            raise InvalidRestartOptions(f"{what}: topic {topic!r} must map partitions to offsets",
                                        option=what, topic=topic)
        out[topic] = {}
        for key, offset in parts.items():
            partition = _partition_number(key)
            if partition is None:
                raise InvalidRestartOptions(f"{what}: {key!r} is not a partition number (topic {topic!r})",
                                            option=what, topic=topic)
            # JSON floats (12.0), strings and bools are refused rather than coerced.
            if isinstance(offset, bool) or not isinstance(offset, int) or (offset < 0 and offset not in _SENTINELS):
                raise InvalidOffset(topic, partition, offset)
            out[topic][partition] = offset
    return out


def _partition_number(key: object) -> int | None:
    if isinstance(key, bool):
        return None
    if isinstance(key, int):
        return key if key >= 0 else None
    if isinstance(key, str) and re.fullmatch(r"\d+", key):
        return int(key)
    return None
