"""Issue 47, case 3: a Kafka source's loss is judged on the Kafka source's own row count, never on a
batch total that a second, non-Kafka source (``rate``, a file source, joined or unioned in) fills up.

A Kafka source that read 0 of the 50 offsets its range spans (retention deleted them before the
batch fetched them) beside a ``rate`` source that read 60 rows: the batch total (60) exceeds the span
(50), and the old rule, falling back to that total when every Kafka count was 0, called it fine. A
source whose count Spark did not report at all (``numInputRows`` absent, not 0) is *unknown*, never
fine: a ``data_loss`` finding of kind ``rows_unknown``, and an ``unknown`` stretch in verify.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import select

from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.records import BatchRecord, RunStart
from offset_ledger.ledger.tables import findings
from offset_ledger.rules.progress import parse_progress
from offset_ledger.rules.read_shortfall import READ_SHORTFALL, read_shortfalls
from offset_ledger.operate.action_answers import verify_answer

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)
RATE = "RateStreamV2[rowsPerSecond=60, rampUpTimeSeconds=0, numPartitions=default"
FILES = "FileStreamSource[file:/data/in]"
#: ``details.kind`` of the finding of a Kafka source whose row count nobody knows
ROWS_UNKNOWN = "rows_unknown"


def kafka(topic: str, start: int, end: int, rows: int | None) -> dict[str, Any]:
    doc: dict[str, Any] = {"description": f"KafkaV2[Subscribe[{topic}]]", "startOffset": {topic: {"0": start}},
                           "endOffset": {topic: {"0": end}}, "latestOffset": {topic: {"0": end}}}
    if rows is not None:
        doc["numInputRows"] = rows
    return doc


def rate(rows: int | None, start: int = 0) -> dict[str, Any]:
    doc: dict[str, Any] = {"description": RATE, "startOffset": start, "endOffset": start + 60}
    if rows is not None:
        doc["numInputRows"] = rows
    return doc


def progress(batch_id: int, *sources: dict[str, Any], total: int | None = None) -> str:
    rows = sum(s.get("numInputRows", 0) for s in sources) if total is None else total
    return json.dumps({"id": "q1", "runId": "r1", "name": "orders", "batchId": batch_id,
                       "timestamp": f"2026-11-28T12:00:{batch_id:02d}.000Z", "numInputRows": rows,
                       "sources": list(sources)})


# ------------------------------------------------------------------ the parse


def test_the_parse_tells_an_absent_row_count_from_zero_and_counts_the_other_sources() -> None:
    b = parse_progress(progress(3, kafka("t", 100, 150, 0), rate(60)))
    (k,) = b.sources
    assert (k.source_index, k.input_rows, k.rows_reported) == (0, 0, True)
    assert (b.input_rows, b.non_kafka_sources) == (60, 1)
    b = parse_progress(progress(3, rate(60), kafka("t", 100, 150, None), total=60))
    (k,) = b.sources
    assert (k.source_index, k.input_rows, k.rows_reported) == (1, 0, False)
    assert b.non_kafka_sources == 1
    # a file source counts as another source too; a Kafka-only batch has none
    assert parse_progress(progress(3, kafka("t", 0, 5, 5), {"description": FILES, "numInputRows": 7,
                                                            "startOffset": {"logOffset": 0},
                                                            "endOffset": {"logOffset": 1}})).non_kafka_sources == 1
    assert parse_progress(progress(3, kafka("t", 0, 5, 5))).non_kafka_sources == 0


# ------------------------------------------------------------------ the rule


def test_a_kafka_source_that_read_nothing_beside_a_rate_source_is_its_own_loss() -> None:
    (short,) = read_shortfalls(parse_progress(progress(3, kafka("t", 100, 150, 0), rate(60))))
    assert (short.source_index, short.spanned, short.rows, short.missing) == (0, 50, 0, 50)
    assert short.details()["kind"] == READ_SHORTFALL


def test_the_rate_sources_rows_never_count_toward_a_kafka_source_in_either_order() -> None:
    (short,) = read_shortfalls(parse_progress(progress(3, rate(60), kafka("t", 100, 150, 20))))
    assert (short.source_index, short.missing) == (1, 30)
    assert read_shortfalls(parse_progress(progress(3, rate(60), kafka("t", 100, 150, 50)))) == []


def test_an_absent_count_beside_another_source_is_unknown_not_fine() -> None:
    (short,) = read_shortfalls(parse_progress(progress(3, kafka("t", 100, 150, None), rate(60), total=60)))
    assert short.unknown and (short.source_index, short.spanned, short.rows) == (0, 50, None)
    details = short.details()
    assert (details["kind"], details["rows_read"], details["missing"]) == (ROWS_UNKNOWN, None, None)
    assert "unknown" in short.message(3)
    # also when the other source's own count is absent: the total then is no Kafka count either
    (short,) = read_shortfalls(parse_progress(progress(3, kafka("t", 100, 150, None), rate(None), total=60)))
    assert short.unknown


def test_absent_counts_of_a_kafka_only_batch_fall_back_to_the_total_which_mixes_nothing() -> None:
    two = progress(3, kafka("t", 0, 50, None), kafka("u", 0, 50, None), total=60)
    (short,) = read_shortfalls(parse_progress(two))
    assert (short.source_index, short.spanned, short.rows, short.missing) == (None, 100, 60, 40)
    assert read_shortfalls(parse_progress(progress(3, kafka("t", 0, 50, None), total=50))) == []
    # one source counted, one not: the rest of the total is the uncounted one's
    (short,) = read_shortfalls(parse_progress(progress(3, kafka("t", 0, 50, 50), kafka("u", 0, 50, None),
                                                       total=70)))
    assert (short.source_index, short.missing) == (1, 30)


# ------------------------------------------------------------------ recorded, and verify


def _ledger(tmp_path: Path) -> Any:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine)
    return engine


def _record(engine: Any, *texts: str) -> Any:
    recorder = Recorder(engine)
    out = recorder.record([RunStart("orders", "orders", "q1", "r1", "orders", T0),
                           *(BatchRecord("orders", "orders", parse_progress(t)) for t in texts)])
    recorder.close()
    return out


def test_the_recorder_finds_the_loss_a_rate_source_hid_and_verify_reports_it(tmp_path: Path) -> None:
    from offset_ledger.operate.operations import Operations
    from offset_ledger.operate.verifying import verify_pipeline

    engine = _ledger(tmp_path)
    # batch 2: the rate source's 60 rows, the Kafka source's 0 of 50 (the job read its DataFrame:
    # not the replay of a batch the job skipped, which reads nothing at all)
    out = _record(engine, progress(0, kafka("t", 0, 50, 50), rate(60)),
                  progress(1, kafka("t", 50, 100, 50), rate(60, 60)),
                  progress(2, kafka("t", 100, 150, 0), rate(60, 120)))
    assert [(f.kind, f.topic, f.partition, f.details["missing"]) for f in out.findings] == [("data_loss", "t", 0, 50)]
    report = verify_pipeline(Operations(engine), "orders")
    assert not report.ok
    (loss,) = report.stretches
    assert (loss.kind, loss.from_offset, loss.until_offset, loss.records) == ("loss", 100, 150, 50)


def test_a_run_whose_first_batch_read_only_the_rate_sources_rows_still_lost_the_kafka_ones(tmp_path: Path) -> None:
    # The replay rule (a run's first batch that read nothing at all is a batch the job skipped) is
    # about the whole batch: 60 rate rows read say the DataFrame was read.
    out = _record(_ledger(tmp_path), progress(4, kafka("t", 100, 150, 0), rate(60)))
    assert [(f.kind, f.details["missing"]) for f in out.findings] == [("data_loss", 50)]


def test_an_unknown_count_is_a_finding_and_an_unknown_stretch_in_verify(tmp_path: Path) -> None:
    from offset_ledger.operate.operations import Operations
    from offset_ledger.operate.verifying import verify_pipeline

    engine = _ledger(tmp_path)
    out = _record(engine, progress(0, kafka("t", 0, 50, 50), rate(60)),
                  progress(1, kafka("t", 50, 100, None), rate(60, 60), total=60))
    assert [(f.kind, f.topic, f.details["kind"]) for f in out.findings] == [("data_loss", "t", ROWS_UNKNOWN)]
    with engine.connect() as conn:
        row = conn.execute(select(findings)).one()
    assert (row.batch_id, row.expected_offset, row.actual_offset) == (1, None, None)
    report = verify_pipeline(Operations(engine), "orders")
    assert not report.ok
    (unknown,) = report.stretches
    assert (unknown.kind, unknown.from_offset, unknown.until_offset, unknown.explained) == ("unknown", 50, 100, False)
    doc = verify_answer(report)
    assert doc["summary"]["unknown"] == 1 and doc["summary"]["recordsLost"] == 0
    assert "no row count" in doc["stretches"][0]["notes"][0]
    (row,) = report.table_rows()
    assert (row["status"], row["kind"], row["borders"]) == ("UNEXPLAINED", "unknown", "read by batch 1 of q1")
