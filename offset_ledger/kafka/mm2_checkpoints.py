"""MirrorMaker 2's checkpoints, read from the target cluster with kafka-python (no JVM), and a cluster's id.

``<source alias>.checkpoints.internal`` is a compacted topic on the target; reading it from the
beginning to the end offsets seen at the start gives every group's newest translation (the last
record per key wins). Records are decoded by ``offset_ledger.rules.failover.decode_checkpoint``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from offset_ledger.errors import FailoverRefused, KafkaError
from offset_ledger.kafka.client_config import client_configs
from offset_ledger.kafka.client_errors import translate_error as _translate
from offset_ledger.rules.failover import (
    Mm2Checkpoint,
    decode_checkpoint,
    latest_checkpoints,
)
from offset_ledger.rules.model import TopicPartition

log = logging.getLogger(__name__)


def read_checkpoints(bootstrap_servers: str, topic: str, consumer_group: str, *,
                     options: Mapping[str, Any] | None = None,
                     timeout_s: float = 30.0) -> dict[TopicPartition, Mm2Checkpoint]:
    """The newest MM2 checkpoint per target partition of ``consumer_group`` in ``topic``.

    FailoverRefused when the topic does not exist (MM2 never checkpointed into this cluster under
    that source alias); KafkaError when the end offsets are not reached within ``timeout_s``.
    """
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    configs = client_configs(bootstrap_servers, options)
    configs.setdefault("request_timeout_ms", 10000)
    configs.setdefault("bootstrap_timeout_ms", configs["request_timeout_ms"])
    configs.setdefault("client_id", "offset-ledger-failover")
    try:
        consumer = KafkaConsumer(group_id=None, enable_auto_commit=False, allow_auto_create_topics=False,
                                 auto_offset_reset="earliest", **configs)
    except Exception as exc:
        raise _translate(exc, bootstrap_servers) from exc
    try:
        try:
            if topic not in consumer.topics():
                raise FailoverRefused(
                    f"no MirrorMaker 2 checkpoints topic {topic!r} on {bootstrap_servers} (is MM2 replicating into "
                    "this cluster, with that source alias and emit.checkpoints.enabled?)",
                    reason="no_checkpoints_topic", topic=topic)
            parts = [KTP(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
            consumer.assign(parts)
            consumer.seek_to_beginning(*parts)
            ends = {tp: int(o) for tp, o in consumer.end_offsets(parts).items()}
            records: list[Mm2Checkpoint] = []
            deadline = time.monotonic() + timeout_s
            while any(consumer.position(tp) < end for tp, end in ends.items()):
                if time.monotonic() >= deadline:
                    raise KafkaError(f"reading {topic} on {bootstrap_servers} did not reach its end within "
                                     f"{timeout_s:.0f} s", topic=topic)
                for _tp, batch in sorted(consumer.poll(timeout_ms=500).items(), key=lambda kv: kv[0].partition):
                    # The key is what compaction keeps one of: only a key's last record counts.
                    records.extend(decode_checkpoint(r.key, r.value) for r in batch if r.value is not None)
        except (FailoverRefused, KafkaError):
            raise
        except Exception as exc:
            raise _translate(exc, bootstrap_servers) from exc
    finally:
        consumer.close()
    found = latest_checkpoints(records, consumer_group)
    log.debug("%d MM2 checkpoint(s) of group %s in %s", len(found), consumer_group, topic)
    return found


def cluster_id(bootstrap_servers: str, options: Mapping[str, Any] | None = None) -> str | None:
    """The cluster's id (what ``kafka-storage format -t`` set), or None when the broker does not say."""
    from kafka import KafkaAdminClient

    configs = {k: v for k, v in client_configs(bootstrap_servers, options).items() if k != "allow_auto_create_topics"}
    configs.setdefault("request_timeout_ms", 10000)
    try:
        admin = KafkaAdminClient(**configs)
    except Exception as exc:
        raise _translate(exc, bootstrap_servers) from exc
    try:
        found = admin.describe_cluster().get("cluster_id")
        return str(found) if found else None
    except Exception as exc:
        raise _translate(exc, bootstrap_servers) from exc
    finally:
        admin.close()
