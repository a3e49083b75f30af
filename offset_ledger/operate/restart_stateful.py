"""The windowed (stateful) part of a restart: the rewind, and the inputs stored with its generation.

A generation opened with ``window=`` stores what it was opened with (window, slide, watermark
delay, event-time floor, the query the rewind was computed from) in
``checkpoint_generations.stateful``. Later restarts read it back: the floor never goes down (the
next rewind takes the larger of its own and the stored one; a restart without ``window=`` keeps
the stored floor and returns it in the plan), and a forgotten ``watermark_delay`` is the stored one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.errors import StatefulRestartRefused
from offset_ledger.kafka.adapter import KafkaAdapter
from offset_ledger.ledger import generations as gens
from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.ledger.queries import checkpoint_batches
from offset_ledger.rules.model import Finding, Position
from offset_ledger.rules.restart_options import GroupRef
from offset_ledger.rules.stateful import StateRewind, WindowSpec, plan_rewind, to_ms


@dataclass(frozen=True)
class StoredStateful:
    """What a stateful restart stored with the generation it opened."""

    window_ms: int | None
    slide_ms: int | None
    delay_ms: int | None
    event_time_floor: datetime | None
    kafka_timestamp: bool
    basis_query_id: str | None
    generation: int

    def kept_finding(self) -> Finding:
        floor = self.event_time_floor.isoformat() if self.event_time_floor else None
        return Finding(
            "event_time_floor_kept",
            f"checkpoint generation {self.generation} was opened by a stateful restart with event-time floor "
            f"{floor}; it still holds: drop records with event time before it (plan.event_time_floor)",
            details={"event_time_floor": floor, "generation": self.generation})


def stored_stateful(generation: gens.CheckpointGeneration | None) -> StoredStateful | None:
    """The stateful inputs the generation stored, or None (not opened by a stateful restart)."""
    raw: Mapping[str, Any] | None = generation.stateful if generation is not None else None
    if not raw:
        return None
    floor = raw.get("event_time_floor")
    return StoredStateful(raw.get("window_ms"), raw.get("slide_ms"), raw.get("delay_ms"),
                          datetime.fromisoformat(floor) if floor else None, bool(raw.get("kafka_timestamp")),
                          raw.get("basis_query_id"), generation.generation if generation else 0)


def stateful_record(rewind: tuple[str | None, StateRewind] | None, stored: StoredStateful | None,
                    window: WindowSpec | None) -> dict[str, Any] | None:
    """What a new generation stores: the rewind it was opened with (on ``window``), else the floor it inherits."""
    if rewind is not None:
        query_id, r = rewind
        return {"window_ms": r.window.length_ms, "slide_ms": r.window.slide_ms, "delay_ms": r.delay_ms,
                "event_time_floor": r.event_time_floor.isoformat(),
                "kafka_timestamp": bool(window and window.kafka_timestamp),
                "basis_query_id": query_id, "first_batch_id": r.first_batch_id}
    if stored is not None and stored.event_time_floor is not None:
        return {"window_ms": stored.window_ms, "slide_ms": stored.slide_ms, "delay_ms": stored.delay_ms,
                "event_time_floor": stored.event_time_floor.isoformat(), "kafka_timestamp": stored.kafka_timestamp,
                "basis_query_id": stored.basis_query_id, "inherited_from_generation": stored.generation}
    return None


def state_rewind(
    engine: Engine, adapter: KafkaAdapter, group: GroupRef, generation: gens.CheckpointGeneration | None,
    pending_reset_ids: Sequence[int], positions: Sequence[Position], spec: WindowSpec, stored: StoredStateful | None,
) -> tuple[str | None, StateRewind]:
    """(query id, rewind) of the pipeline's live checkpoint (``generation``, the current one); refused
    when no watermark was recorded or a reset is pending."""
    pipeline = group.pipeline
    if pending_reset_ids:
        # A reset says where to read; a rewind says where the state's records are: never guess which wins.
        raise StatefulRestartRefused(
            f"pipeline {pipeline!r} has pending reset(s) {', '.join(map(str, pending_reset_ids))}; "
            f"a windowed restart rewinds from recorded batches and would overrule them: restart without "
            f"a window (neither a window argument nor a stored 'policy set --window') to apply the reset, or "
            f"cancel it", pipeline, reset_ids=list(pending_reset_ids))
    try:
        with engine.connect() as conn:
            query_id, figures = checkpoint_batches(conn, pipeline, group.consumer_group,
                                                   generation.id if generation else None)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "reading batch history") from exc
    delay_ms = spec.delay_ms
    if delay_ms is None and stored is not None:
        delay_ms = stored.delay_ms  # what the previous stateful restart used (given or read back then)
    floor = stored.event_time_floor if stored is not None else None
    current = {p.tp: p.next_offset for p in positions}
    rewind = plan_rewind(figures, current, spec, delay_ms=delay_ms, pipeline=pipeline, floor_at_least=floor)
    if rewind is None:
        raise StatefulRestartRefused(
            f"pipeline {pipeline!r}: the ledger has no watermark for its checkpoint (query {query_id}); a windowed "
            f"restart needs one (the query must use withWatermark, recorded by this version's listener)",
            pipeline, query_id=query_id)
    if spec.kafka_timestamp:
        floor_ms = to_ms(rewind.event_time_floor)
        by_time = adapter.offsets_for_time(sorted(current), floor_ms)
        rewind = plan_rewind(figures, current, spec, delay_ms=rewind.delay_ms, pipeline=pipeline,
                             offsets_for_floor=by_time, floor_at_least=floor)
        assert rewind is not None
    return query_id, rewind
