"""Issue 41: a batch that read fewer rows than its ranges span skipped records (the pure rule, and
the ``data_loss`` finding the recorder writes for it, on SQLite; tests/integration has the real case)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import select

from offset_ledger.operate import reads
from offset_ledger.capture.reconcile import CHECKPOINT_SOURCE
from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.records import BatchRecord, RunStart
from offset_ledger.ledger.tables import findings
from offset_ledger.rules.model import BatchOffsets, PartitionRange, SourceProgress
from offset_ledger.rules.read_shortfall import READ_SHORTFALL, read_shortfalls
from offset_ledger.operate.action_answers import verify_answer

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)


def source(index: int, rows: int, *ranges: tuple[str, int, int | None, int]) -> SourceProgress:
    return SourceProgress(index, f"KafkaV2[Subscribe[{ranges[0][0]}]]",
                          tuple(PartitionRange(*r) for r in ranges), rows)


def uncounted(s: SourceProgress) -> SourceProgress:
    """The source as a report without its ``numInputRows`` parses."""
    return replace(s, rows_reported=False)


def batch(batch_id: int, *sources: SourceProgress, rows: int | None = None) -> BatchOffsets:
    total = sum(s.input_rows for s in sources) if rows is None else rows
    return BatchOffsets("q1", "r1", "orders", batch_id, T0, total, tuple(sources))


def test_rows_equal_to_the_span_are_no_shortfall() -> None:
    assert read_shortfalls(batch(1, source(0, 50, ("t", 0, 300, 350)))) == []
    # more rows than offsets (a job that scanned its batch twice) is no loss either
    assert read_shortfalls(batch(1, source(0, 80, ("t", 0, 300, 350)))) == []


def test_a_one_partition_source_names_the_partition_and_the_count() -> None:
    (short,) = read_shortfalls(batch(6, source(0, 12, ("t", 0, 300, 350))))
    assert (short.source_index, short.spanned, short.rows, short.missing) == (0, 50, 12, 38)
    assert short.partition_range == PartitionRange("t", 0, 300, 350)
    assert short.details() == {"kind": READ_SHORTFALL, "source_index": 0, "rows_read": 12, "offsets_spanned": 50,
                               "missing": 38, "per_partition": True, "ranges": [["t", 0, 300, 350]]}
    assert "batch 6 read 12 rows of 50 offsets (t-0 [300, 350)): 38 records not read" in short.message(6)


def test_a_partition_that_read_nothing_beside_one_that_did_is_the_source_total() -> None:
    # Spark counts rows per source, not per partition: a source of two spanning partitions is one total.
    (short,) = read_shortfalls(batch(2, source(0, 70, ("t", 0, 0, 50), ("t", 1, 0, 50))))
    assert (short.missing, short.partition_range, short.details()["per_partition"]) == (30, None, False)
    # an idle partition spans nothing: the other one is then exactly where the records went missing
    (short,) = read_shortfalls(batch(2, source(0, 20, ("t", 0, 0, 50), ("t", 1, 9, 9))))
    assert short.partition_range == PartitionRange("t", 0, 0, 50)


def test_a_source_reading_several_topics_is_one_shortfall_and_other_sources_keep_theirs() -> None:
    shorts = read_shortfalls(batch(3, source(0, 100, ("a", 0, 0, 60), ("b", 0, 0, 60)),
                                   source(2, 40, ("c", 0, 10, 50))))
    assert [(s.source_index, s.missing, {r.topic for r in s.ranges}) for s in shorts] == [(0, 20, {"a", "b"})]


def test_rows_not_counted_by_spark_are_never_a_loss() -> None:
    short = batch(4, source(0, 0, ("t", 0, 0, 50)))
    # read back from a checkpoint, or recorded by a transactional sink: rows are the span stand-in
    assert read_shortfalls(replace(short, recorded_by=CHECKPOINT_SOURCE)) == []
    assert read_shortfalls(replace(short, recorded_by="sink")) == []
    # a range whose start was not reported: nothing to compare with
    assert read_shortfalls(batch(0, source(0, 0, ("t", 0, None, 50)))) == []
    # no per-source count (absent from the report, not 0) but the batch total, of Kafka sources only,
    # covers the span: no loss
    assert read_shortfalls(batch(4, uncounted(source(0, 0, ("t", 0, 0, 50))), rows=50)) == []


def test_a_non_kafka_source_never_hides_a_kafka_source_shortfall() -> None:
    # 60 rows of a rate source in the batch total beside a Kafka source that read 50 of 100
    (short,) = read_shortfalls(batch(7, source(0, 50, ("t", 0, 0, 100)), rows=110))
    assert (short.source_index, short.missing) == (0, 50)


def test_without_per_source_counts_the_batch_total_is_used() -> None:
    # Only where the report has no per-source count (absent, not 0) and no non-Kafka source shares
    # the total (issue 47: counts of 0 are counts; tests/unit/capture/test_loss_per_source.py)
    two = (uncounted(source(0, 0, ("t", 0, 0, 50))), uncounted(source(1, 0, ("u", 0, 0, 50))))
    (short,) = read_shortfalls(batch(5, *two, rows=60))
    assert (short.source_index, short.spanned, short.rows, short.missing) == (None, 100, 60, 40)
    assert [(s.source_index, s.missing) for s in read_shortfalls(batch(5, source(0, 0, ("t", 0, 0, 50)),
                                                                       source(1, 0, ("u", 0, 0, 50)), rows=60))] \
        == [(0, 50), (1, 50)]


def test_the_recorder_writes_one_data_loss_finding_per_short_source(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine)
    recorder = Recorder(engine)
    out = recorder.record([RunStart("orders", "orders", "q1", "r1", "orders", T0),
                           BatchRecord("orders", "orders", batch(0, source(0, 50, ("t", 0, 250, 300)))),
                           BatchRecord("orders", "orders", batch(1, source(0, 3, ("t", 0, 300, 350))))])
    assert [(f.kind, f.topic, f.partition, f.details["missing"]) for f in out.findings] == [("data_loss", "t", 0, 47)]
    # a re-delivered event changes nothing: no second finding
    recorder.record([BatchRecord("orders", "orders", batch(1, source(0, 3, ("t", 0, 300, 350))))])
    with engine.connect() as conn:
        rows = conn.execute(select(findings)).all()
    assert [(r.kind, r.topic, r.partition, r.batch_id, r.expected_offset, r.actual_offset, r.details["kind"])
            for r in rows] == [("data_loss", "t", 0, 1, None, None, READ_SHORTFALL)]


def test_verify_and_the_pipelines_list_report_the_loss_without_kafka(tmp_path: Path) -> None:
    from offset_ledger.operate.operations import Operations
    from offset_ledger.operate.verifying import verify_pipeline

    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine)
    Recorder(engine).record([RunStart("orders", "orders", "q1", "r1", "orders", T0),
                             BatchRecord("orders", "orders", batch(0, source(0, 50, ("t", 0, 250, 300)))),
                             BatchRecord("orders", "orders", batch(1, source(0, 3, ("t", 0, 300, 350)))),
                             BatchRecord("orders", "orders", batch(2, source(0, 50, ("t", 0, 350, 400))))])
    ops = Operations(engine)
    report = verify_pipeline(ops, "orders")
    assert not report.ok
    (loss,) = [s for s in report.stretches if s.kind == "loss"]
    assert (loss.topic, loss.partition, loss.from_offset, loss.until_offset, loss.records, loss.explained) == (
        "t", 0, 300, 350, 47, False)
    doc = verify_answer(report)
    assert doc["summary"]["unexplainedLosses"] == 1 and doc["summary"]["recordsLost"] == 47
    assert doc["stretches"][0]["notes"][0].startswith("Kafka not configured")
    assert [s.kind for s in report.stretches] == ["loss"]  # the planned ranges tile: no gap
    (summary,) = reads.list_pipelines(ops, with_lag=False)
    assert (summary.status, summary.records_lost, summary.to_dict()["recordsLost"]) == ("ERR", 47, 47)
    assert reads.records_lost(ops) == {("orders", "orders", "t", 0): 47}


def test_a_batch_a_sink_recorded_first_gets_its_finding_from_the_listener_once(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine)
    recorder = Recorder(engine)
    listener = batch(1, source(0, 3, ("t", 0, 300, 350)))
    # the sink's record: offsets from the checkpoint, the span standing in for the rows
    sink = replace(listener, run_id="sink:q1", recorded_by="sink", input_rows=50,
                   sources=(source(0, 50, ("t", 0, 300, 350)),))
    recorder.record([RunStart("orders", "orders", "q1", "sink:q1", None, T0),
                     BatchRecord("orders", "orders", sink)])
    recorder.record([RunStart("orders", "orders", "q1", "r1", "orders", T0),
                     BatchRecord("orders", "orders", listener)])
    Recorder(engine).record([BatchRecord("orders", "orders", listener)])  # a spool replay, a fresh recorder
    with engine.connect() as conn:
        rows = conn.execute(select(findings.c.kind, findings.c.batch_id, findings.c.run_id)).all()
    assert [tuple(r) for r in rows] == [("data_loss", 1, "r1")]


def test_a_run_whose_first_batch_read_nothing_replayed_a_batch_its_job_skipped(tmp_path: Path) -> None:
    # After a crash Spark re-runs the uncommitted batch; a transactional sink (any idempotent
    # foreachBatch) that committed it already leaves its DataFrame unread: 0 rows, not a loss.
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine)
    recorder = Recorder(engine)
    recorder.record([RunStart("orders", "orders", "q1", "r1", "orders", T0),
                     BatchRecord("orders", "orders", batch(4, source(0, 0, ("t", 0, 200, 250))))])
    # the same run's next batch reading nothing is a loss; so is a first batch that read some rows
    out = recorder.record([BatchRecord("orders", "orders", batch(5, source(0, 0, ("t", 0, 250, 300))))])
    assert [(f.kind, f.details["missing"]) for f in out.findings] == [("data_loss", 50)]
    out = Recorder(engine).record([RunStart("orders", "orders", "q1", "r2", "orders", T0),
                                   BatchRecord("orders", "orders", replace(
                                       batch(6, source(0, 10, ("t", 0, 300, 350))), run_id="r2"))])
    assert [(f.kind, f.details["missing"]) for f in out.findings] == [("data_loss", 40)]
