"""Transactional ``foreachBatch`` sinks: a batch's output and its ledger record commit as one fact.

May import ``capture``, ``ledger``, ``rules`` and the top-level ``errors``/``config``; never the
verbs (``operate``) or a face. ``docs/sinks.md`` states the guarantee and its limits. Every sink
is a ``Sink`` (``offset_ledger.sinks.protocol``): what ``foreachBatch`` and a restart call on it.

The names are imported lazily: Spark's Python workers unpickle the executors' staging function
from ``offset_ledger.ledger.target_copy``, and importing this package must not pull the driver side
(SQLAlchemy, the ledger) into every worker.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DeltaSink", "IcebergSink", "KafkaSink", "PostgresSink", "Sink"]


def __getattr__(name: str) -> Any:
    if name == "PostgresSink":
        from offset_ledger.sinks.postgres import PostgresSink

        return PostgresSink
    if name == "DeltaSink":
        from offset_ledger.sinks.delta import DeltaSink

        return DeltaSink
    if name == "IcebergSink":
        from offset_ledger.sinks.iceberg import IcebergSink

        return IcebergSink
    if name == "KafkaSink":
        from offset_ledger.sinks.kafka import KafkaSink

        return KafkaSink
    if name == "Sink":
        from offset_ledger.sinks.protocol import Sink

        return Sink
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

#: The front door: the modules of this layer that other layers may import (tests/unit/project/
#: test_layers.py holds every import to it). The rest are this layer's own rooms.
FRONT_DOOR = frozenset({
    "protocol"
})
