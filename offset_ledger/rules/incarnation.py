"""Pure: is the checkpoint at a generation's location still the incarnation the ledger knows?

A path is not an identity. A checkpoint directory can be deleted and re-created at the same place;
Spark then starts a *new* query (a new id in ``metadata``) whose batch ids begin at 0 again. The
ledger names a batch by (generation, batch id) and a sink keys its commits the same way, so a new
query under an old generation's name would have its batches taken for the old query's (a sink
skips them as "already committed"). A generation's checkpoint is therefore identified by what
Spark wrote in it: the query id that claimed the generation. A restart that finds the current
generation's checkpoint gone, empty, or holding another query plans a new generation (a new
incarnation, from the ledger's positions) instead of reusing the old name.

No I/O: ``offset_ledger.capture.reconcile`` reads the checkpoint, the restart decides.
"""

from __future__ import annotations

from typing import Literal

from offset_ledger.rules.model import Finding

#: ``same``: the checkpoint holds the query the ledger knows (or none ran yet: nothing to tell apart);
#: ``lost``: the directory is gone; ``emptied``: it exists but holds no query; ``recreated``: it
#: holds another query than the one that ran on the generation.
Incarnation = Literal["same", "lost", "emptied", "recreated"]


def checkpoint_incarnation(*, ran: bool, exists: bool, claimed_query_id: str | None,
                           found_query_id: str | None) -> Incarnation:
    """What the checkpoint at the generation's location is, compared with what ran on it.

    ``ran``: the ledger knows a query ran on the generation (it claimed it, or a sink committed a
    batch of it). ``exists``: the location is there; ``found_query_id``: the id in its ``metadata``
    (None: no metadata, nothing started there).
    """
    if found_query_id is not None:
        if claimed_query_id is not None and found_query_id != claimed_query_id:
            return "recreated"
        return "same"
    if not ran:
        return "same"  # handed out and never started: no batch id was used under this generation
    return "emptied" if exists else "lost"


def incarnation_finding(incarnation: Incarnation, *, generation: int, location: str,
                        claimed_query_id: str | None, found_query_id: str | None) -> Finding | None:
    """The finding a restart stores and returns for a checkpoint that is not the known incarnation."""
    if incarnation == "same":
        return None
    ran = f"query {claimed_query_id}" if claimed_query_id else "a query"
    if incarnation == "recreated":
        what = f"was re-created by query {found_query_id} ({ran} ran on it)"
    elif incarnation == "lost":
        what = f"is gone ({ran} ran on it)"
    else:
        what = f"is empty ({ran} ran on it)"
    text = (f"checkpoint of generation {generation} at {location} {what}: Spark would start a new query whose "
            f"batch ids begin at 0 again, so the restart opens a fresh generation from the ledger's positions "
            f"instead of reusing generation {generation}'s batch ids")
    kind = "checkpoint_recreated" if incarnation == "recreated" else "checkpoint_lost"
    return Finding(kind, text, details={
        "generation": generation, "checkpoint_location": location, "incarnation": incarnation,
        "query_id": claimed_query_id, "found_query_id": found_query_id})
