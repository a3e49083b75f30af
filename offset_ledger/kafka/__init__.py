"""The Kafka adapter: the one place the cluster is read (offsets, topic ids, timestamps) and written (the consumer-group mirror), with its client settings."""

#: The front door: the modules of this layer that other layers may import (tests/unit/project/
#: test_layers.py holds every import to it). The rest are this layer's own rooms.
FRONT_DOOR = frozenset({
    "adapter", "client_config", "mirror", "mm2_checkpoints", "retention_reads"
})
