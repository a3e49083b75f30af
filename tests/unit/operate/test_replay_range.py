"""The pure replay range computation, and the replay selection on the embedded SQLite ledger."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import insert

from offset_ledger.errors import InvalidInput, ReplayNotExact, UnknownBatch, UnknownPipeline
from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.tables import batch_offsets, batches, checkpoint_generations, runs
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.replay import RecordedRange, compute_range, recover_starts, replay
from offset_ledger.rules.model import TopicPartition, Watermarks

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


def _r(batch: int, partition: int, start: int | None, end: int, topic: str = "orders", query: str = "q") -> RecordedRange:
    return RecordedRange(query, batch, topic, partition, start, end)


def test_one_batch_names_exactly_the_partitions_it_read() -> None:
    r = compute_range([_r(4, 0, 10, 20), _r(4, 1, 7, 7), _r(4, 2, 3, 5)])
    assert r.starting_offsets == {"orders": {"0": 10, "2": 3}}
    assert r.ending_offsets == {"orders": {"0": 20, "2": 5}}
    assert r.assign == {"orders": [0, 2]} and r.records == 12 and r.batches == (("q", 4),)
    assert r.options() == {"assign": '{"orders":[0,2]}', "startingOffsets": '{"orders":{"0":10,"2":3}}',
                           "endingOffsets": '{"orders":{"0":20,"2":5}}'}
    assert r.warnings == () and not r.retention_checked


def test_several_batches_run_from_the_first_start_to_the_last_end() -> None:
    r = compute_range([_r(1, 0, 0, 5), _r(2, 0, 5, 9), _r(3, 0, 9, 12), _r(2, 1, 4, 6, topic="pay")])
    assert r.starting_offsets == {"orders": {"0": 0}, "pay": {"1": 4}}
    assert r.ending_offsets == {"orders": {"0": 12}, "pay": {"1": 6}}
    assert r.batches == (("q", 1), ("q", 2), ("q", 3)) and r.warnings == ()


def test_gaps_and_overlaps_are_warned_about() -> None:
    gap = compute_range([_r(1, 0, 0, 5), _r(3, 0, 8, 10)])
    assert gap.ending_offsets == {"orders": {"0": 10}} and "5..7" in gap.warnings[0] and "gap" in gap.warnings[0]
    overlap = compute_range([_r(1, 0, 0, 5), _r(2, 0, 3, 8, query="q2")])
    assert "re-read offsets 3..4" in overlap.warnings[0]


def test_retention_and_truncation_are_reported_not_skipped() -> None:
    marks = {TopicPartition("orders", 0): Watermarks(14, 100), TopicPartition("orders", 1): Watermarks(0, 8)}
    r = compute_range([_r(1, 0, 10, 20), _r(1, 1, 0, 10)], marks)
    assert r.starting_offsets == {"orders": {"0": 10, "1": 0}}  # kept: the user decides
    assert r.lost == ({"topic": "orders", "partition": 0, "fromOffset": 10, "logStartOffset": 14,
                       "recordsLost": 4},)
    assert any("deleted by retention" in w for w in r.warnings)
    assert any("log ends at 8" in w for w in r.warnings) and r.retention_checked
    gone = compute_range([_r(1, 5, 0, 3)], marks)
    assert "no longer exists" in gone.warnings[0]


def test_a_range_without_a_start_refuses_the_whole_answer_naming_the_partition() -> None:
    # Before issue 20 (case 8) partition 0 was left out of the answer: its records silently missing.
    with pytest.raises(ReplayNotExact) as refused:
        compute_range([_r(0, 0, None, 5), _r(0, 1, 2, 6), _r(1, 0, 5, 9)], pipeline="p")
    assert "orders-0 in batch 0 of query q" in refused.value.message and "'p'" in refused.value.message
    assert refused.value.unknown_starts == [{"queryId": "q", "batchId": 0, "topic": "orders", "partition": 0,
                                             "untilOffset": 5}]


def test_starts_are_recovered_where_the_ledger_knows_them() -> None:
    ranges = [_r(3, 0, 10, 14), _r(4, 0, None, 20), _r(0, 1, None, 7, query="g"), _r(6, 2, None, 9)]
    filled = recover_starts(ranges, previous_until={("q", 5, 0, "orders", 2): 4},
                            first_batch_starts={("g", "orders", 1): 3})
    # Batch 4 starts where batch 3 ended; batch 0 where its generation resolved; batch 6 where 5 ended.
    assert [r.from_offset for r in filled] == [10, 14, 3, 4]
    r = compute_range(filled)
    assert r.starting_offsets == {"orders": {"0": 10, "1": 3, "2": 4}} and r.records == 10 + 4 + 5


def test_only_the_previous_batch_says_where_a_batch_started() -> None:
    # Batch 2 is not recorded: batch 1's end is where batch 2 started, not batch 3.
    (r,) = recover_starts([_r(3, 0, None, 20)], previous_until={("q", 1, 0, "orders", 0): 5},
                          first_batch_starts={("q", "orders", 0): 0})
    assert r.from_offset is None
    # Another query's batch, or another partition, says nothing either.
    (r,) = recover_starts([_r(3, 0, None, 20)], previous_until={("other", 2, 0, "orders", 0): 5,
                                                                ("q", 2, 0, "orders", 1): 5},
                          first_batch_starts={})
    assert r.from_offset is None


def test_an_empty_batch_says_so() -> None:
    r = compute_range([_r(7, 0, 5, 5)])
    assert r.starting_offsets == {} and r.warnings == ("these batches read no records",)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=12), st.integers(0, 1000), st.data())
def test_a_recovered_start_is_the_true_start_or_none(sizes: list[int], first_start: int, data) -> None:  # type: ignore[no-untyped-def]
    # The truth: batch b of one query read [starts[b], starts[b + 1]) of one partition.
    starts = [first_start]
    for n in sizes:
        starts.append(starts[-1] + n)
    recorded = data.draw(st.lists(st.booleans(), min_size=len(sizes), max_size=len(sizes)))  # the rest were lost
    start_known = data.draw(st.lists(st.booleans(), min_size=len(sizes), max_size=len(sizes)))
    ranges = [_r(b, 0, starts[b] if start_known[b] else None, starts[b + 1])
              for b in range(len(sizes)) if recorded[b]]
    generation_known = data.draw(st.booleans())
    filled = recover_starts(ranges, {}, {("q", "orders", 0): first_start} if generation_known else {})
    for r in filled:
        assert r.from_offset in (None, starts[r.batch_id])
        if r.batch_id > 0 and recorded[r.batch_id - 1] or r.batch_id == 0 and generation_known:
            assert r.from_offset == starts[r.batch_id]
    if all(r.from_offset is not None for r in filled):
        replay = compute_range(filled)
        if replay.starting_offsets:
            assert replay.starting_offsets["orders"]["0"] == min(starts[r.batch_id] for r in filled)
    else:
        with pytest.raises(ReplayNotExact):
            compute_range(filled)


# -- selecting batches in the ledger ---------------------------------------------------------


@pytest.fixture
def engine(tmp_path: Path):  # type: ignore[no-untyped-def]
    eng = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(eng)
    with eng.begin() as conn:
        # Query "old" ran batches 0-2, then generation 2 (query "new") restarted ids at 0.
        for query, start_min in (("old", 0), ("new", 10)):
            conn.execute(insert(runs).values(run_id=query, query_id=query, pipeline="p", consumer_group="p",
                                             started_at=T0 + timedelta(minutes=start_min)))
            for b in range(3):
                at = T0 + timedelta(minutes=start_min + b)
                conn.execute(insert(batches).values(pipeline="p", consumer_group="p", query_id=query, run_id=query,
                                                    batch_id=b, batch_time=at, recorded_at=at, input_rows=5))
                base = (0 if query == "old" else 15) + 5 * b
                conn.execute(insert(batch_offsets).values(
                    pipeline="p", consumer_group="p", query_id=query, batch_id=b, source_index=0, topic="t",
                    partition=0, from_offset=base, until_offset=base + 5, batch_time=at))
        for n, query in ((1, "old"), (2, "new")):
            conn.execute(insert(checkpoint_generations).values(
                pipeline="p", consumer_group="p", generation=n, checkpoint_root="/c", location=f"/c/gen-{n}",
                reason="first", created_at=T0, query_id=query))
    yield eng
    eng.dispose()


def test_batch_ids_mean_the_current_generations_query_unless_told(engine) -> None:  # type: ignore[no-untyped-def]
    assert replay(Operations(engine), "p", batch=1).starting_offsets == {"t": {"0": 20}}
    assert replay(Operations(engine), "p", batch=1, generation=1).starting_offsets == {"t": {"0": 5}}
    assert replay(Operations(engine), "p", batch=1, query_id="old").ending_offsets == {"t": {"0": 10}}
    r = replay(Operations(engine), "p", batch=2)
    assert r.batches == (("new", 2),) and "retention not checked" in r.warnings[-1]


def test_time_ranges_take_the_batches_in_them(engine) -> None:  # type: ignore[no-untyped-def]
    r = replay(Operations(engine), "p", since=T0 + timedelta(minutes=1), until=T0 + timedelta(minutes=11))
    assert r.batches == (("old", 1), ("old", 2), ("new", 0))
    assert r.starting_offsets == {"t": {"0": 5}} and r.ending_offsets == {"t": {"0": 20}}
    narrowed = replay(Operations(engine), "p", since=T0, until=T0 + timedelta(hours=1), generation=2)
    assert narrowed.batches == (("new", 0), ("new", 1), ("new", 2))


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"batch": 9}, UnknownBatch),
    ({"batch": 0, "generation": 7}, UnknownBatch),
    ({"batch": 0, "query_id": "nope"}, UnknownBatch),
    ({"since": T0 + timedelta(days=1), "until": T0 + timedelta(days=2)}, UnknownBatch),
    ({}, InvalidInput),
    ({"batch": -1}, InvalidInput),
    ({"batch": 1, "since": T0}, InvalidInput),
    ({"batch": 1, "query_id": "old", "generation": 1}, InvalidInput),
    ({"since": T0, "until": T0}, InvalidInput),
])
def test_bad_requests(engine, kwargs, error) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error):
        replay(Operations(engine), "p", **kwargs)


def test_unknown_pipeline(engine) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnknownPipeline):
        replay(Operations(engine), "nope", batch=0)


# -- ranges without a recorded start, on the ledger (issue 20, case 8) -----------------------


def _batch(conn, query: str, batch: int, at: datetime, ranges: dict[int, tuple[int | None, int]],  # type: ignore[no-untyped-def]
           pipeline: str = "p") -> None:
    conn.execute(insert(batches).values(pipeline=pipeline, consumer_group=pipeline, query_id=query, run_id=query,
                                        batch_id=batch, batch_time=at, recorded_at=at, input_rows=1))
    for partition, (start, end) in ranges.items():
        conn.execute(insert(batch_offsets).values(
            pipeline=pipeline, consumer_group=pipeline, query_id=query, batch_id=batch, source_index=0, topic="t",
            partition=partition, from_offset=start, until_offset=end, batch_time=at))


@pytest.fixture
def gaps(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Query "g" on generation 1 (first batch recorded without starts); query "h" with no generation,
    whose batch 2 read partition 1, added while it ran, from a start Spark did not report."""
    eng = make_engine(f"sqlite:///{tmp_path / 'gaps.db'}")
    ensure_schema(eng)
    with eng.begin() as conn:
        conn.execute(insert(checkpoint_generations).values(
            pipeline="p", consumer_group="p", generation=1, checkpoint_root="/c", location="/c/gen-1", reason="first",
            created_at=T0, query_id="g", resolved_offsets={"t": {"0": 100, "1": 7}}))
        conn.execute(insert(runs).values(run_id="g", query_id="g", pipeline="p", consumer_group="p", started_at=T0,
                                         generation_id=1))
        _batch(conn, "g", 0, T0, {0: (None, 120), 1: (None, 9)})
        _batch(conn, "g", 1, T0 + timedelta(minutes=1), {0: (None, 130), 1: (9, 12)})  # 1's start lost: batch 0's end
        conn.execute(insert(runs).values(run_id="h", query_id="h", pipeline="p", consumer_group="p",
                                         started_at=T0 + timedelta(hours=1)))
        h0 = T0 + timedelta(hours=1)
        _batch(conn, "h", 0, h0, {0: (None, 10)})
        _batch(conn, "h", 1, h0 + timedelta(minutes=1), {0: (10, 20)})
        _batch(conn, "h", 2, h0 + timedelta(minutes=2), {0: (20, 30), 1: (None, 1995)})
        _batch(conn, "h", 3, h0 + timedelta(minutes=3), {0: (30, 40), 1: (1995, 2000)})
    yield eng
    eng.dispose()


