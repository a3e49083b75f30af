"""The Kafka sink's pure rules: what a batch must carry, what a task writes and commits, what a restart records.

The real-stack cases are ``tests/integration/test_sink_kafka.py`` (and the long one with SIGKILLs).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from offset_ledger.rules.kafka_sink import (
    MAX_MARK_CHARS,
    Mark,
    batch_partitions,
    commit_position,
    missing_columns,
    refusal,
    scan_assignment,
    task_totals,
    to_write,
    transactional_id,
    unrecorded,
)

SINK = "orders:orders_out"


def test_a_batch_needs_its_source_columns_and_a_value() -> None:
    assert missing_columns(["key", "value", "topic", "partition", "offset"], "value") == []
    assert missing_columns(["key", "value"], "value") == ["topic", "partition", "offset"]
    assert missing_columns(["topic", "partition", "offset", "n"], "value") == ["value"]
    why = refusal(SINK, ["offset"], ["topic", "partition", "value"])
    assert "no offset column" in why and "nothing was written" in why and SINK in why


def test_one_transactional_id_per_sink_and_source_partition() -> None:
    ids = {transactional_id("p", SINK, t, n) for t in ("a", "b") for n in range(3)}
    assert len(ids) == 6
    assert transactional_id("p", SINK, "a", 1) == "p.orders:orders_out.a.1"


@given(offsets=st.lists(st.integers(0, 200), unique=True), committed=st.none() | st.integers(0, 250))
def test_a_rerun_writes_exactly_what_the_group_does_not_hold(offsets: list[int], committed: int | None) -> None:
    """Two attempts at a partition: the first committed up to ``committed``; together they write each offset once."""
    second = [o for o in offsets if to_write(o, committed)]
    first = [o for o in offsets if committed is not None and o < committed]
    assert sorted(first + second) == sorted(offsets)
    assert not set(first) & set(second)


@given(until=st.none() | st.integers(0, 100), last=st.none() | st.integers(0, 100),
       committed=st.none() | st.integers(0, 100))
def test_the_committed_position_never_moves_back_and_covers_the_batch(until: int | None, last: int | None,
                                                                       committed: int | None) -> None:
    if until is None and last is None and committed is None:
        return
    pos = commit_position(until, last, committed)
    assert committed is None or pos >= committed
    assert until is None or pos >= until
    assert last is None or pos > last


def test_the_batch_end_wins_over_the_last_row_filtered_rows_included() -> None:
    # rows 10..14 survive a filter of a batch that read 10..20: the position is the batch's end, 20
    assert commit_position(20, 14, 10) == 20
    # a re-run of a batch the group already passed: it stays where it is
    assert commit_position(20, 19, 25) == 25


def test_empty_ranges_are_no_partitions_of_the_batch() -> None:
    assert batch_partitions([("t", 0, 5, 5), ("t", 1, 5, 9), ("t", 2, None, 3)]) == {("t", 1): (5, 9),
                                                                                     ("t", 2): (None, 3)}


def _mark(seq: int, n: int, doc: bool = True, batch_id: int | None = None) -> Mark:
    return Mark(SINK, seq, 1, seq - 1 if batch_id is None else batch_id, "q1", n,
                {"query_id": "q1", "batch_id": seq - 1} if doc else None)


def test_a_mark_round_trips_and_drops_the_record_when_it_is_too_long() -> None:
    m = _mark(3, 2)
    back = Mark.decode(m.encode())
    assert back == m and back is not None and back.batch == m.batch
    big = Mark(SINK, 3, 1, 2, "q1", 2, {"ranges": ["x" * 50] * 100})
    encoded = big.encode()
    assert len(encoded) <= MAX_MARK_CHARS
    assert Mark.decode(encoded) == big and Mark.decode(encoded).batch is None  # type: ignore[union-attr]
    assert Mark.decode(None) is None and Mark.decode("") is None and Mark.decode("{}") is None
    assert Mark.decode("not json") is None and Mark.decode('{"ol": 1}') is None


def test_only_whole_batches_the_ledger_lacks_are_recorded() -> None:
    whole = {("t", 0): _mark(4, 2), ("t", 1): _mark(4, 2), ("t", 2): _mark(3, 1)}
    assert [m.sequence for m in unrecorded(whole, SINK, 3)] == [4]
    assert [m.sequence for m in unrecorded(whole, SINK, 2)] == [3, 4]
    assert unrecorded(whole, SINK, 4) == []
    # sequence 4 decided twice: generation 1's batch 3 died after one of its two partitions, then a restart's
    # batch 0 (generation 2) got sequence 4 and committed both of its partitions: that one is whole
    old = Mark(SINK, 4, 1, 3, "q1", 2, {"x": "old"})
    new = Mark(SINK, 4, 2, 0, "q2", 2, {"x": "new"})
    assert [m.batch for m in unrecorded({("t", 0): new, ("t", 1): new, ("t", 2): old}, SINK, 3)] == [{"x": "new"}]
    # one of two partitions committed: the driver died between them; the re-run's skip covers it
    assert unrecorded({("t", 0): _mark(4, 2), ("t", 1): _mark(3, 1)}, SINK, 3) == []
    # another sink's marks, a mark without the batch's record, no mark at all: nothing to record
    other = Mark("other", 9, 1, 8, "q1", 1, {"x": 1})
    assert unrecorded({("t", 0): other, ("t", 1): None, ("t", 2): _mark(9, 1, doc=False)}, SINK, 0) == []


@given(n=st.integers(1, 6), committed=st.integers(0, 6))
def test_a_batch_is_whole_exactly_when_all_its_partitions_carry_its_mark(n: int, committed: int) -> None:
    marks = {("t", p): (_mark(5, n) if p < committed else _mark(4, 1)) for p in range(n)}
    found = [m.sequence for m in unrecorded(marks, SINK, 4)]
    assert found == ([5] if committed >= n else [])


RANGES = {("a", 0): (0, 10), ("a", 1): (5, 9), ("b", 0): (None, 3)}


def test_the_scan_is_the_grouping_when_each_spark_partition_reads_one_whole_source_partition() -> None:
    scan = [[("a", 1, 5, 9)], [("b", 0, 0, 3)], [("a", 0, 0, 10)], [("c", 0, 7, 7)]]
    assert scan_assignment(scan, RANGES) == ([("a", 1), ("b", 0), ("a", 0), None], "")


def test_the_shuffle_stays_unless_the_scan_is_one_whole_source_partition_per_spark_partition() -> None:
    assert scan_assignment(None, RANGES)[0] is None  # not a one-to-one chain over the scan
    split = [[("a", 0, 0, 5)], [("a", 0, 5, 10)], [("a", 1, 5, 9)], [("b", 0, 0, 3)]]  # minPartitions
    assert "a[0] 0-5, the batch 0-10" in scan_assignment(split, RANGES)[1]
    twice = [[("a", 0, 0, 10)], [("a", 0, 0, 10)], [("a", 1, 5, 9)], [("b", 0, 0, 3)]]
    assert "more than one Spark partition" in scan_assignment(twice, RANGES)[1]
    two = [[("a", 0, 0, 10), ("a", 1, 5, 9)], [("b", 0, 0, 3)]]  # a coalesced read
    assert "reads 2 Kafka ranges" in scan_assignment(two, RANGES)[1]
    other = [[("a", 0, 0, 10)], [("a", 1, 5, 8)], [("b", 0, 0, 3)]]  # not the batch's own range
    assert "a[1] 5-8, the batch 5-9" in scan_assignment(other, RANGES)[1]
    foreign = [[("a", 0, 0, 10)], [("a", 1, 5, 9)], [("b", 0, 0, 3)], [("c", 0, 0, 1)]]
    assert "do not hold" in scan_assignment(foreign, RANGES)[1]


def test_the_tasks_timings_are_summed_per_phase() -> None:
    got = task_totals([{"init_ms": 2.0, "rows_ms": 5.0}, {"init_ms": 1.0, "new_producers": 1.0}])
    assert got["tasks_init_ms"] == 3.0 and got["tasks_rows_ms"] == 5.0 and got["tasks_new_producers"] == 1.0
    assert got["tasks_commit_ms"] == 0.0
