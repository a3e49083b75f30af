"""Retention headroom from literals and generated cases (offset_ledger.rules.retention)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from offset_ledger.rules.retention import (
    Headroom,
    PartitionRetention,
    RetentionSettings,
    headroom,
    human_duration,
    worst,
)

NOW = 1_700_000_000_000
HOUR = 3600.0
WEEK_MS = 7 * 24 * 3600 * 1000
DELETE = RetentionSettings("delete", WEEK_MS, -1, 1 << 30, WEEK_MS)


def x(**kw) -> PartitionRetention:  # type: ignore[no-untyped-def]
    base = dict(position=100, log_start=0, log_end=200, settings=DELETE, now_ms=NOW,
                position_timestamp_ms=NOW - 3_600_000)
    base.update(kw)
    return PartitionRetention(**base)  # type: ignore[arg-type]


def test_time_bound_is_the_record_at_the_position_plus_retention() -> None:
    h = headroom(x(), HOUR)
    assert h == Headroom(WEEK_MS / 1000 - 3600, "OK", "time")


def test_warn_below_the_threshold() -> None:
    s = RetentionSettings("delete", 2 * 3_600_000, -1)
    h = headroom(x(settings=s, position_timestamp_ms=NOW - 90 * 60_000), HOUR)  # 30 minutes left
    assert h == Headroom(1800.0, "WARN", "time")
    assert headroom(x(settings=s, position_timestamp_ms=NOW - 30 * 60_000), HOUR).status == "OK"  # 90 min left


def test_due_but_not_yet_deleted_is_warn_with_zero() -> None:
    s = RetentionSettings("delete", 60_000, -1)
    assert headroom(x(settings=s, position_timestamp_ms=NOW - 120_000), HOUR) == Headroom(0.0, "WARN", "time")


def test_position_below_log_start_lost_records_is_err_with_zero() -> None:
    h = headroom(x(position=40, log_start=50), HOUR)
    assert h == Headroom(0.0, "ERR", "lost", 10)
    # whatever the policy: the records are gone already
    assert headroom(x(position=40, log_start=50, settings=RetentionSettings("compact")), HOUR).status == "ERR"


def test_position_at_log_end_has_nothing_at_risk() -> None:
    assert headroom(x(position=200, position_timestamp_ms=None), HOUR) == Headroom(None, "OK", "caught-up")
    # an empty partition too
    assert headroom(x(position=0, log_start=0, log_end=0), HOUR) == Headroom(None, "OK", "caught-up")


def test_compacted_topic_has_no_figure() -> None:
    h = headroom(x(settings=RetentionSettings("compact", WEEK_MS, -1)), HOUR)
    assert h == Headroom(None, None, "compacted")
    # compact,delete deletes by age as well
    assert headroom(x(settings=RetentionSettings("compact,delete", WEEK_MS, -1)), HOUR).basis == "time"


def test_infinite_retention() -> None:
    assert headroom(x(settings=RetentionSettings("delete", -1, -1)), HOUR) == Headroom(None, "OK", "unlimited")
    # -1 time but a size limit: the size bound
    h = headroom(x(settings=RetentionSettings("delete", -1, 10_000), partition_bytes=20_000), HOUR)
    assert h.basis == "size"


def test_unknown_inputs() -> None:
    assert headroom(x(log_end=None), HOUR) == Headroom(None, None, "unknown")
    assert headroom(x(position=None), HOUR).status is None
    assert headroom(x(settings=None), HOUR) == Headroom(None, None, "unknown")
    assert headroom(x(position_timestamp_ms=None), HOUR) == Headroom(None, None, "unknown")
    assert headroom(x(position=300), HOUR) == Headroom(None, None, "beyond-log-end")


def test_size_bound_from_the_unread_span_rate() -> None:
    # 200 retained records in 20,000 bytes (100 bytes each); 100 unread = 10,000 bytes, read an hour ago:
    # 100 records per hour. retention.bytes 15,000 leaves 5,000 bytes = 50 records = half an hour.
    s = RetentionSettings("delete", -1, 15_000)
    h = headroom(x(settings=s, partition_bytes=20_000), HOUR)
    assert h.basis == "size" and abs(h.seconds - 1800) < 1e-6 and h.status == "WARN"
    # an observed rate wins over the average: 1 record/s -> 50 s
    assert abs(headroom(x(settings=s, partition_bytes=20_000, append_rate=1.0), HOUR).seconds - 50) < 1e-6
    # nothing appended: size never reaches the limit
    assert headroom(x(settings=s, partition_bytes=20_000, append_rate=0.0), HOUR) == Headroom(None, "OK", "size")
    # unread bytes already past the limit: due now
    assert headroom(x(settings=s, partition_bytes=40_000), HOUR) == Headroom(0.0, "WARN", "size")
    # no size known: no size bound
    assert headroom(x(settings=s), HOUR) == Headroom(None, None, "unknown")


def test_the_smaller_bound_wins() -> None:
    s = RetentionSettings("delete", 2 * 3_600_000, 15_000)  # time: 1 h left; size: 30 min left
    assert headroom(x(settings=s, partition_bytes=20_000), 60).basis == "size"
    s = RetentionSettings("delete", 3_660_000, 15_000)  # time: 1 min left
    h = headroom(x(settings=s, partition_bytes=20_000), 60)
    assert h.basis == "time" and h.seconds == 60.0 and h.status == "OK"


def test_worst_partition() -> None:
    a, b, c = Headroom(100.0, "WARN", "time"), Headroom(50.0, "WARN", "time"), Headroom(9e9, "OK", "time")
    assert worst([c, a, b, Headroom(None, None, "compacted")]) == b
    assert worst([c, Headroom(0.0, "ERR", "lost", 3), b]).status == "ERR"
    assert worst([Headroom(None, "OK", "caught-up"), c]) == c
    assert worst([Headroom(None, None, "unknown")]) is None


def test_human_duration() -> None:
    assert [human_duration(v) for v in (None, 0, 12.9, 250, 3900, 2 * 86400 + 3 * 3600 + 5)] == [
        "-", "0s", "12s", "4m10s", "1h05m", "2d3h"]


offsets = st.integers(0, 10**12)


@settings(max_examples=1000, deadline=None)
@given(a=offsets, b=offsets, c=offsets, age=st.integers(-10**8, 10**11), retention=st.integers(-1, 10**11),
       size=st.integers(-1, 10**12), part_bytes=st.none() | st.integers(0, 10**13),
       policy=st.sampled_from(["delete", "compact", "compact,delete", "delete,compact"]),
       warn=st.floats(0, 10**7))
def test_properties(a: int, b: int, c: int, age: int, retention: int, size: int, part_bytes: int | None,
                    policy: str, warn: float) -> None:
    start, end = min(a, c), max(a, c)
    pos = b if b % 3 else start + (b % (end - start + 1))  # below log-start, inside, beyond log-end
    s = RetentionSettings(policy, retention, size)
    h = headroom(PartitionRetention(pos, start, end, s, NOW, NOW - age, part_bytes), warn)
    if pos < start:
        assert h.status == "ERR" and h.seconds == 0 and h.lost_records == start - pos
    else:
        assert h.status != "ERR" and h.lost_records == 0
    if pos > end:
        assert h == Headroom(None, None, "beyond-log-end")
    if start <= pos == end:
        assert h.status == "OK" and h.seconds is None
    if h.seconds is not None:
        assert h.seconds >= 0
        # never beyond the time bound: the record at the position dates its segment
        if s.time_limited and h.status != "ERR":
            assert h.seconds <= max(0.0, (NOW - age + retention - NOW) / 1000) + 1e-6
        if h.status in ("OK", "WARN"):
            assert (h.status == "WARN") == (h.seconds < warn)
    if "delete" not in policy and start <= pos < end:
        assert h == Headroom(None, None, "compacted")
    # the figure shrinks as time passes (same log, later clock)
    later = headroom(PartitionRetention(pos, start, end, s, NOW + 1000, NOW - age, part_bytes), warn)
    if h.seconds is not None and later.seconds is not None and h.basis == later.basis == "time":
        assert later.seconds <= h.seconds