def test_a_first_batch_starts_where_its_generation_resolved(gaps) -> None:  # type: ignore[no-untyped-def]
    r = replay(Operations(gaps), "p", batch=0, query_id="g")
    assert r.starting_offsets == {"t": {"0": 100, "1": 7}} and r.ending_offsets == {"t": {"0": 120, "1": 9}}
    both = replay(Operations(gaps), "p", since=T0, until=T0 + timedelta(minutes=5))
    assert both.starting_offsets == {"t": {"0": 100, "1": 7}} and both.ending_offsets == {"t": {"0": 130, "1": 12}}
    assert both.records == 30 + 5 and [w for w in both.warnings if "gap" in w] == []
    one = replay(Operations(gaps), "p", batch=1, query_id="g")  # batch 0 is not selected but says where 1 began
    assert one.starting_offsets == {"t": {"0": 120, "1": 9}}


def test_a_partition_with_an_unknown_start_refuses_the_range_but_not_later_ones(gaps) -> None:  # type: ignore[no-untyped-def]
    h0 = T0 + timedelta(hours=1)
    with pytest.raises(ReplayNotExact) as refused:
        replay(Operations(gaps), "p", since=h0 + timedelta(minutes=1), until=h0 + timedelta(minutes=10))
    assert "t-1 in batch 2 of query h" in refused.value.message
    later = replay(Operations(gaps), "p", since=h0 + timedelta(minutes=3), until=h0 + timedelta(minutes=10))
    assert later.starting_offsets == {"t": {"0": 30, "1": 1995}} and later.ending_offsets == {"t": {"0": 40, "1": 2000}}
    # The first batch of a query on no generation: nothing says where it started.
    with pytest.raises(ReplayNotExact, match="t-0 in batch 0 of query h"):
        replay(Operations(gaps), "p", batch=0, query_id="h")


