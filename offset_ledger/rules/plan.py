"""Pure: the restart's answer, ``RestartPlan``: complete ``startingOffsets``, the checkpoint, and why.

Apart from ``rules.model`` (the offset convention and the values everything shares) because a plan
also carries what moving costs (``rules.move_cost``, itself built on ``rules.model``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from offset_ledger.rules.model import Finding, StartingOffsets, starting_offsets_json
from offset_ledger.rules.move_cost import MoveCost


@dataclass(frozen=True)
class RestartPlan:
    """What a pipeline needs to start: complete ``startingOffsets`` and the checkpoint to use."""

    pipeline: str
    starting_offsets: StartingOffsets
    checkpoint_location: str | None
    findings: tuple[Finding, ...] = ()
    fresh_checkpoint: bool = True
    #: The checkpoint generation number the plan runs on (None for a read-only plan).
    generation: int | None = None
    #: The consumer group the plan is for (the pipeline's only group when none was named).
    consumer_group: str | None = None
    #: Stateful restart: drop records with event time before this (aware UTC) right after parsing;
    #: None when no rewind applies.
    event_time_floor: datetime | None = None
    #: The restart policies this plan applied: stored with the pipeline, overridden by the call's
    #: arguments, else the defaults (``offset_ledger.rules.policies``).
    policies: Mapping[str, Any] = field(default_factory=dict)
    #: On a fresh checkpoint: what starting away from the ledger's positions re-reads or skips (a
    #: stateful rewind, an applied reset, data lost to retention); None when nothing was computed.
    cost: MoveCost | None = None

    @property
    def starting_offsets_json(self) -> str:
        return starting_offsets_json(self.starting_offsets)
