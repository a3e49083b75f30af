"""Pure rules of authority: which run may move a pipeline's positions.

A checkpoint generation handed out by ``start_from_ledger`` is the pipeline's authority. Once a
pipeline (and consumer group) has one, only runs whose checkpoint *is* the newest generation's
location move positions; a run on any other checkpoint (an older generation, a copy, a second
deployment) is kept in history and reported as ``foreign_run``. Pipelines that never used the
restart helper keep the forward-only rule, where two different active queries writing one
partition are a ``shared_position`` finding rather than a silent interleaving.

No I/O here: the recorder feeds these functions what it read inside its transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from offset_ledger.rules import locations

# "reset_overtaken": the position moves, and a finding says that a pending reset was passed over.
Decision = Literal["move", "regression", "pending_reset", "foreign_run", "shared_position", "reset_overtaken"]


def same_location(recorded: str | None, generation_location: str) -> bool:
    """Whether a run's recorded checkpoint (as Spark reports it) can be the generation's location.

    Compared as locations (``offset_ledger.rules.locations``): the whole normalised path must match, so a
    copy elsewhere with the same ``gen-<n>-<id>`` name is not the generation. A generation handed
    out without an authority (``hdfs:///ck/gen-1-x``) or scheme (``/ck/gen-1-x``) is on the default
    file system, which Spark names when it reports the location (``hdfs://namenode:8020/ck/gen-1-x``).
    """
    if not recorded or not recorded.strip():
        return False
    return locations.same_place(locations.parse_location(recorded), locations.parse_location(generation_location))


@dataclass(frozen=True)
class GenerationRef:
    """What matching a run needs to know of a generation."""

    id: int
    location: str
    query_id: str | None  # the query that claimed it (its first run), if any yet


def match_generation(
    generations: Sequence[GenerationRef], *, checkpoint_location: str | None, query_id: str,
    query_seen_before: bool,
) -> GenerationRef | None:
    """The generation a run belongs to, or None (a run on a checkpoint the helper did not hand out).

    With a known checkpoint location, the generation with that location. Without one (Spark
    Connect clients cannot ask for it), the generation its query already claimed, else the newest
    generation if nobody claimed it yet and this query was never seen before: a fresh checkpoint
    always starts a new query id, while a restart on an old checkpoint brings back an old one.
    """
    if checkpoint_location:
        reported = locations.parse_location(checkpoint_location)
        places = [(g, locations.parse_location(g.location)) for g in generations]
        exact = [g for g, place in places if place == reported]
        if exact:
            return _incarnation_at(exact, query_id)
        # Loose matches (a plain path or a missing authority) are only trusted when unambiguous: two
        # locations mean we cannot tell, and a run on no generation is history, never a position.
        loose = [g for g, place in places if locations.same_place(reported, place)]
        return _incarnation_at(loose, query_id) if len({g.location for g in loose}) == 1 else None
    for g in generations:
        if g.query_id == query_id:
            return g
    if generations and not query_seen_before:
        newest = max(generations, key=lambda g: g.id)
        if newest.query_id is None:
            return newest
    return None


def _incarnation_at(candidates: Sequence[GenerationRef], query_id: str) -> GenerationRef:
    """Of the generations at one location (a checkpoint re-created in place has several), the one
    this query claimed, else the newest. The caller tells a newest claimed by another query (the
    checkpoint was re-created: ``claimed_by_other``) from one it may claim."""
    for g in candidates:
        if g.query_id == query_id:
            return g
    return max(candidates, key=lambda g: g.id)


def claimed_by_other(generation: GenerationRef, query_id: str) -> bool:
    """Whether another query claimed the generation: a new query on its checkpoint re-created it."""
    return generation.query_id is not None and generation.query_id != query_id


@dataclass(frozen=True)
class PositionState:
    """A position as the recorder found it, locked, inside its transaction."""

    next_offset: int
    query_id: str | None
    updated_at: datetime
    reset_pending: bool


def decide(
    current: PositionState | None, until_offset: int, *, query_id: str, run_started_at: datetime,
    run_generation_id: int | None, current_generation_id: int | None,
    other_query_active: bool = False, from_offset: int | None = None,
) -> Decision:
    """Whether a batch ending at ``until_offset`` moves the position, and if not, which finding says why.

    ``other_query_active``: the query that last moved the position is not this one and still has
    an active run (only asked for pipelines without generations). ``from_offset``: where the batch
    started on this partition (None: Spark did not say, as on a fresh checkpoint's first batch).
    """
    if current_generation_id is not None and run_generation_id != current_generation_id:
        return "foreign_run"
    if current is not None and current.reset_pending:
        if current_generation_id is not None:
            # Only a fresh generation applies a pending reset: no run of an existing one started from it.
            return "pending_reset"
        if current.updated_at > run_started_at:
            # Without the helper, a run started after the reset may have started from it.
            return "pending_reset"
        if from_offset is not None and from_offset != current.next_offset and until_offset >= current.next_offset:
            # It did not (an old checkpoint): it moves on, but never silently over the reset.
            return "reset_overtaken"
    if current is None:
        return "move"
    if (current_generation_id is None and other_query_active and current.query_id is not None
            and current.query_id != query_id):
        return "shared_position"
    if until_offset >= current.next_offset:
        return "move"
    return "regression"
