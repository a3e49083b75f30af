"""RetentionInsight's reads and caches with a fake cluster, and the /metrics gauge it feeds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from offset_ledger.api.metrics import render_metrics
from offset_ledger.errors import KafkaUnavailable
from offset_ledger.operate.answers import MetricsSnapshot, PartitionLag
from offset_ledger.operate.retention_insight import RetentionInsight, pipeline_headroom
from offset_ledger.rules.model import TopicPartition

NOW = 1_700_000_000_000


def cfg(policy: str = "delete", ms: int = 600_000, size: int = -1) -> dict[str, Any]:
    return {"cleanup.policy": {"value": policy}, "retention.ms": {"value": str(ms)},
            "retention.bytes": {"value": str(size)}, "segment.bytes": {"value": "1073741824"},
            "segment.ms": {"value": "604800000"}}


class FakeAdmin:
    """The adapter's two calls the insight makes: DescribeConfigs through ``_admin_call``, and ``log_sizes``."""

    def __init__(self, configs: dict[str, dict[str, Any]], sizes: dict[str, int] | None = None) -> None:
        self.configs, self.sizes, self.calls = configs, sizes or {}, []
        self.fail = False

    def _admin_call(self, name: str, *args: Any) -> Any:
        self.calls.append((name, args))
        if self.fail:
            raise KafkaUnavailable("down")
        assert name == "describe_configs"
        return {"topic": {r.name: self.configs.get(r.name, {}) for r in args[0]}}

    def log_sizes(self, topics: Sequence[str]) -> dict[TopicPartition, int]:
        self.calls.append(("log_sizes", (list(topics),)))
        if self.fail:
            raise KafkaUnavailable("down")
        return {TopicPartition(t, 0): n for t, n in self.sizes.items() if t in topics}


def rows() -> list[tuple[str, str, PartitionLag]]:
    return [("p", "p", PartitionLag("timed", 0, 5, 0, 20)),       # unread, deletes by time
            ("p", "p", PartitionLag("timed", 1, 20, 0, 20)),      # caught up
            ("p", "p", PartitionLag("kept", 0, 5, 0, 20)),        # compacted
            ("p", "p", PartitionLag("sized", 0, 5, 0, 20)),       # retention.bytes
            ("p", "p", PartitionLag("timed", 2, 3, 8, 20))]       # lost


def test_reads_once_per_ttl_and_only_what_the_rule_needs() -> None:
    kafka = FakeAdmin({"timed": cfg(), "kept": cfg("compact"), "sized": cfg(ms=-1, size=3000)}, {"sized": 2000})
    asked: list[Sequence[PartitionLag]] = []

    def stamps(xs: Sequence[PartitionLag]) -> dict[tuple[str, int, int], int]:
        asked.append(xs)
        return {(x.topic, x.partition, x.next_offset): NOW - 60_000 for x in xs if x.next_offset is not None}

    insight = RetentionInsight()
    out = insight.apply(kafka, rows(), stamps, now_ms=NOW, warn=3600)  # type: ignore[arg-type]
    got = {(x.topic, x.partition): x.headroom for _, _, x in out}
    assert got[("timed", 0)].seconds == 540 and got[("timed", 0)].status == "WARN"
    assert got[("timed", 1)].basis == "caught-up" and got[("kept", 0)].basis == "compacted"
    assert got[("timed", 2)].status == "ERR" and got[("timed", 2)].lost_records == 5
    # 2000 bytes over 20 records; 15 unread = 1500 of 3000 bytes: 15 records of room, at 15 a minute: 60 s
    assert got[("sized", 0)].basis == "size" and abs(got[("sized", 0)].seconds - 60) < 1e-6
    # Timestamps only where a figure needs one: unread partitions of deleting topics (not compacted, caught up, lost).
    assert sorted((x.topic, x.partition) for x in asked[0]) == [("sized", 0), ("timed", 0)]
    assert [c[0] for c in kafka.calls] == ["describe_configs", "log_sizes"]
    assert kafka.calls[1][1] == (["sized"],)  # sizes only for the size-limited topic

    insight.apply(kafka, rows(), stamps, now_ms=NOW, warn=3600)  # type: ignore[arg-type]
    assert [c[0] for c in kafka.calls] == ["describe_configs", "log_sizes"]  # both cached
    assert pipeline_headroom(out)[("p", "p")].status == "ERR"


def test_expired_settings_are_read_again() -> None:
    kafka = FakeAdmin({"timed": cfg()})
    insight = RetentionInsight(config_ttl=0)
    for _ in range(2):
        insight.apply(kafka, rows()[:1], lambda xs: {}, now_ms=NOW, warn=3600)  # type: ignore[arg-type]
    assert [c[0] for c in kafka.calls] == ["describe_configs", "describe_configs"]


def test_a_failed_read_leaves_the_figure_unknown_and_never_raises() -> None:
    kafka = FakeAdmin({"timed": cfg()})
    kafka.fail = True
    out = RetentionInsight().apply(kafka, rows(), lambda xs: {}, now_ms=NOW, warn=3600)  # type: ignore[arg-type]
    got = {(x.topic, x.partition): x.headroom for _, _, x in out}
    assert got[("timed", 0)].status is None and got[("timed", 0)].basis == "unknown"
    assert got[("timed", 2)].status == "ERR"  # lost is known from the watermarks alone
    assert got[("timed", 1)].basis == "caught-up"


def test_the_gauge_reports_seconds_zero_and_inf_and_skips_no_figure() -> None:
    kafka = FakeAdmin({"timed": cfg(), "kept": cfg("compact"), "sized": cfg(ms=-1, size=3000)}, {"sized": 2000})
    def stamps(xs: Sequence[PartitionLag]) -> dict[tuple[str, int, int], int]:
        return {(x.topic, x.partition, x.next_offset): NOW - 60_000 for x in xs if x.next_offset is not None}

    out = RetentionInsight().apply(kafka, rows(), stamps, now_ms=NOW, warn=3600)  # type: ignore[arg-type]
    text = render_metrics(MetricsSnapshot((), tuple(out), (), True))
    lines = [x for x in text.splitlines() if x.startswith("offset_ledger_retention_headroom_seconds")]
    assert "# TYPE offset_ledger_retention_headroom_seconds gauge" in text
    series = 'offset_ledger_retention_headroom_seconds{pipeline="p",consumer_group="p",topic="timed",partition="%d"} %s'
    assert series % (0, "540") in lines
    assert series % (1, "+Inf") in lines  # caught up: nothing unread can be deleted
    assert series % (2, "0") in lines     # lost
    assert not any('topic="kept"' in x for x in lines)
