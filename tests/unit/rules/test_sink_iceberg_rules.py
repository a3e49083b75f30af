"""The Iceberg sink's pure rules: which snapshot is a batch's, and what a restart must record.

Over a hand-built table metadata file in the shape Iceberg 1.12 writes (format version 2, the
snapshot summary holding the ``snapshot-property.*`` write options); the real-stack case is
``tests/integration/test_sink_iceberg.py`` (long).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offset_ledger.errors import CheckpointFormatError, SinkFenced
from offset_ledger.rules.iceberg_snapshots import (
    carrying,
    colliding,
    metadata_version,
    not_recorded,
    parse_metadata,
    snapshot_properties,
)
from offset_ledger.rules.sink_identity import BatchIdentity
from offset_ledger.sinks.iceberg import IcebergSink

SINK = "orders:offset_ledger.db.orders"


def _snapshot(snapshot_id: int, parent: int | None, props: dict[str, str], rows: int) -> dict:  # type: ignore[type-arg]
    summary = {"operation": "append", "spark.app.id": "local-1795720768245", "added-data-files": "2",
               "added-records": str(rows), "added-files-size": "1408", "changed-partition-count": "1",
               "total-records": "0", **props}
    snap = {"sequence-number": snapshot_id % 100, "snapshot-id": snapshot_id, "timestamp-ms": 1795720768245,
            "summary": summary, "manifest-list": f"/wh/db/orders/metadata/snap-{snapshot_id}-1-x.avro",
            "schema-id": 0}
    if parent is not None:
        snap["parent-snapshot-id"] = parent
    return snap


def _props(generation: int, batch: int, query: str, sequence: int) -> dict[str, str]:
    return snapshot_properties(BatchIdentity(SINK, generation, batch, query), sequence,
                               {"query_id": query, "batch_id": batch, "checkpoint_location": "/ck", "sources": []})


def _metadata(snapshots: list[dict], current: int | None) -> bytes:  # type: ignore[type-arg]
    return json.dumps({"format-version": 2, "table-uuid": "5d0c", "location": "/wh/db/orders",
                       "last-sequence-number": len(snapshots), "current-snapshot-id": -1 if current is None else current,
                       "snapshots": snapshots, "properties": {}}).encode()


def _table(root: Path, snapshots: list[dict], current: int | None, version: int = 3) -> Path:  # type: ignore[type-arg]
    meta = root / "wh" / "db" / "orders" / "metadata"
    meta.mkdir(parents=True, exist_ok=True)
    (meta / f"v{version}.metadata.json").write_bytes(_metadata(snapshots, current))
    (meta / "version-hint.text").write_text(str(version))
    return root / "wh"


CHAIN = [_snapshot(101, None, _props(1, 0, "q-1", 1), 10), _snapshot(102, 101, {}, 5),  # 102: another writer
         _snapshot(103, 102, _props(1, 1, "q-1", 2), 10)]


def test_the_current_ancestry_oldest_first_and_a_rolled_back_snapshot_is_not_the_table() -> None:
    rolled_back = _snapshot(104, 103, _props(1, 2, "q-1", 3), 10)
    chain = parse_metadata(_metadata([*CHAIN, rolled_back], 103), "m")
    assert [s.snapshot_id for s in chain] == [101, 102, 103]
    assert chain[-1].sequence == 2 and chain[-1].added_records == 10 and chain[1].sink is None
    assert parse_metadata(_metadata([], None), "m") == []
    with pytest.raises(CheckpointFormatError):
        parse_metadata(b"{not json", "m")
    assert metadata_version("v12.metadata.json") == 12 and metadata_version("version-hint.text") is None


def test_a_batchs_own_snapshot_and_a_colliding_one() -> None:
    chain = parse_metadata(_metadata(CHAIN, 103), "m")
    snap = carrying(chain, SINK, 2)
    assert snap is not None and snap.snapshot_id == 103 and carrying(chain, SINK, 3) is None
    assert colliding(BatchIdentity(SINK, 1, 1, "q-1"), 2, snap, "/wh/db/orders") is None
    why = colliding(BatchIdentity(SINK, 2, 0, "q-2"), 2, snap, "/wh/db/orders")
    assert why is not None and why.startswith(f"snapshot 103 of /wh/db/orders carries ({SINK}, sequence 2) but was "
                                              f"written by sink '{SINK}', batch 1 of generation 1 (query q-1)")
    # a re-created checkpoint: same generation and batch id, another query
    assert colliding(BatchIdentity(SINK, 1, 1, "q-lost"), 2, snap, "/wh/db/orders") is not None


def test_what_a_restart_records_is_above_the_ledgers_last_sequence() -> None:
    chain = parse_metadata(_metadata(CHAIN, 103), "m")
    assert [s.snapshot_id for s in not_recorded(chain, SINK, 0)] == [101, 103]
    assert [s.snapshot_id for s in not_recorded(chain, SINK, 1)] == [103]
    assert not_recorded(chain, "other", 0) == []
    assert chain[0].doc() == {"sink": SINK, "sequence": 1, "generation_id": 1, "batch_id": 0, "query_id": "q-1",
                              "batch": {"query_id": "q-1", "batch_id": 0, "checkpoint_location": "/ck", "sources": []}}


def _sink(warehouse: Path) -> IcebergSink:
    return IcebergSink(table="db.orders", warehouse=str(warehouse), pipeline="orders", dsn="sqlite:///unused.db",
                       name=SINK)


def test_the_sink_reads_the_tables_metadata_files(tmp_path: Path) -> None:
    sink = _sink(_table(tmp_path, CHAIN, 103))
    assert sink.location == str(tmp_path / "wh" / "db" / "orders")
    assert [s.snapshot_id for s in sink._snapshots()] == [101, 102, 103]
    assert sink._own(BatchIdentity(SINK, 1, 1, "q-1"), 2) is not None
    with pytest.raises(SinkFenced, match="this batch's rows were not written") as refused:
        sink._own(BatchIdentity(SINK, 2, 0, "q-2"), 2)
    assert refused.value.details["table_version"] == 103
    assert sink.last is not None and sink.last.verdict == "fenced"
    assert _sink(tmp_path / "nowhere")._snapshots() == []


def test_bad_arguments_are_refused() -> None:
    from offset_ledger.errors import ConfigError

    with pytest.raises(ConfigError, match="namespace.name"):
        IcebergSink(table="orders", warehouse="/wh", pipeline="p", dsn="sqlite://")
    with pytest.raises(ConfigError, match="warehouse"):
        IcebergSink(table="db.orders", warehouse=" ", pipeline="p", dsn="sqlite://")


def test_a_restart_refuses_a_snapshot_with_the_sinks_sequence_but_no_batch(tmp_path: Path) -> None:
    from offset_ledger.ledger.engine import ensure_schema, make_engine

    forged = _snapshot(201, None, {"offset-ledger.sink": SINK, "offset-ledger.sequence": "1"}, 99)
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine)
    try:
        with pytest.raises(SinkFenced, match="snapshot 201 .*does not name a batch of the sink"):
            _sink(_table(tmp_path, [forged], 201)).reconcile(engine)
    finally:
        engine.dispose()
