"""A Delta txn collision: the version carrying (sink, sequence) counts only if it names this batch.

Over a hand-built ``_delta_log`` in Delta's own commit format (``commitInfo``, ``txn``, ``add``
actions, one JSON object a line, as delta-spark 4.0 writes them); the real-stack case is
``tests/integration/test_sink_delta.py`` (long).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offset_ledger.errors import SinkFenced
from offset_ledger.rules.sink_identity import BatchIdentity, foreign_commit, identity_of
from offset_ledger.sinks.delta import DeltaSink

SINK = "orders:/lake/orders"


def _commit(log: Path, version: int, *, app_id: str, txn: int, metadata: dict | str | None, rows: int) -> None:  # type: ignore[type-arg]
    info: dict = {"timestamp": 1792888200000 + version, "operation": "WRITE",  # type: ignore[type-arg]
                  "operationParameters": {"mode": "Append", "partitionBy": "[]"}, "readVersion": version - 1,
                  "isolationLevel": "Serializable", "isBlindAppend": True,
                  "operationMetrics": {"numFiles": "2", "numOutputRows": str(rows), "numOutputBytes": "1408"},
                  "engineInfo": "Apache-Spark/4.0.0 Delta-Lake/4.0.0", "txnId": f"0f5e-{version}"}
    if metadata is not None:
        info["userMetadata"] = metadata if isinstance(metadata, str) else json.dumps(metadata)
    actions = [{"commitInfo": info}, {"txn": {"appId": app_id, "version": txn, "lastUpdated": 1792888200000}},
               {"add": {"path": f"part-00000-{version}.snappy.parquet", "partitionValues": {}, "size": 704,
                        "modificationTime": 1792888200000, "dataChange": True,
                        "stats": json.dumps({"numRecords": rows})}}]
    (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a, separators=(",", ":")) for a in actions) + "\n")


def _doc(generation_id: int, batch_id: int, query_id: str, sequence: int, *, top_level: bool = True) -> dict:  # type: ignore[type-arg]
    batch = {"query_id": query_id, "batch_id": batch_id, "checkpoint_location": "/ck/gen", "sources": []}
    doc = {"sink": SINK, "sequence": sequence, "generation_id": generation_id, "batch": batch}
    if top_level:
        doc.update(batch_id=batch_id, query_id=query_id)
    return doc


@pytest.fixture
def table(tmp_path: Path) -> Path:
    log = tmp_path / "orders" / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000000.json").write_text(json.dumps(
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}) + "\n" + json.dumps(
        {"metaData": {"id": "5d0c", "format": {"provider": "parquet", "options": {}},
                      "schemaString": "{\"type\":\"struct\",\"fields\":[]}", "partitionColumns": [],
                      "configuration": {}, "createdTime": 1792888200000}}) + "\n")
    _commit(log, 1, app_id=SINK, txn=1, metadata=_doc(1, 0, "q-1", 1), rows=10)
    _commit(log, 2, app_id=SINK, txn=2, metadata=_doc(1, 1, "q-1", 2, top_level=False), rows=10)
    _commit(log, 3, app_id=SINK, txn=3, metadata=_doc(1, 2, "q-1", 3), rows=10)
    return tmp_path / "orders"


def _sink(table: Path) -> DeltaSink:
    return DeltaSink(path=str(table), pipeline="orders", dsn="sqlite:///unused.db", name=SINK)


def test_the_version_of_this_very_batch_is_its_commit(table: Path) -> None:
    assert _sink(table)._find(3, BatchIdentity(SINK, 1, 2, "q-1")).version == 3
    # a commit written before the identity was top-level: read from its batch record
    assert _sink(table)._find(2, BatchIdentity(SINK, 1, 1, "q-1")).version == 2


@pytest.mark.parametrize("live", [
    BatchIdentity(SINK, 2, 0, "q-2"),  # an upgrade (or a zombie's rival) at the same sequence
    BatchIdentity(SINK, 1, 2, "q-lost"),  # a re-created checkpoint: same generation and batch id, new query
])
def test_a_version_of_another_batch_at_the_same_sequence_is_refused(table: Path, live: BatchIdentity) -> None:
    sink = _sink(table)
    with pytest.raises(SinkFenced, match="Delta skipped this batch's write as a duplicate") as refused:
        sink._find(3, live)
    assert refused.value.details["table_version"] == 3
    assert f"written by sink '{SINK}', batch 2 of generation 1 (query q-1)" in str(refused.value)
    assert sink.last is not None and sink.last.verdict == "fenced"


def test_another_writer_under_the_sinks_app_id_is_refused(table: Path) -> None:
    _commit(table / "_delta_log", 4, app_id=SINK, txn=4, metadata="nightly backfill", rows=99)
    _commit(table / "_delta_log", 5, app_id=SINK, txn=5, metadata=None, rows=99)
    for sequence in (4, 5):
        with pytest.raises(SinkFenced, match="a writer that did not name its batch"):
            _sink(table)._find(sequence, BatchIdentity(SINK, 1, 3, "q-1"))


def test_identity_rules() -> None:
    mine = BatchIdentity(SINK, 1, 2, "q")
    assert identity_of(mine.as_doc()) == mine
    assert identity_of({"sink": SINK, "generation_id": 1, "batch": {"batch_id": 2}}) == BatchIdentity(SINK, 1, 2, "")
    assert identity_of({"sequence": 3}) is None and identity_of(None) is None
    assert foreign_commit(mine, 3, 7, mine) is None
    assert foreign_commit(mine, 3, 7, BatchIdentity(SINK, 1, 2, "")) is None  # an old record without a query id
    assert foreign_commit(mine, 3, 7, BatchIdentity("other", 1, 2, "q")) is not None


def test_a_restart_does_not_record_another_writers_version_as_the_sinks(tmp_path: Path) -> None:
    from offset_ledger.ledger.engine import ensure_schema, make_engine

    log = tmp_path / "lake" / "_delta_log"
    log.mkdir(parents=True)
    _commit(log, 0, app_id=SINK, txn=1, metadata="nightly backfill", rows=99)
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(engine)
    try:
        with pytest.raises(SinkFenced, match="table version 0 .*another writer used the sink's application id"):
            _sink(tmp_path / "lake").reconcile(engine)
    finally:
        engine.dispose()
