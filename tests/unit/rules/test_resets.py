"""Pure reset planning: literals in, per-partition before/target/bounds out."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offset_ledger.errors import InvalidInput, InvalidOffset, OffsetOutOfRange, UnknownPartition, UnknownTopic
from offset_ledger.rules.model import Position, TopicPartition, Watermarks
from offset_ledger.rules.resets import ResetRequest, parse_offsets_body, plan_reset, validate_offset

TP0, TP1, TP2 = TopicPartition("orders", 0), TopicPartition("orders", 1), TopicPartition("orders", 2)
MARKS = {TP0: Watermarks(100, 1000), TP1: Watermarks(0, 500), TP2: Watermarks(0, 0),
         TopicPartition("other", 0): Watermarks(0, 10)}
POSITIONS = [Position("orders", 0, 800), Position("orders", 1, 500)]  # partition 2 added since


def by_tp(plan):  # type: ignore[no-untyped-def]
    return {p.tp: p for p in plan.partitions}


def test_earliest_covers_every_current_partition_of_the_pipelines_topics() -> None:
    plan = plan_reset(ResetRequest("earliest"), POSITIONS, MARKS)
    parts = by_tp(plan)
    assert sorted(parts) == [TP0, TP1, TP2]  # "other" is not read by the pipeline
    assert parts[TP0].target_next_offset == 100 and parts[TP0].records_replayed == 700
    assert parts[TP1].target_next_offset == 0 and parts[TP1].records_replayed == 500
    assert parts[TP2].before_next_offset is None and parts[TP2].target_next_offset == 0
    assert plan.new_positions() == {"orders": {"0": 100, "1": 0, "2": 0}}
    assert not plan.out_of_range


def test_latest_skips_the_unread_records() -> None:
    parts = by_tp(plan_reset(ResetRequest("latest"), POSITIONS, MARKS))
    assert parts[TP0].target_next_offset == 1000
    assert parts[TP0].records_skipped == 200 and parts[TP0].records_replayed == 0
    assert parts[TP1].records_skipped == 0


def test_offsets_resolve_sentinels_to_concrete_bounds() -> None:
    req = ResetRequest("offsets", offsets={TP0: -2, TP1: -1, TP2: 0})
    parts = by_tp(plan_reset(req, POSITIONS, MARKS))
    assert (parts[TP0].target_next_offset, parts[TP1].target_next_offset, parts[TP2].target_next_offset) == (100, 500, 0)


def test_offsets_only_touch_named_partitions_unless_all_are_required() -> None:
    plan = plan_reset(ResetRequest("offsets", offsets={TP0: 300}), POSITIONS, MARKS)
    assert [p.tp for p in plan.partitions] == [TP0]
    with pytest.raises(InvalidInput) as info:
        plan_reset(ResetRequest("offsets", offsets={TP0: 300}, require_all_partitions=True), POSITIONS, MARKS)
    assert info.value.details["missing_partitions"] == [1, 2]


def test_unknown_partition_and_topic_are_refused() -> None:
    with pytest.raises(UnknownPartition):
        plan_reset(ResetRequest("offsets", offsets={TopicPartition("orders", 9): 1}), POSITIONS, MARKS)
    with pytest.raises(UnknownTopic):
        plan_reset(ResetRequest("earliest", scope={"nope": None}), POSITIONS, MARKS)
    with pytest.raises(UnknownPartition):
        plan_reset(ResetRequest("earliest", scope={"orders": (0, 7)}), POSITIONS, MARKS)


def test_scope_limits_partitions() -> None:
    plan = plan_reset(ResetRequest("latest", scope={"orders": (1,)}), POSITIONS, MARKS)
    assert [p.tp for p in plan.partitions] == [TP1]


def test_out_of_range_is_reported_then_refused_or_clamped() -> None:
    req = ResetRequest("offsets", offsets={TP0: 50, TP1: 900}, out_of_range="refuse")
    plan = plan_reset(req, POSITIONS, MARKS)
    parts = by_tp(plan)
    assert parts[TP0].out_of_range == "below_log_start" and parts[TP0].target_next_offset == 50
    assert parts[TP1].out_of_range == "above_log_end"
    assert plan.refused
    with pytest.raises(OffsetOutOfRange) as info:
        plan.check_executable()
    assert {x["partition"] for x in info.value.out_of_range} == {0, 1}

    clamped = plan_reset(ResetRequest("offsets", offsets={TP0: 50, TP1: 900}, out_of_range="clamp"),
                         POSITIONS, MARKS)
    parts = by_tp(clamped)
    assert (parts[TP0].target_next_offset, parts[TP1].target_next_offset) == (100, 500)
    assert parts[TP0].clamped and parts[TP0].requested_next_offset == 50
    clamped.check_executable()


def test_shift_moves_from_the_position_and_from_log_start_without_one() -> None:
    parts = by_tp(plan_reset(ResetRequest("shift", shift_by=-300, out_of_range="clamp"), POSITIONS, MARKS))
    assert parts[TP0].target_next_offset == 500 and parts[TP0].records_replayed == 300
    assert parts[TP1].target_next_offset == 200
    assert parts[TP2].target_next_offset == 0 and parts[TP2].clamped  # 0 - 300 clamped to log-start


def test_huge_shift_stays_a_64_bit_offset() -> None:
    plan = plan_reset(ResetRequest("shift", shift_by=2**63), POSITIONS, MARKS)
    assert all(p.requested_next_offset <= 2**63 - 1 for p in plan.partitions)
    assert plan.refused


def test_timestamp_uses_offsets_for_time_and_latest_when_nothing_is_that_new() -> None:
    req = ResetRequest("timestamp", timestamp_ms=1_700_000_000_000)
    parts = by_tp(plan_reset(req, POSITIONS, MARKS, {TP0: 400, TP1: None, TP2: None}))
    assert parts[TP0].target_next_offset == 400
    assert parts[TP1].target_next_offset == 500  # no record that new -> log-end
    assert req.parameters()["timestamp"].startswith("2023-11-14")


def test_nothing_to_reset_without_positions_or_scope() -> None:
    with pytest.raises(InvalidInput):
        plan_reset(ResetRequest("earliest"), [], MARKS)


@pytest.mark.parametrize("bad", [1.5, "12", True, None, -3, -100, 2**63, [1]])
def test_invalid_offsets(bad: object) -> None:
    with pytest.raises(InvalidOffset):
        validate_offset("t", 0, bad)


def test_offsets_body_parsing() -> None:
    assert parse_offsets_body({"orders": {"0": 5, "1": -1}}) == {TP0: 5, TP1: -1}
    for body in ([], {}, {"orders": []}, {"orders": {}}, {"orders": {"x": 1}}, {"orders": {"-1": 1}},
                 {"orders": {"01": 1}}, {"orders": {"0": 1.0}}, {"orders": {"0": "1"}}, {"": {"0": 1}}):
        with pytest.raises(InvalidInput):
            parse_offsets_body(body)


@given(
    before=st.integers(0, 10_000), start=st.integers(0, 5_000), length=st.integers(0, 5_000),
    requested=st.integers(-2, 20_000), policy=st.sampled_from(["clamp", "refuse"]),
)
def test_plan_invariants(before: int, start: int, length: int, requested: int, policy: str) -> None:
    marks = {TP0: Watermarks(start, start + length)}
    plan = plan_reset(ResetRequest("offsets", offsets={TP0: requested}, out_of_range=policy),  # type: ignore[arg-type]
                      [Position("orders", 0, before)], marks)
    (p,) = plan.partitions
    in_range = start <= p.requested_next_offset <= start + length
    assert (p.out_of_range is None) == in_range
    if policy == "clamp" or in_range:
        # Replay and skip are exclusive and measure the move exactly.
        assert p.records_replayed is not None and p.records_skipped is not None
        assert p.target_next_offset - before == p.records_skipped - p.records_replayed
        assert min(p.records_replayed, p.records_skipped) == 0
        assert start <= p.target_next_offset <= start + length
        assert not p.refused and plan.new_positions() == {"orders": {"0": p.target_next_offset}}
        plan.check_executable()
    else:
        # Refused: no target, so nothing is replayed or skipped and no new position is offered.
        assert p.target_next_offset == p.requested_next_offset
        assert p.refused and plan.refused and p.records_replayed is None and p.records_skipped is None
        assert plan.new_positions() == {}