def test_an_adopted_generations_offsets_are_not_its_first_batchs_start(tmp_path: Path) -> None:
    eng = make_engine(f"sqlite:///{tmp_path / 'adopted.db'}")
    ensure_schema(eng)
    try:
        with eng.begin() as conn:
            # Imported at batch 41: the offsets are batch 41's ends, not where batch 0 began.
            conn.execute(insert(checkpoint_generations).values(
                pipeline="p", consumer_group="p", generation=1, checkpoint_root="/c", location="/jobs/p",
                reason="adopted", created_at=T0, query_id="a", resolved_offsets={"t": {"0": 500}}))
            conn.execute(insert(runs).values(run_id="a", query_id="a", pipeline="p", consumer_group="p",
                                             started_at=T0, generation_id=1))
            _batch(conn, "a", 0, T0, {0: (None, 10)})
        with pytest.raises(ReplayNotExact):
            replay(Operations(eng), "p", batch=0, query_id="a")
    finally:
        eng.dispose()


@pytest.mark.parametrize("zone", [timezone(timedelta(hours=2)), timezone(timedelta(hours=-7, minutes=-30))])
def test_aware_bounds_in_any_zone_select_the_same_batches(engine, zone) -> None:  # type: ignore[no-untyped-def]
    since, until = T0 + timedelta(minutes=1), T0 + timedelta(minutes=11)
    utc_answer = replay(Operations(engine), "p", since=since, until=until)
    zoned = replay(Operations(engine), "p", since=since.astimezone(zone), until=until.astimezone(zone))
    assert zoned.batches == utc_answer.batches == (("old", 1), ("old", 2), ("new", 0))
    naive = replay(Operations(engine), "p", since=since.replace(tzinfo=None), until=until.replace(tzinfo=None))
    assert naive.batches == utc_answer.batches  # naive means UTC


