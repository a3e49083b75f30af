"""Pure: the parts of an Apache Iceberg table's metadata a sink needs, and which snapshot is a batch's.

An Iceberg commit swaps the table's metadata file (``metadata/v<N>.metadata.json`` in a Hadoop
catalog, ``version-hint.text`` naming N) for one whose ``snapshots`` list ends in the new snapshot.
A snapshot's ``summary`` carries what the writer put there with Spark's ``snapshot-property.<key>``
write options: the sink stores the batch's identity (sink, generation, batch id, Spark query id),
its sequence and its ledger record under ``offset-ledger.*`` keys. Iceberg, unlike Delta's
``txnVersion``, skips nothing by itself: the sink looks for its sequence in the current
snapshot's ancestry before it writes, and refuses (``rules.sink_identity.foreign_commit``, the rule
the Delta sink applies) a snapshot that carries the sequence but names another batch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from offset_ledger.errors import CheckpointFormatError
from offset_ledger.rules.sink_identity import BatchIdentity, foreign_commit, identity_of

PREFIX = "offset-ledger."
SINK, SEQUENCE, GENERATION, BATCH, QUERY, RECORD = (
    f"{PREFIX}{k}" for k in ("sink", "sequence", "generation", "batch", "query", "record"))


@dataclass(frozen=True)
class IcebergSnapshot:
    """One snapshot as far as a sink cares: its id, parent and summary (all values strings)."""

    snapshot_id: int
    parent_id: int | None
    timestamp_ms: int
    summary: Mapping[str, str]

    @property
    def sink(self) -> str | None:
        return self.summary.get(SINK)

    @property
    def sequence(self) -> int | None:
        value = self.summary.get(SEQUENCE)
        return int(value) if value is not None and value.isdigit() else None

    @property
    def added_records(self) -> int | None:
        value = self.summary.get("added-records")
        return int(value) if value is not None and value.isdigit() else None

    def doc(self) -> dict[str, Any] | None:
        """The sink's record of the batch (the shape ``identity_of`` reads), None when the snapshot has none."""
        if self.sink is None:
            return None
        try:
            batch = json.loads(self.summary[RECORD]) if RECORD in self.summary else None
            return {"sink": self.sink, "sequence": self.sequence, "generation_id": int(self.summary[GENERATION]),
                    "batch_id": int(self.summary[BATCH]), "query_id": self.summary.get(QUERY, ""), "batch": batch}
        except (KeyError, ValueError):
            return None


def snapshot_properties(identity: BatchIdentity, sequence: int, batch: Mapping[str, Any] | None) -> dict[str, str]:
    """The ``snapshot-property.<key>`` write options naming the batch that makes the snapshot."""
    props = {SINK: identity.sink, SEQUENCE: str(sequence), GENERATION: str(identity.generation_id),
             BATCH: str(identity.batch_id), QUERY: identity.query_id}
    if batch is not None:
        props[RECORD] = json.dumps(batch, separators=(",", ":"))
    return props


def metadata_version(file_name: str) -> int | None:
    """The version of a Hadoop catalog's metadata file (``v12.metadata.json`` -> 12), else None."""
    if not (file_name.startswith("v") and file_name.endswith(".metadata.json")):
        return None
    stem = file_name[1:-len(".metadata.json")]
    return int(stem) if stem.isdigit() else None


def parse_metadata(data: bytes, path: str) -> list[IcebergSnapshot]:
    """The current snapshot and its ancestors, oldest first (a rolled-back branch is not the table)."""
    try:
        doc = json.loads(data.decode("utf-8"))
        by_id = {int(s["snapshot-id"]): IcebergSnapshot(
            int(s["snapshot-id"]), None if s.get("parent-snapshot-id") is None else int(s["parent-snapshot-id"]),
            int(s.get("timestamp-ms", 0)), {str(k): str(v) for k, v in (s.get("summary") or {}).items()})
            for s in doc.get("snapshots") or []}
        current = doc.get("current-snapshot-id")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointFormatError(path, f"not an Iceberg table metadata file: {exc}") from exc
    chain: list[IcebergSnapshot] = []
    at = None if current is None or int(current) < 0 else int(current)
    while at is not None and at in by_id:  # an expired ancestor ends the chain
        chain.append(by_id[at])
        at = by_id[at].parent_id
    return chain[::-1]


def carrying(snapshots: Sequence[IcebergSnapshot], sink: str, sequence: int) -> IcebergSnapshot | None:
    """The newest snapshot that carries (``sink``, ``sequence``), if any."""
    for snap in reversed(snapshots):
        if snap.sink == sink and snap.sequence == sequence:
            return snap
    return None


def colliding(expected: BatchIdentity, sequence: int, snap: IcebergSnapshot, location: str) -> str | None:
    """Why ``snap`` (carrying this sink's ``sequence``) is not ``expected``'s commit (None: it is).

    The Delta sink's rule (``foreign_commit``): another batch holding the sequence is a zombie of an
    older generation, a lost checkpoint's query or a restart whose ledger lagged the table; this
    batch then writes nothing, because writing would give two snapshots one sequence.
    """
    if foreign_commit(expected, sequence, snap.snapshot_id, identity_of(snap.doc())) is None:
        return None
    found = identity_of(snap.doc())
    by = ("a writer that did not name its batch (offset-ledger.* snapshot properties without this sink's record)"
          if found is None else f"sink {found.sink!r}, batch {found.batch_id} of generation {found.generation_id}"
                                f"{f' (query {found.query_id})' if found.query_id else ''}")
    return (f"snapshot {snap.snapshot_id} of {location} carries ({expected.sink}, sequence {sequence}) but was "
            f"written by {by}, not by batch {expected.batch_id} of generation {expected.generation_id} (query "
            f"{expected.query_id}): this batch's rows were not written and it is not recorded as committed. Stop "
            f"any driver still running an older generation, then restart with start_from_ledger(..., sinks=[sink]) "
            f"so the ledger records snapshot {snap.snapshot_id} before it plans (docs/sinks.md, Limits)")


def not_recorded(snapshots: Sequence[IcebergSnapshot], sink: str, known_sequence: int) -> list[IcebergSnapshot]:
    """The sink's snapshots above the ledger's last sequence, oldest first: what a restart must record."""
    return [s for s in snapshots if s.sink == sink and s.sequence is not None and s.sequence > known_sequence]
