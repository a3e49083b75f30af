"""Persistence: the ledger schema (``tables``), engines and migrations (``engine``), and the stores."""

#: The front door: the modules of this layer that other layers may import (tests/unit/project/
#: test_layers.py holds every import to it). The rest are this layer's own rooms.
FRONT_DOOR = frozenset({
    "activity", "audit_store", "batch_ranges", "catalog", "console_queries", "demo_reads", "engine",
    "generations", "heartbeats", "lag_window", "locks", "loss_reads", "mirror_reads", "partitions",
    "policy_store", "position_check", "prune", "queries", "reconcile_store", "recorder", "records",
    "reset_store", "restart_state", "row_security", "sink_outputs", "sink_store", "sink_target", "tables",
    "target_copy", "verify_reads", "verify_rows"
})
