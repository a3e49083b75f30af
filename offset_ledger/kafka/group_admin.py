"""Consumer groups through kafka-python's admin client: members, committed offsets, and commits made
without joining the group (the consumer-group mirror and drift). ``KafkaAdapter`` inherits this."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from offset_ledger.kafka.client_errors import is_connection_error, translate_error
from offset_ledger.rules.model import TopicPartition

log = logging.getLogger(__name__)


class GroupAdmin:
    """The consumer-group part of ``KafkaAdapter`` (its lock, client settings and admin client)."""

    _lock: threading.Lock
    _configs: dict[str, Any]
    _bootstrap: Any
    _admin: Any

    def _admin_client(self) -> Any:
        if self._admin is None:
            from kafka import KafkaAdminClient

            configs = {k: v for k, v in self._configs.items() if k != "allow_auto_create_topics"}
            try:
                self._admin = KafkaAdminClient(**configs)
            except Exception as exc:
                raise translate_error(exc, self._bootstrap) from exc
        return self._admin

    def _admin_call(self, fn_name: str, *args: Any) -> Any:
        # A group's first request on a fresh cluster meets COORDINATOR_NOT_AVAILABLE while the broker
        # creates __consumer_offsets: such retriable answers are retried within the request timeout.
        deadline = time.monotonic() + self._configs["request_timeout_ms"] / 1000
        while True:
            with self._lock:
                admin = self._admin_client()
                try:
                    return getattr(admin, fn_name)(*args)
                except Exception as exc:
                    if is_connection_error(exc):
                        self._close_admin()
                        raise translate_error(exc, self._bootstrap) from exc
                    if not getattr(exc, "retriable", False) or time.monotonic() >= deadline:
                        raise translate_error(exc, self._bootstrap) from exc
                    log.debug("retrying %s: %s", fn_name, exc)
            time.sleep(0.2)

    def _close_admin(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            try:
                admin.close()
            except Exception:  # noqa: BLE001
                log.debug("error closing Kafka admin client", exc_info=True)

    def group_members(self, groups: Sequence[str]) -> dict[str, int]:
        """Active members per consumer group (0 for an empty or unknown group)."""
        if not groups:
            return {}
        described = self._admin_call("describe_groups", list(groups))
        out = {g: 0 for g in groups}
        for group, info in (described or {}).items():
            state = str(info.get("group_state") or info.get("state") or "").lower()
            members = info.get("members") or []
            out[group] = 0 if state in ("empty", "dead") else len(members)
        return out

    def committed_offsets(self, groups: Sequence[str]) -> dict[str, dict[TopicPartition, tuple[int, str]]]:
        """Committed (next offset, metadata) per partition of each group; one request per coordinator."""
        if not groups:
            return {}
        fetched = self._admin_call("list_group_offsets", {g: None for g in groups})
        return {group: {TopicPartition(tp.topic, tp.partition): (int(om.offset), om.metadata or "")
                        for tp, om in offsets.items() if om.offset is not None and om.offset >= 0}
                for group, offsets in (fetched or {}).items()}

    def commit_group_offsets(self, group: str, offsets: Mapping[TopicPartition, tuple[int, str]]) -> dict[TopicPartition, str]:
        """Commit (next offset, metadata) for a group WITHOUT joining it; partitions the broker refused -> error name.

        The broker only accepts such a commit for a group with no active members (Empty or
        unknown); otherwise every partition comes back refused (UNKNOWN_MEMBER_ID and the like).
        """
        from kafka import TopicPartition as KTP
        from kafka.structs import OffsetAndMetadata

        if not offsets:
            return {}
        request = {KTP(tp.topic, tp.partition): OffsetAndMetadata(int(o), meta, None)
                   for tp, (o, meta) in offsets.items()}
        answer = self._admin_call("alter_group_offsets", group, request)
        return {TopicPartition(k.topic, k.partition): err.__name__
                for k, err in (answer or {}).items() if getattr(err, "errno", 0) != 0}
