"""The pure resolver: literal cases for every rule, then properties over generated clusters."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offset_ledger.errors import (
    DataLossError,
    InvalidInput,
    InvalidOffset,
    InvalidRestartOptions,
    UnknownPartition,
    UnknownTopic,
)
from offset_ledger.rules.model import EARLIEST, LATEST, Position, TopicPartition, Watermarks
from offset_ledger.rules.resolver import is_first_run, new_generation_reason, resolve
from offset_ledger.rules.restart_options import (
    FirstRunOffsets,
    FirstRunTimestamp,
    parse_first_run,
    parse_offsets,
    parse_on_data_loss,
)

TP = TopicPartition


def wm(**parts: tuple[int, int]) -> dict[TopicPartition, Watermarks]:
    """wm(orders_0=(0, 10)) -> {TP("orders", 0): Watermarks(0, 10)}."""
    out = {}
    for key, (start, end) in parts.items():
        topic, _, p = key.rpartition("_")
        out[TP(topic, int(p))] = Watermarks(start, end)
    return out


def pos(topic: str, partition: int, next_offset: int) -> Position:
    return Position(topic, partition, next_offset)


def kinds(plan) -> list[tuple[str, str | None, int | None]]:  # type: ignore[no-untyped-def]
    return [(f.kind, f.topic, f.partition) for f in plan.findings]


# --- ledger positions -------------------------------------------------------------------------


def test_positions_in_range_are_used_as_is_including_both_bounds() -> None:
    plan = resolve("p", ["orders"], [pos("orders", 0, 0), pos("orders", 1, 7), pos("orders", 2, 10)],
                   wm(orders_0=(0, 10), orders_1=(5, 10), orders_2=(3, 10)))
    assert plan.starting_offsets == {"orders": {"0": 0, "1": 7, "2": 10}}
    assert plan.findings == ()
    assert plan.starting_offsets_json == '{"orders":{"0":0,"1":7,"2":10}}'
    assert plan.checkpoint_location is None


def test_new_partition_is_read_from_earliest_with_a_finding() -> None:
    plan = resolve("p", ["orders"], [pos("orders", 0, 4)], wm(orders_0=(0, 10), orders_1=(0, 3)))
    assert plan.starting_offsets == {"orders": {"0": 4, "1": EARLIEST}}
    assert kinds(plan) == [("new_partition", "orders", 1)]


def test_new_topic_joining_a_known_pipeline_is_read_from_earliest_not_by_first_run() -> None:
    plan = resolve("p", ["a", "b"], [pos("a", 0, 2)], wm(a_0=(0, 5), b_0=(0, 5), b_1=(0, 5)),
                   first_run="latest")
    assert plan.starting_offsets == {"a": {"0": 2}, "b": {"0": EARLIEST, "1": EARLIEST}}
    assert [k for k, _, _ in kinds(plan)] == ["new_partition", "new_partition"]


def test_removed_partition_is_dropped_with_a_finding() -> None:
    plan = resolve("p", ["orders"], [pos("orders", 0, 4), pos("orders", 3, 9)], wm(orders_0=(0, 10)))
    assert plan.starting_offsets == {"orders": {"0": 4}}
    assert kinds(plan) == [("removed_partition", "orders", 3)]
    assert plan.findings[0].details == {"next_offset": 9, "topic_deleted": False}


def test_deleted_topic_is_dropped_with_a_finding_per_partition() -> None:
    plan = resolve("p", ["gone", "kept"], [pos("gone", 0, 1), pos("gone", 1, 2), pos("kept", 0, 3)],
                   wm(kept_0=(0, 3)))
    assert plan.starting_offsets == {"kept": {"0": 3}}
    assert kinds(plan) == [("removed_partition", "gone", 0), ("removed_partition", "gone", 1)]
    assert all(f.details["topic_deleted"] for f in plan.findings)


def test_requested_topic_that_never_existed_is_an_unknown_topic() -> None:
    with pytest.raises(UnknownTopic) as info:
        resolve("p", ["orders", "typo"], [pos("orders", 0, 1)], wm(orders_0=(0, 5)))
    assert info.value.topic == "typo"
    assert isinstance(info.value, InvalidInput)


def test_ledger_positions_of_topics_not_requested_are_ignored() -> None:
    plan = resolve("p", ["a"], [pos("a", 0, 1), pos("other", 0, 99)], wm(a_0=(0, 5), other_0=(0, 1)))
    assert plan.starting_offsets == {"a": {"0": 1}}
    assert plan.findings == ()


def test_below_log_start_fails_naming_partitions_and_lost_counts() -> None:
    with pytest.raises(DataLossError) as info:
        resolve("orders", ["t"], [pos("t", 0, 3), pos("t", 1, 50), pos("t", 2, 8)],
                wm(t_0=(10, 20), t_1=(0, 60), t_2=(9, 9)), on_data_loss="fail")
    err = info.value
    assert [(x["topic"], x["partition"], x["records_lost"], x["kind"]) for x in err.lost] == [
        ("t", 0, 7, "below_log_start"), ("t", 2, 1, "below_log_start")]
    assert "t/0" in err.message and "7 records lost" in err.message and "t/2" in err.message
    assert err.details["lost"][0]["log_start_offset"] == 10


def test_below_log_start_with_earliest_clamps_to_log_start_and_records_the_loss() -> None:
    plan = resolve("p", ["t"], [pos("t", 0, 3), pos("t", 1, 50)], wm(t_0=(10, 20), t_1=(0, 60)),
                   on_data_loss="earliest")
    assert plan.starting_offsets == {"t": {"0": 10, "1": 50}}
    assert kinds(plan) == [("data_loss", "t", 0)]
    details = plan.findings[0].details
    assert details["records_lost"] == 7 and details["resumed_at"] == 10 and details["next_offset"] == 3


def test_above_log_end_fails_by_default() -> None:
    with pytest.raises(DataLossError) as info:
        resolve("p", ["t"], [pos("t", 0, 100)], wm(t_0=(0, 30)))
    (lost,) = info.value.lost
    assert lost["kind"] == "above_log_end"
    assert lost["offsets_beyond_log_end"] == 70
    assert lost["records_lost"] is None
    assert "re-created" in info.value.message


def test_above_log_end_with_earliest_restarts_the_recreated_log_from_log_start() -> None:
    # A re-created topic's offsets are unrelated to the old ones: every record in it is unread.
    plan = resolve("p", ["t"], [pos("t", 0, 100), pos("t", 1, 5)], wm(t_0=(0, 30), t_1=(0, 30)),
                   on_data_loss="earliest")
    assert plan.starting_offsets == {"t": {"0": 0, "1": 5}}
    assert kinds(plan) == [("data_loss", "t", 0)]
    assert plan.findings[0].details["kind"] == "above_log_end"


def test_above_log_end_after_truncation_clamps_to_the_new_log_start() -> None:
    plan = resolve("p", ["t"], [pos("t", 0, 100)], wm(t_0=(12, 40)), on_data_loss="earliest")
    assert plan.starting_offsets == {"t": {"0": 12}}


def test_sentinel_positions_written_by_a_reset_pass_through() -> None:
    plan = resolve("p", ["t"], [pos("t", 0, EARLIEST), pos("t", 1, LATEST)], wm(t_0=(5, 9), t_1=(5, 9)))
    assert plan.starting_offsets == {"t": {"0": EARLIEST, "1": LATEST}}


def test_empty_partition_accepts_its_only_offset() -> None:
    plan = resolve("p", ["t"], [pos("t", 0, 7)], wm(t_0=(7, 7)))
    assert plan.starting_offsets == {"t": {"0": 7}}


def test_data_loss_error_is_raised_before_anything_else_happens_even_with_other_findings() -> None:
    with pytest.raises(DataLossError) as info:
        resolve("p", ["t"], [pos("t", 0, 1), pos("t", 5, 1)], wm(t_0=(2, 3), t_1=(0, 3)))
    assert [x["partition"] for x in info.value.lost] == [0]


def test_partitions_are_sorted_numerically_in_json() -> None:
    watermarks = {TP("t", p): Watermarks(0, 1) for p in range(12)}
    plan = resolve("p", ["t"], [pos("t", p, 1) for p in range(12)], watermarks)
    assert list(json.loads(plan.starting_offsets_json)["t"]) == [str(p) for p in range(12)]


def test_duplicate_requested_topics_are_harmless() -> None:
    plan = resolve("p", ["t", "t"], [pos("t", 0, 1)], wm(t_0=(0, 1)))
    assert plan.starting_offsets == {"t": {"0": 1}}


def test_invalid_policy_is_refused() -> None:
    with pytest.raises(InvalidRestartOptions):
        resolve("p", ["t"], [], wm(t_0=(0, 1)), on_data_loss="latest")  # type: ignore[arg-type]


# --- first run ---------------------------------------------------------------------------------


def test_first_run_earliest_and_latest() -> None:
    w = wm(t_0=(0, 5), t_1=(2, 2), u_0=(0, 0))
    plan = resolve("p", ["t", "u"], [], w, first_run="earliest")
    assert plan.starting_offsets == {"t": {"0": EARLIEST, "1": EARLIEST}, "u": {"0": EARLIEST}}
    assert kinds(plan) == [("first_run", None, None)]
    assert plan.findings[0].details == {"mode": "earliest", "partitions": 3}
    # Latest is the log-end seen now, the number the generation's baseline records (issue 20,
    # case 9): Spark starting later at its own "latest" would skip what was produced in between.
    plan = resolve("p", ["t", "u"], [], w, first_run="latest")
    assert plan.starting_offsets == {"t": {"0": 5, "1": 2}, "u": {"0": 0}}
    assert plan.findings[0].details == {"mode": "latest", "partitions": 3}


def test_first_run_timestamp_uses_offsets_for_time_and_the_log_end_when_no_record_is_that_new() -> None:
    w = wm(t_0=(0, 10), t_1=(3, 7))
    plan = resolve("p", ["t"], [], w, first_run=FirstRunTimestamp(1_700_000_000_000),
                   offsets_for_time={TP("t", 0): 4, TP("t", 1): None})
    assert plan.starting_offsets == {"t": {"0": 4, "1": 7}}
    (finding,) = plan.findings
    assert finding.kind == "first_run" and finding.details["latest_partitions"] == ["t/1"]
    assert finding.details["timestamp_ms"] == 1_700_000_000_000


def test_first_run_timestamp_without_lookups_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        resolve("p", ["t"], [], wm(t_0=(0, 1)), first_run=FirstRunTimestamp(5))


def test_first_run_explicit_offsets_fill_unnamed_partitions_with_earliest() -> None:
    w = wm(t_0=(0, 10), t_1=(0, 10), u_0=(0, 3))
    plan = resolve("p", ["t", "u"], [], w, first_run=FirstRunOffsets({"t": {0: 6, 1: LATEST}}))
    assert plan.starting_offsets == {"t": {"0": 6, "1": 10}, "u": {"0": EARLIEST}}  # -1: the log-end seen now
    assert plan.findings[0].details["earliest_partitions"] == ["u/0"]


def test_first_run_explicit_offsets_naming_unknown_partition_or_topic_are_refused() -> None:
    w = wm(t_0=(0, 10))
    with pytest.raises(UnknownPartition):
        resolve("p", ["t"], [], w, first_run=FirstRunOffsets({"t": {3: 1}}))
    with pytest.raises(InvalidRestartOptions):
        resolve("p", ["t"], [], w, first_run=FirstRunOffsets({"other": {0: 1}}))


def test_first_run_explicit_offsets_outside_the_log_follow_the_data_loss_policy() -> None:
    w = wm(t_0=(5, 10))
    with pytest.raises(DataLossError) as info:
        resolve("p", ["t"], [], w, first_run=FirstRunOffsets({"t": {0: 2}}))
    assert info.value.lost[0]["source"] == "first_run"
    plan = resolve("p", ["t"], [], w, first_run=FirstRunOffsets({"t": {0: 2}}), on_data_loss="earliest")
    assert plan.starting_offsets == {"t": {"0": 5}}


def test_first_run_applies_only_when_no_requested_topic_has_positions() -> None:
    assert is_first_run([], ["t"])
    assert is_first_run([pos("other", 0, 1)], ["t"])
    assert not is_first_run([pos("t", 0, 1)], ["t", "u"])


def test_first_run_on_a_deleted_topic_with_positions_is_not_a_first_run() -> None:
    plan = resolve("p", ["gone", "t"], [pos("gone", 0, 3)], wm(t_0=(0, 4)), first_run="latest")
    assert plan.starting_offsets == {"t": {"0": EARLIEST}}
    assert [k for k, _, _ in kinds(plan)] == ["removed_partition", "new_partition"]


# --- parsing policies --------------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [
    ("earliest", "earliest"),
    ("latest", "latest"),
    (" latest ", "latest"),
    (1_700_000_000_000, FirstRunTimestamp(1_700_000_000_000)),
    ("1700000000000", FirstRunTimestamp(1_700_000_000_000)),
    (datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc), FirstRunTimestamp(1_700_000_000_000)),
    (datetime(2023, 11, 14, 22, 13, 20), FirstRunTimestamp(1_700_000_000_000)),  # naive = UTC
    ("2023-11-14T22:13:20Z", FirstRunTimestamp(1_700_000_000_000)),
    ("2023-11-14T23:13:20+01:00", FirstRunTimestamp(1_700_000_000_000)),
    ('{"t": {"0": 12, "1": -2}}', FirstRunOffsets({"t": {0: 12, 1: -2}})),
    ({"t": {0: 12}}, FirstRunOffsets({"t": {0: 12}})),
])
def test_parse_first_run_accepts(value: object, expected: object) -> None:
    assert parse_first_run(value) == expected


@pytest.mark.parametrize("value", [
    "earliestt", "", "yesterday", True, -5, 1.5, None, "{not json", '{"t": {"0": "12"}}',
    '{"t": {"0": 1.0}}', '{"t": {"0": -3}}', '{"t": {"x": 1}}', '{"t": {"-1": 1}}', '{"t": {}}',
    "{}", '{"t": 5}', '{"t": {"0": true}}', '[1, 2]',
])
def test_parse_first_run_refuses_with_an_invalid_input(value: object) -> None:
    with pytest.raises(InvalidInput):
        parse_first_run(value)


def test_parse_offsets_reports_the_partition_of_a_bad_offset() -> None:
    with pytest.raises(InvalidOffset) as info:
        parse_offsets({"t": {"0": 1, "4": -7}})
    assert info.value.partition == 4


def test_parse_on_data_loss() -> None:
    assert parse_on_data_loss("fail") == "fail"
    assert parse_on_data_loss("earliest") == "earliest"
    with pytest.raises(InvalidRestartOptions):
        parse_on_data_loss("skip")


# --- checkpoint generation decision --------------------------------------------------------------


def _reason(**kw: object) -> object:
    base = dict(current_app_version="1", current_checkpoint_root="/cp", has_current=True,
                app_version="1", checkpoint_root="/cp", pending_resets=False, requested=False)
    base.update(kw)
    return new_generation_reason(**base)  # type: ignore[arg-type]


def test_generation_reasons_in_priority_order() -> None:
    assert _reason() is None
    assert _reason(app_version=None) is None  # not tracking versions never forces a generation
    assert _reason(has_current=False, pending_resets=True) == "first"
    assert _reason(pending_resets=True, app_version="2", requested=True) == "reset"
    assert _reason(app_version="2", requested=True) == "app_version"
    assert _reason(current_app_version=None, app_version="1") == "app_version"
    assert _reason(checkpoint_root="s3a://b/cp") == "checkpoint_root"
    assert _reason(requested=True) == "requested"


@pytest.mark.parametrize("root", ["/cp/", "/cp//", "file:/cp", "file:///cp/", "file://localhost/cp", " /cp"])
def test_the_same_root_spelled_differently_reuses_the_generation(root: str) -> None:
    assert _reason(checkpoint_root=root) is None


@pytest.mark.parametrize("root", ["/cp2", "/cp/sub", "s3a://b/cp", "hdfs://nn/cp"])
def test_another_root_opens_a_generation(root: str) -> None:
    assert _reason(checkpoint_root=root) == "checkpoint_root"


# --- properties ----------------------------------------------------------------------------------

TOPICS = ["a", "b", "c"]


@st.composite
def clusters(draw):  # type: ignore[no-untyped-def]
    """Requested topics, current watermarks, and ledger positions that may be anywhere."""
    requested = draw(st.lists(st.sampled_from(TOPICS), min_size=1, max_size=3, unique=True))
    watermarks: dict[TopicPartition, Watermarks] = {}
    for topic in TOPICS:
        if topic in requested and not draw(st.booleans()) and topic != requested[0]:
            continue  # some requested topics are deleted (the first always exists)
        for p in range(draw(st.integers(1, 5))):
            start = draw(st.integers(0, 1000))
            watermarks[TP(topic, p)] = Watermarks(start, start + draw(st.integers(0, 1000)))
    positions = []
    for topic in TOPICS:
        for p in draw(st.sets(st.integers(0, 6), max_size=6)):
            offset = draw(st.one_of(st.integers(0, 2500), st.sampled_from([EARLIEST, LATEST])))
            positions.append(Position(topic, p, offset))
    # A deleted requested topic with no positions would be an UnknownTopic; give it one.
    for topic in requested:
        if not any(tp.topic == topic for tp in watermarks) and not any(x.topic == topic for x in positions):
            positions.append(Position(topic, 0, 1))
    return requested, watermarks, positions


def _current(requested, watermarks):  # type: ignore[no-untyped-def]
    return sorted(tp for tp in watermarks if tp.topic in requested)


def _named(plan) -> list[TopicPartition]:  # type: ignore[no-untyped-def]
    return sorted(TP(t, int(p)) for t, parts in plan.starting_offsets.items() for p in parts)


def _valid(offset: int, w: Watermarks) -> bool:
    return offset in (EARLIEST, LATEST) or w.log_start_offset <= offset <= w.log_end_offset


first_runs = st.one_of(st.sampled_from(["earliest", "latest"]), st.builds(FirstRunTimestamp, st.integers(0, 10**13)))


@settings(max_examples=300, deadline=None)
@given(clusters(), first_runs, st.data())
def test_earliest_policy_names_every_current_partition_once_with_valid_offsets(case, first_run, data) -> None:  # type: ignore[no-untyped-def]
    requested, watermarks, positions = case
    lookups = {tp: data.draw(st.one_of(st.none(), st.integers(w.log_start_offset, w.log_end_offset)))
               for tp, w in watermarks.items()}
    plan = resolve("p", requested, positions, watermarks, first_run=first_run, on_data_loss="earliest",
                   offsets_for_time=lookups)
    named = _named(plan)
    assert named == _current(requested, watermarks)
    assert len(named) == len(set(named))
    for topic, parts in plan.starting_offsets.items():
        for p, offset in parts.items():
            assert _valid(offset, watermarks[TP(topic, int(p))])
    # A first run never leaves "latest" for Spark to resolve later than the plan (issue 20, case 9):
    # what Spark starts at is the number the generation's baseline records.
    if is_first_run(positions, requested):
        assert not any(o == LATEST for parts in plan.starting_offsets.values() for o in parts.values())
    # A ledger position that was valid is never moved.
    for x in positions:
        if x.tp in watermarks and x.topic in requested and _valid(x.next_offset, watermarks[x.tp]):
            assert plan.starting_offsets[x.topic][str(x.partition)] == x.next_offset
    # Every dropped ledger partition is reported.
    removed = {(f.topic, f.partition) for f in plan.findings if f.kind == "removed_partition"}
    assert removed == {(x.topic, x.partition) for x in positions
                       if x.topic in requested and x.tp not in watermarks}


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_fail_policy_raises_exactly_for_out_of_range_positions_or_changes_nothing(case) -> None:  # type: ignore[no-untyped-def]
    requested, watermarks, positions = case
    bad = sorted((x.topic, x.partition) for x in positions
                 if x.topic in requested and x.tp in watermarks and not _valid(x.next_offset, watermarks[x.tp]))
    if is_first_run(positions, requested):
        bad = []
    try:
        plan = resolve("p", requested, positions, watermarks, on_data_loss="fail")
    except DataLossError as exc:
        assert sorted((x["topic"], x["partition"]) for x in exc.lost) == bad
        assert bad
        for lost in exc.lost:
            assert (lost["records_lost"] is None) == (lost["kind"] == "above_log_end")
        return
    assert not bad
    assert _named(plan) == _current(requested, watermarks)
    assert not any(f.kind == "data_loss" for f in plan.findings)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=5),
                       st.dictionaries(st.integers(0, 50), st.one_of(st.integers(-2, 10**12)), min_size=1),
                       min_size=1))
def test_parse_offsets_round_trips_valid_json(data) -> None:  # type: ignore[no-untyped-def]
    text = json.dumps({t: {str(p): o for p, o in parts.items()} for t, parts in data.items()})
    assert parse_first_run(text) == FirstRunOffsets(data)


@settings(max_examples=150, deadline=None)
@given(clusters(), st.randoms(use_true_random=False))
def test_the_plan_does_not_depend_on_input_order(case, rnd) -> None:  # type: ignore[no-untyped-def]
    requested, watermarks, positions = case
    shuffled_positions = list(positions)
    rnd.shuffle(shuffled_positions)
    items = list(watermarks.items())
    rnd.shuffle(items)
    a = resolve("p", requested, positions, watermarks, on_data_loss="earliest")
    b = resolve("p", list(reversed(requested)), shuffled_positions, dict(items), on_data_loss="earliest")
    assert a.starting_offsets_json == b.starting_offsets_json
    assert sorted(f.message for f in a.findings) == sorted(f.message for f in b.findings)


@settings(max_examples=150, deadline=None)
@given(clusters(), st.data())
def test_explicit_first_run_offsets_name_every_partition_once(case, data) -> None:  # type: ignore[no-untyped-def]
    requested, watermarks, _ = case
    current = _current(requested, watermarks)
    named = data.draw(st.lists(st.sampled_from(current), unique=True)) if current else []
    explicit: dict[str, dict[int, int]] = {}
    for tp in named:
        w = watermarks[tp]
        explicit.setdefault(tp.topic, {})[tp.partition] = data.draw(
            st.one_of(st.integers(w.log_start_offset, w.log_end_offset), st.sampled_from([EARLIEST, LATEST])))
    requested = [t for t in requested if any(tp.topic == t for tp in watermarks)]
    if not explicit or not requested:
        return
    plan = resolve("p", requested, [], watermarks, first_run=FirstRunOffsets(explicit))
    assert _named(plan) == _current(requested, watermarks)
    for topic, parts in explicit.items():
        for p, offset in parts.items():
            # -1 is planned as the log-end seen now; everything else exactly as given.
            expected = watermarks[TopicPartition(topic, p)].log_end_offset if offset == LATEST else offset
            assert plan.starting_offsets[topic][str(p)] == expected