def test_the_cli_refuses_an_inexact_replay_in_one_line(gaps, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from offset_ledger.cli.main import main

    dsn = str(gaps.url)
    with pytest.raises(SystemExit) as done:
        main(["replay", "p", "--batch", "0", "--query-id", "h", "--dsn", dsn])
    err = capsys.readouterr()
    assert done.value.code == 2 and err.out == ""
    assert err.err.count("\n") == 1 and "t-0 in batch 0 of query h" in err.err
    main(["replay", "p", "--batch", "0", "--query-id", "g", "--dsn", dsn])
    assert '"startingOffsets": {"t": {"0": 100, "1": 7}}' in capsys.readouterr().out


def test_the_api_refuses_an_inexact_replay_with_a_400_naming_the_partition(gaps) -> None:  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    from offset_ledger.api import create_app
    from offset_ledger.operate.operations import Operations

    client = TestClient(create_app(operations=Operations(gaps), api_token=""), raise_server_exceptions=False,
                        base_url="http://localhost")
    refused = client.get("/api/v1/pipelines/p/batches/0/range?queryId=h")
    assert refused.status_code == 400 and refused.json()["error"] == "ReplayNotExact"
    assert refused.json()["unknownStarts"] == [{"queryId": "h", "batchId": 0, "topic": "t", "partition": 0,
                                                 "untilOffset": 10}]
    ok = client.get("/api/v1/pipelines/p/batches/0/range?queryId=g")
    assert ok.status_code == 200 and ok.json()["startingOffsets"] == {"t": {"0": 100, "1": 7}}
