"""Capture: what records committed batches (the Spark listener, its durable writer and spool, the checkpoint reconciler and watcher). Writes the ledger; never imports the operator verbs (``offset_ledger.operate``)."""

#: The front door: the modules of this layer that other layers may import (tests/unit/project/
#: test_layers.py holds every import to it). The rest are this layer's own rooms.
FRONT_DOOR = frozenset({
    "checkpoint_files", "listener", "reconcile"
})
