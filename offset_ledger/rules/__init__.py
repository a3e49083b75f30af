"""The rules: pure logic, no I/O. Imports nothing outside ``offset_ledger.rules`` but the exception tree (``offset_ledger.errors``); no database, Kafka, Spark or web library."""

#: The front door: the modules of this layer that other layers may import (tests/unit/project/
#: test_layers.py holds every import to it). The rest are this layer's own rooms.
FRONT_DOOR = frozenset({
    "authority", "checkpoint", "coalesce", "delta_log", "durations", "failover",
    "iceberg_snapshots", "incarnation", "kafka_sink", "liveness", "model", "move_cost", "plan", "policies",
    "progress", "pruned", "read_shortfall", "resets", "resolver", "restart_options", "restart_request",
    "restart_requirements", "retention",
    "scope", "sink_ahead", "sink_batch", "sink_copy", "sink_identity", "spark_connector", "stateful", "status",
    "verify"
})
