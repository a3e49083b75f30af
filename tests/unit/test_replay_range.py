"""The pure replay range computation, and the replay selection on the embedded SQLite ledger."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import insert

from offset_ledger.errors import InvalidInput, UnknownBatch, UnknownPipeline
from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.tables import batch_offsets, batches, checkpoint_generations, runs
from offset_ledger.model import TopicPartition, Watermarks
from offset_ledger.replay import RecordedRange, compute_range, replay_for

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


def test_a_batch_without_a_recorded_start_is_not_replayable_exactly() -> None:
    r = compute_range([_r(0, 0, None, 5), _r(0, 1, 2, 6)])
    assert r.starting_offsets == {"orders": {"1": 2}}
    assert r.not_replayable == ({"queryId": "q", "batchId": 0, "topic": "orders", "partition": 0,
                                 "untilOffset": 5},)
    assert "without a start offset" in r.warnings[0]


def test_an_empty_batch_says_so() -> None:
    r = compute_range([_r(7, 0, 5, 5)])
    assert r.starting_offsets == {} and r.warnings == ("these batches read no records",)


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
    assert replay_for(engine, None, "p", batch=1).starting_offsets == {"t": {"0": 20}}
    assert replay_for(engine, None, "p", batch=1, generation=1).starting_offsets == {"t": {"0": 5}}
    assert replay_for(engine, None, "p", batch=1, query_id="old").ending_offsets == {"t": {"0": 10}}
    r = replay_for(engine, None, "p", batch=2)
    assert r.batches == (("new", 2),) and "retention not checked" in r.warnings[-1]


def test_time_ranges_take_the_batches_in_them(engine) -> None:  # type: ignore[no-untyped-def]
    r = replay_for(engine, None, "p", since=T0 + timedelta(minutes=1), until=T0 + timedelta(minutes=11))
    assert r.batches == (("old", 1), ("old", 2), ("new", 0))
    assert r.starting_offsets == {"t": {"0": 5}} and r.ending_offsets == {"t": {"0": 20}}
    narrowed = replay_for(engine, None, "p", since=T0, until=T0 + timedelta(hours=1), generation=2)
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
        replay_for(engine, None, "p", **kwargs)


def test_unknown_pipeline(engine) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UnknownPipeline):
        replay_for(engine, None, "nope", batch=0)
