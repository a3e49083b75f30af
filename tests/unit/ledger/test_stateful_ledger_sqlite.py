"""Per-batch event time and state figures in the ledger (0004) on the embedded SQLite file."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import inspect, select, text

from offset_ledger.operate import reads
from offset_ledger.ledger.engine import current_revision, ensure_schema, head_revision, make_engine, upgrade
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.records import BatchRecord
from offset_ledger.ledger.tables import batches
from offset_ledger.operate.operations import Operations
from offset_ledger.rules.model import BatchOffsets, PartitionRange, SourceProgress

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)
_ADDED = ["watermark", "event_time_min", "event_time_max", "state_rows_total", "state_rows_updated",
          "state_rows_dropped_by_watermark"]


def _batch(batch_id: int, since: int, until: int, **stateful: object) -> BatchRecord:
    ranges = (PartitionRange("t", 0, since, until),)
    b = BatchOffsets("q1", "r1", "orders", batch_id, T0 + timedelta(seconds=batch_id), until - since,
                     (SourceProgress(0, "KafkaV2[Subscribe[t]]", ranges, until - since),))
    return BatchRecord("orders", "orders", replace(b, **stateful))  # type: ignore[arg-type]


def test_upgrade_from_0003_with_data_adds_the_columns_and_keeps_rows(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        upgrade(engine, "0003")
        with engine.begin() as conn:
            # 0001 builds tables from the live module: take 0004's columns away to get a real 0003 ledger.
            for view in ("v_pipeline_activity", "v_batch_history"):
                conn.execute(text(f"DROP VIEW {view}"))
            for column in _ADDED:
                conn.execute(text(f"ALTER TABLE batches DROP COLUMN {column}"))
            conn.execute(text(
                "INSERT INTO batches (pipeline, consumer_group, query_id, run_id, batch_id, batch_time, "
                "recorded_at, input_rows) VALUES ('orders', 'orders', 'q0', 'r0', 0, :at, :at, 5)"), {"at": T0})
        assert not set(_ADDED) & {c["name"] for c in inspect(engine).get_columns("batches")}
        upgrade(engine)
        assert current_revision(engine) == head_revision()
        assert set(_ADDED) <= {c["name"] for c in inspect(engine).get_columns("batches")}
        with engine.connect() as conn:
            row = conn.execute(select(batches)).one()
            assert (row.query_id, row.input_rows, row.watermark, row.state_rows_total) == ("q0", 5, None, None)
            # The views came back and still answer.
            assert conn.execute(text("SELECT COUNT(*) FROM v_batch_history")).scalar() == 0
            assert conn.execute(text("SELECT batches_recorded FROM v_pipeline_activity")).scalar() == 1
        # A fresh database at head has the columns from 0001 already: 0004 adds nothing twice.
        fresh = make_engine(f"sqlite:///{tmp_path / 'fresh.db'}")
        ensure_schema(fresh)
        assert current_revision(fresh) == head_revision()
        fresh.dispose()
    finally:
        engine.dispose()


def test_recorder_stores_event_time_and_state_and_history_shows_them(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine)
    recorder = Recorder(engine)
    try:
        recorder.record([_batch(0, 0, 10, watermark=datetime(1970, 1, 1, tzinfo=timezone.utc),
                                event_time_min=T0, event_time_max=T0 + timedelta(seconds=9),
                                state_rows_total=2, state_rows_updated=2, state_rows_dropped_by_watermark=0)])
        recorder.record([_batch(1, 10, 20)])
        page = reads.history(Operations(engine), "orders")
        newest, oldest = page.items
        assert newest["watermark"] is None and newest["stateRowsTotal"] is None
        assert oldest["watermark"] == "1970-01-01T00:00:00+00:00"
        assert oldest["eventTimeMin"] == T0.isoformat()
        assert oldest["eventTimeMax"] == (T0 + timedelta(seconds=9)).isoformat()
        assert (oldest["stateRowsTotal"], oldest["stateRowsUpdated"], oldest["stateRowsDroppedByWatermark"]) == (2, 2, 0)
    finally:
        recorder.close()
        engine.dispose()
