"""The cost of a move (offset_ledger.rules.move_cost), checked against a record-by-record oracle."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from offset_ledger.rules.model import TopicPartition, Watermarks
from offset_ledger.rules.move_cost import Move, human_bytes, human_span, move_cost, wanted_timestamps
from offset_ledger.operate.answers import move_cost_answer

TP = TopicPartition("orders", 0)


@st.composite
def scenario(draw):  # type: ignore[no-untyped-def]
    start = draw(st.integers(0, 50))
    end = draw(st.integers(start, start + 60))
    before = draw(st.integers(0, end + 20))
    after = draw(st.integers(0, end + 20))
    size = draw(st.integers(0, 10_000))
    return Watermarks(start, end), before, after, size


@given(scenario())
def test_records_are_exactly_the_existing_offsets_between_the_two_positions(case) -> None:  # type: ignore[no-untyped-def]
    marks, before, after, size = case
    # The oracle: offsets one by one. Behind re-reads [after, before); ahead skips [before, after);
    # only offsets still in the log [log-start, log-end) count.
    lo, hi = min(before, after), max(before, after)
    passed = [o for o in range(lo, hi) if marks.log_start_offset <= o < marks.log_end_offset]
    times = {(TP, o): 1_000 * o for o in range(marks.log_start_offset, marks.log_end_offset)}
    cost = move_cost([Move(TP, before, after)], {TP: marks}, {TP: size}, times)
    (p,) = cost.partitions
    assert p.records == len(passed)
    assert cost.records_reread == (len(passed) if after < before else 0)
    assert cost.records_skipped == (len(passed) if after > before else 0)
    assert p.direction == ("none" if after == before else "reread" if after < before else "skip")
    if passed:
        assert (p.first_offset, p.last_offset) == (passed[0], passed[-1])
        assert p.span_ms == 1_000 * (passed[-1] - passed[0])
        stored = marks.log_end_offset - marks.log_start_offset
        assert p.approx_bytes == round(size * len(passed) / stored)
        assert set(wanted_timestamps([Move(TP, before, after)], {TP: marks})) == {(TP, passed[0]), (TP, passed[-1])}
    else:
        assert p.approx_bytes == 0 and p.span_ms is None
        assert wanted_timestamps([Move(TP, before, after)], {TP: marks}) == []


def test_totals_and_unknowns() -> None:
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    marks = {a: Watermarks(0, 100), b: Watermarks(0, 100)}
    moves = [Move(a, 80, 30), Move(b, 10, 40)]
    cost = move_cost(moves, marks, {a: 1000}, {(a, 30): 5_000, (a, 79): 9_000})
    assert (cost.records_reread, cost.records_skipped) == (50, 30)
    assert cost.bytes_reread == 500 and cost.bytes_skipped is None  # b's size unknown
    assert cost.span("reread") == (5_000, 9_000) and cost.span("skip") == (None, None)
    assert not cost.complete
    doc = move_cost_answer(cost)
    assert doc["reread"]["records"] == 50 and doc["reread"]["spanSeconds"] == 4.0
    assert doc["skip"]["approxBytes"] is None and doc["complete"] is False
    assert [p["partition"] for p in doc["partitions"]] == [0, 1]


def test_human_figures() -> None:
    assert human_bytes(None) == "?" and human_bytes(512) == "512 B" and human_bytes(1536) == "1.5 KB"
    assert human_span(None) == "?" and human_span(90_000) == "90.0 s" and human_span(3 * 3600_000) == "3.0 h"
