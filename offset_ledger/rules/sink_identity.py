"""Pure: a transactional sink's batch identity, and whether a batch may commit.

Spark's batch id restarts at 0 on every fresh checkpoint, so it cannot key a sink's writes across a
clean-checkpoint upgrade. The ledger's identity of a batch is (sink, checkpoint generation, batch
id); each committed one gets the sink's next *sequence*, a number that only grows across
generations. A batch the sink already committed (Spark re-runs a batch whose commit file it never
wrote) is skipped; a batch from a checkpoint generation that is not the pipeline's current one (a
zombie driver, an old deployment) is fenced: it may not commit after the newer generation exists.

No I/O: ``offset_ledger.ledger.sink_store`` feeds these what it read under the sink's row lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Verdict = Literal["commit", "skip", "fenced"]


@dataclass(frozen=True)
class SinkState:
    """The sink's last commit: its sequence and the (generation id, batch id) that made it."""

    last_sequence: int = 0  # 0: nothing committed yet (sequences start at 1)
    generation_id: int | None = None
    batch_id: int | None = None


@dataclass(frozen=True)
class SinkDecision:
    """What a sink does with one batch, and the sequence that batch has (or gets)."""

    verdict: Verdict
    sequence: int | None
    reason: str = ""


def decide(state: SinkState, *, generation_id: int, batch_id: int, current_generation_id: int | None,
           committed_sequence: int | None) -> SinkDecision:
    """Commit (with the next sequence), skip (already committed) or fence one batch.

    ``committed_sequence``: the sequence this sink already gave (generation id, batch id), if any.
    ``current_generation_id``: the pipeline's current checkpoint generation (None: it has none).
    """
    if committed_sequence is not None:
        return SinkDecision("skip", committed_sequence,
                            f"batch {batch_id} of generation {generation_id} is already committed as sequence "
                            f"{committed_sequence} (a re-run after a crash)")
    if current_generation_id is None or generation_id != current_generation_id:
        return SinkDecision("fenced", None,
                            f"generation {generation_id} is not the pipeline's current checkpoint generation "
                            f"({current_generation_id}): a newer restart took over; this driver may not commit")
    if state.generation_id is not None and (state.generation_id, state.batch_id or 0) > (generation_id, batch_id):
        return SinkDecision("fenced", None,
                            f"batch {batch_id} of generation {generation_id} is behind the sink's last commit "
                            f"(batch {state.batch_id} of generation {state.generation_id}, sequence "
                            f"{state.last_sequence}): another driver on this checkpoint is ahead")
    return SinkDecision("commit", state.last_sequence + 1)



@dataclass(frozen=True)
class SinkTarget:
    """Where a sink writes, as the ledger registers it: what one sink name is bound to.

    ``target``: the Postgres table as given (``schema.name`` or ``name``) or the Delta table's
    path; ``target_database``: ``host:port/dbname`` of a remote Postgres target (never user or
    password: a credential rotation is the same target), None for the ledger's own database.
    """

    pipeline: str
    consumer_group: str
    kind: str
    target: str
    target_database: str | None


def describe_target(t: SinkTarget) -> str:
    where = "the ledger's database" if t.target_database is None else t.target_database
    what = f"Delta table {t.target}" if t.kind == "delta" else f"{t.kind} table {t.target} in {where}"
    return f"{what} (pipeline {t.pipeline!r}, group {t.consumer_group!r})"


def target_change(sink: str, registered: SinkTarget, wanted: SinkTarget, *, same_path: bool) -> str | None:
    """Why ``wanted`` may not write under ``sink``, bound to ``registered`` (None: the same target).

    One sink name, one target: a sink's sequences, fence row and committed batches describe one
    target; a second target under the name would start its own sequences at 1 and collide with the
    ledger's record only after it committed. ``same_path``: whether two Delta paths are one place
    (the caller compares locations; a Postgres table name is compared as written).
    """
    same = (registered.pipeline, registered.consumer_group, registered.kind, registered.target_database) == (
        wanted.pipeline, wanted.consumer_group, wanted.kind, wanted.target_database) and (
        same_path if wanted.kind == "delta" else registered.target == wanted.target)
    if same:
        return None
    return (f"sink {sink!r} is bound to {describe_target(registered)}; this sink writes "
            f"{describe_target(wanted)}. One sink name, one target: nothing was written. Give the new target "
            f"its own name (name=...), or point the sink back at its target")
