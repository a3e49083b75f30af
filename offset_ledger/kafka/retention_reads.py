"""Each topic's retention settings for the headroom (``offset_ledger.rules.retention``), from one
DescribeConfigs request for every topic asked.

It goes through the adapter's admin client (``KafkaAdapter._admin_call``: retriable answers retried
within the request timeout, errors translated onto ``offset_ledger.errors``). Partition sizes, for
topics limited by ``retention.bytes``, are ``KafkaAdapter.log_sizes`` (DescribeLogDirs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from offset_ledger.rules.retention import RetentionSettings

if TYPE_CHECKING:
    from offset_ledger.kafka.adapter import KafkaAdapter

KEYS = ("cleanup.policy", "retention.ms", "retention.bytes", "segment.bytes", "segment.ms")


def topic_retention(kafka: KafkaAdapter, topics: Sequence[str]) -> dict[str, RetentionSettings]:
    """Retention settings of ``topics`` as the broker applies them (topic overrides, else its
    defaults); a topic the broker reports nothing for (unknown, not authorized) is absent."""
    from kafka.admin import ConfigResource, ConfigResourceType

    if not topics:
        return {}
    resources = [ConfigResource(ConfigResourceType.TOPIC, t, configs={k: None for k in KEYS})
                 for t in sorted(set(topics))]
    # config_filter="all": defaults too (the default "modified" leaves out every key not overridden).
    answer = kafka._admin_call("describe_configs", resources, False, "all") or {}
    out = {}
    for topic, configs in (answer.get("topic") or {}).items():
        if not configs:
            continue
        out[topic] = RetentionSettings(
            cleanup_policy=str(_value(configs, "cleanup.policy") or "delete"),
            retention_ms=_int(_value(configs, "retention.ms")),
            retention_bytes=_int(_value(configs, "retention.bytes")),
            segment_bytes=_int(_value(configs, "segment.bytes")),
            segment_ms=_int(_value(configs, "segment.ms")))
    return out


def _value(configs: dict[str, Any], key: str) -> Any:
    entry = configs.get(key)
    if isinstance(entry, dict):
        return entry.get("value", entry.get("config_value"))
    return entry


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None
