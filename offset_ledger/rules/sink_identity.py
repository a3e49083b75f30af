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
    what = (f"Delta table {t.target}" if t.kind == "delta" else f"Iceberg table {t.target}" if t.kind == "iceberg"
            else f"{t.kind} table {t.target} in {where}")
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


@dataclass(frozen=True)
class BatchIdentity:
    """What a sink writes into its commit (Delta's ``userMetadata``) to name the batch that made it.

    ``query_id``: the Spark query of the checkpoint (stable across re-runs on one checkpoint, new
    when a checkpoint is lost and re-created), so a commit of a lost checkpoint's batch n is not
    taken for the new query's batch n.
    """

    sink: str
    generation_id: int
    batch_id: int
    query_id: str

    def as_doc(self) -> dict[str, object]:
        return {"sink": self.sink, "generation_id": self.generation_id, "batch_id": self.batch_id,
                "query_id": self.query_id}


def identity_of(doc: dict[str, object] | None) -> BatchIdentity | None:
    """The batch a sink's commit metadata names (None: it names none, e.g. another writer's commit).

    Commits written before the identity was top-level carry the batch id and query id only in
    their ``batch`` record; both shapes are read.
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("sink"), str) or doc.get("generation_id") is None:
        return None
    batch = doc.get("batch") if isinstance(doc.get("batch"), dict) else {}
    assert isinstance(batch, dict)
    batch_id = doc.get("batch_id", batch.get("batch_id"))
    query_id = doc.get("query_id", batch.get("query_id"))
    if batch_id is None:
        return None
    try:
        return BatchIdentity(str(doc["sink"]), int(doc["generation_id"]),  # type: ignore[call-overload]
                             int(batch_id), str(query_id or ""))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


def foreign_commit(expected: BatchIdentity, sequence: int, version: int, found: BatchIdentity | None) -> str | None:
    """Why the table version carrying (this sink, ``sequence``) is not ``expected``'s commit (None: it is).

    Delta skips a write whose (appId, txnVersion) it has seen: when another batch already holds the
    sequence (a zombie of an older generation, a ledger behind the table on a restart that did not
    reconcile, a lost checkpoint's query) this batch's rows were *not* written, and recording that
    version as its commit would lose them silently.
    """
    if found == expected or (found is not None and not found.query_id and
                             (found.sink, found.generation_id, found.batch_id) ==
                             (expected.sink, expected.generation_id, expected.batch_id)):
        return None
    by = ("a writer that did not name its batch (userMetadata without this sink's record)" if found is None
          else f"sink {found.sink!r}, batch {found.batch_id} of generation {found.generation_id}"
               f"{f' (query {found.query_id})' if found.query_id else ''}")
    return (f"table version {version} carries txn ({expected.sink}, {sequence}) but was written by {by}, not "
            f"by batch {expected.batch_id} of generation {expected.generation_id} (query {expected.query_id}): "
            f"Delta skipped this batch's write as a duplicate, so its rows are not in the table and it is not "
            f"recorded as committed. Stop any driver still running an older generation, then restart with "
            f"start_from_ledger(..., sinks=[sink]): it records version {version} from the Delta log and plans from "
            f"where that version's batch ended (a sink_ahead finding), so its records are not written again "
            f"(docs/sinks.md, Refusals)")
