"""The progress parser: the real captured Spark event, edge cases, and property-based inputs."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offset_ledger.rules.progress import (
    ProgressParseError,
    is_kafka_source,
    is_no_data,
    parse_idle,
    parse_progress,
    parse_started,
    parse_terminated,
)

TOPIC = "t_test_spark_reads_kafka_through_a0fac4ed_19f182"


def test_real_fixture_first_batch_has_no_start_and_exclusive_ends(progress_json: dict) -> None:
    batch = parse_progress(json.dumps(progress_json))
    assert batch.query_id == progress_json["id"]
    assert batch.run_id == progress_json["runId"]
    assert batch.query_name == "smoke_d_19f182"
    assert batch.batch_id == 0
    assert batch.batch_time == datetime(2026, 11, 22, 20, 42, 12, 804000, tzinfo=timezone.utc)
    assert batch.input_rows == 300
    assert len(batch.sources) == 1
    source = batch.sources[0]
    assert source.source_index == 0
    assert source.description.startswith("KafkaV2[Subscribe[")
    assert source.input_rows == 300
    assert [(r.topic, r.partition, r.from_offset, r.until_offset) for r in source.ranges] == [
        (TOPIC, 0, None, 100), (TOPIC, 1, None, 100), (TOPIC, 2, None, 100)]
    assert not is_no_data(batch)


def test_offsets_given_as_json_strings_parse_like_objects(progress_json: dict) -> None:
    as_strings = json.loads(json.dumps(progress_json))
    src = as_strings["sources"][0]
    src["startOffset"] = json.dumps({TOPIC: {"0": 40, "1": 50, "2": 60}})
    src["endOffset"] = json.dumps(src["endOffset"])
    batch = parse_progress(as_strings)
    assert [(r.partition, r.from_offset, r.until_offset) for r in batch.sources[0].ranges] == [
        (0, 40, 100), (1, 50, 100), (2, 60, 100)]


def test_non_kafka_sources_are_ignored_but_keep_their_index(progress_json: dict) -> None:
    doc = json.loads(json.dumps(progress_json))
    rate = {"description": "RateStreamV2[numPartitions=1, rowsPerSecond=1]",
            "startOffset": 3, "endOffset": 5, "numInputRows": 2}
    second = dict(doc["sources"][0], description="KafkaV2[Subscribe[other]]",
                  startOffset={"other": {"0": 1}}, endOffset={"other": {"0": 7}}, numInputRows=6)
    doc["sources"] = [rate, doc["sources"][0], second]
    batch = parse_progress(doc)
    assert [s.source_index for s in batch.sources] == [1, 2]
    assert batch.sources[1].ranges[0].from_offset == 1
    assert batch.sources[1].ranges[0].until_offset == 7


def test_a_source_with_several_topics() -> None:
    doc = _progress([{"description": "KafkaV2[SubscribePattern[t.*]]",
                      "startOffset": {"a": {"1": 3, "0": 2}, "b": {"0": 9}},
                      "endOffset": {"b": {"0": 10}, "a": {"0": 4, "1": 3}}, "numInputRows": 4}])
    ranges = parse_progress(doc).sources[0].ranges
    assert [(r.topic, r.partition, r.from_offset, r.until_offset) for r in ranges] == [
        ("a", 0, 2, 4), ("a", 1, 3, 3), ("b", 0, 9, 10)]


def test_new_partition_has_no_start_in_a_later_batch() -> None:
    doc = _progress([{"description": "KafkaV2[Subscribe[a]]", "startOffset": {"a": {"0": 5}},
                      "endOffset": {"a": {"0": 6, "1": 2}}, "numInputRows": 3}], rows=3)
    ranges = parse_progress(doc).sources[0].ranges
    assert [(r.partition, r.from_offset) for r in ranges] == [(0, 5), (1, None)]


def test_no_data_batch_is_recognised() -> None:
    doc = _progress([{"description": "KafkaV2[Subscribe[a]]", "startOffset": {"a": {"0": 5}},
                      "endOffset": {"a": {"0": 5}}, "numInputRows": 0}], rows=0)
    assert is_no_data(parse_progress(doc))
    nothing_planned = _progress([{"description": "KafkaV2[Subscribe[a]]", "startOffset": None,
                                  "endOffset": None, "numInputRows": 0}], rows=0)
    batch = parse_progress(nothing_planned)
    assert batch.sources[0].ranges == ()
    assert is_no_data(batch)


def test_kafka_source_descriptions() -> None:
    assert is_kafka_source("KafkaV2[Subscribe[x]]")
    assert is_kafka_source("KafkaSourceV1[Subscribe[x]]")
    assert is_kafka_source("KafkaSource[Assign[x-0]]")
    assert not is_kafka_source("FileStreamSource[file:/tmp]")
    assert not is_kafka_source("kafkav2[x]")


@pytest.mark.parametrize("bad", [
    "not json", "[]", "{}", json.dumps({"id": "q", "runId": "r", "batchId": 1, "timestamp": "yesterday"}),
])
def test_malformed_events_raise_one_error_type(bad: str) -> None:
    with pytest.raises(ProgressParseError):
        parse_progress(bad)


def test_malformed_offsets_raise() -> None:
    for end in ({"a": 5}, {"a": {"x": 1}}, {"a": {"0": "5"}}, "{oops", [1]):
        doc = _progress([{"description": "KafkaV2[Subscribe[a]]", "endOffset": end}])
        with pytest.raises(ProgressParseError):
            parse_progress(doc)


def test_lifecycle_events() -> None:
    started = parse_started(json.dumps({"id": "q", "runId": "r", "name": None,
                                        "timestamp": "2026-01-02T03:04:05.006Z", "jobTags": []}))
    assert started.query_name is None
    assert started.started_at == datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=timezone.utc)
    idle = parse_idle({"id": "q", "runId": "r", "timestamp": "2026-01-02T03:04:06.000Z"})
    assert idle.at.second == 6
    ended = parse_terminated({"id": "q", "runId": "r", "exception": "boom",
                              "errorClassOnException": None})
    assert (ended.exception, ended.error_class) == ("boom", None)
    with pytest.raises(ProgressParseError):
        parse_idle({"id": "q"})


# ----------------------------------------------------------------------------- properties

_topics = st.text(alphabet="abcdefghij_.-0123456789", min_size=1, max_size=12)
_offset_map = st.dictionaries(
    _topics, st.dictionaries(st.integers(0, 200), st.integers(0, 2**62), min_size=1, max_size=8),
    min_size=1, max_size=4)


@st.composite
def _kafka_source(draw: st.DrawFn) -> dict:
    end = draw(_offset_map)
    start = draw(st.one_of(st.none(), st.just({t: {p: max(0, o - 3) for p, o in ps.items()}
                                               for t, ps in end.items()})))

    def render(m: dict | None) -> object:
        if m is None:
            return None
        as_json = {t: {str(p): o for p, o in ps.items()} for t, ps in m.items()}
        return draw(st.sampled_from([as_json, json.dumps(as_json)]))

    prefix = draw(st.sampled_from(["KafkaV2[Subscribe[", "KafkaSourceV1[Subscribe[", "KafkaSource[Assign["]))
    return {"description": prefix + ",".join(end) + "]]", "startOffset": render(start),
            "endOffset": render(end), "numInputRows": draw(st.integers(0, 10**6)),
            "_start": start, "_end": end}


_other_source = st.fixed_dictionaries({
    "description": st.sampled_from(["RateStreamV2[rows=1]", "FileStreamSource[file:/x]", "MemoryStream[value]"]),
    "startOffset": st.one_of(st.none(), st.integers(0, 9), st.text(max_size=5)),
    "endOffset": st.one_of(st.integers(0, 9), st.text(max_size=5)),
    "numInputRows": st.integers(0, 9),
})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(_kafka_source(), _other_source), max_size=5), st.integers(0, 2**40))
def test_every_kafka_partition_comes_back_exactly_once(sources: list[dict], batch_id: int) -> None:
    wire = [{k: v for k, v in s.items() if not k.startswith("_")} for s in sources]
    batch = parse_progress(json.dumps(_progress(wire, batch_id=batch_id)))
    assert batch.batch_id == batch_id
    expected_indexes = [i for i, s in enumerate(sources) if "_end" in s]
    assert [s.source_index for s in batch.sources] == expected_indexes
    for parsed, raw in zip(batch.sources, (sources[i] for i in expected_indexes)):
        got = {(r.topic, r.partition): (r.from_offset, r.until_offset) for r in parsed.ranges}
        assert len(got) == len(parsed.ranges)
        want = {(t, p): ((raw["_start"] or {}).get(t, {}).get(p), o)
                for t, ps in raw["_end"].items() for p, o in ps.items()}
        assert got == want
        assert list(parsed.ranges) == sorted(parsed.ranges, key=lambda r: (r.topic, r.partition))


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200))
def test_garbage_never_raises_anything_but_the_parse_error(garbage: bytes | str) -> None:
    try:
        parse_progress(garbage)
    except ProgressParseError:
        pass


def _progress(sources: list[dict], *, rows: int = 1, batch_id: int = 4) -> dict:
    return {"id": "11111111-1111-1111-1111-111111111111",
            "runId": "22222222-2222-2222-2222-222222222222", "name": "q",
            "timestamp": "2026-11-22T20:42:12.804Z", "batchId": batch_id, "numInputRows": rows,
            "durationMs": {}, "stateOperators": [], "sources": sources,
            "sink": {"description": "MemorySink"}}


def test_event_time_and_state_operators_are_parsed(progress_json: dict) -> None:
    doc = json.loads(json.dumps(progress_json))
    doc["eventTime"] = {"avg": "2026-01-01T00:00:05.000Z", "max": "2026-01-01T00:00:09.500Z",
                        "min": "2026-01-01T00:00:01.250Z", "watermark": "2026-01-01T00:00:00.000Z"}
    doc["stateOperators"] = [
        {"operatorName": "stateStoreSave", "numRowsTotal": 3, "numRowsUpdated": 2, "numRowsDroppedByWatermark": 1},
        {"operatorName": "dedupe", "numRowsTotal": 10, "numRowsUpdated": 4, "numRowsDroppedByWatermark": 0},
    ]
    batch = parse_progress(doc)
    assert batch.watermark == datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert batch.event_time_min == datetime(2026, 1, 1, 0, 0, 1, 250000, tzinfo=timezone.utc)
    assert batch.event_time_max == datetime(2026, 1, 1, 0, 0, 9, 500000, tzinfo=timezone.utc)
    assert (batch.state_rows_total, batch.state_rows_updated, batch.state_rows_dropped_by_watermark) == (13, 6, 1)


def test_no_watermark_no_state_leaves_the_fields_empty(progress_json: dict) -> None:
    doc = json.loads(json.dumps(progress_json))
    doc.pop("eventTime", None)
    doc["stateOperators"] = []
    batch = parse_progress(doc)
    assert (batch.watermark, batch.event_time_min, batch.event_time_max) == (None, None, None)
    assert batch.state_rows_total is None


def test_watermark_only_and_odd_values_keep_the_batch(progress_json: dict) -> None:
    doc = json.loads(json.dumps(progress_json))
    doc["eventTime"] = {"watermark": "2026-01-01T00:00:00.000Z", "max": "not a time"}
    batch = parse_progress(doc)
    assert batch.watermark == datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert batch.event_time_max is None and batch.event_time_min is None
    assert batch.input_rows == 300
