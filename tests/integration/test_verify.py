"""``offset-ledger verify`` on a history a real pipeline wrote (issue 25): Spark + Kafka + the listener.

The pipeline runs, restarts on its checkpoint, restarts on a clean checkpoint (new app version), gets
a reset from the command line and restarts through it. Verify then exits 0 and names the reset as
the explanation of the stretch it re-reads. A gap and an overlap made by hand in ``batch_offsets``
are then reported, exactly those two stretches, with exit code 6; the REST endpoint says the same.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from sqlalchemy import create_engine, text

from offset_ledger import start_from_ledger
from tests.integration.test_adopt_replay import _cli
from tests.integration.test_authority import _positions, _recorded_run
from tests.integration.test_restart import _values
from tests.tamper import shift_recorded_start


def _sql(dsn: str, statement: str, **params: object) -> list:
    engine = create_engine(dsn)
    try:
        with engine.begin() as conn:
            result = conn.execute(text(statement), params)
            return list(result) if result.returns_rows else []
    finally:
        engine.dispose()


def _capture(name: str, output: str) -> None:
    """Keep the real output for the docs when OFFSET_LEDGER_VERIFY_CAPTURE names a directory."""
    where = os.environ.get("OFFSET_LEDGER_VERIFY_CAPTURE")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        (Path(where) / name).write_text(output)


def test_verify_names_the_reset_and_reports_exactly_a_hand_made_gap_and_overlap(
        spark, kafka, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=3)
    root = tmp_path / "checkpoints"

    def start(version: str):  # type: ignore[no-untyped-def]
        return start_from_ledger("orders", [topic], bootstrap_servers=kafka.bootstrap_servers,
                                 checkpoint_root=str(root), dsn=pg_dsn, app_version=version)

    kafka.produce(topic, _values("a", 60))
    plan1 = start("1")
    seen, _ = _recorded_run(spark, kafka, pg_dsn, topic, plan1, tmp_path, max_per_trigger=9)
    assert seen == Counter(_values("a", 60)) and _positions(pg_dsn) == {0: 20, 1: 20, 2: 20}

    # Restart 1: same app version, the same checkpoint generation (Spark resumes from it).
    kafka.produce(topic, _values("b", 30))
    plan2 = start("1")
    assert not plan2.fresh_checkpoint and plan2.checkpoint_location == plan1.checkpoint_location
    seen, _ = _recorded_run(spark, kafka, pg_dsn, topic, plan2, tmp_path, max_per_trigger=9)
    assert seen == Counter(_values("b", 30)) and _positions(pg_dsn) == {0: 30, 1: 30, 2: 30}

    # Restart 2: a new app version, so a clean checkpoint (generation 2) starting at the positions.
    kafka.produce(topic, _values("c", 30))
    plan3 = start("2")
    assert plan3.fresh_checkpoint and plan3.generation == 2
    seen, _ = _recorded_run(spark, kafka, pg_dsn, topic, plan3, tmp_path, max_per_trigger=9)
    assert seen == Counter(_values("c", 30)) and _positions(pg_dsn) == {0: 40, 1: 40, 2: 40}

    # A reset from the command line: read the last 5 records of each partition again.
    reset = _cli("reset", "orders", "--shift-by", "-5", "--execute", "--reason", "replay after the sink fix",
                 "--actor", "alice", "--dsn", pg_dsn, "--bootstrap-server", kafka.bootstrap_servers, "-f", "json")
    assert reset.returncode == 0, reset.stderr
    (reset_id,) = [r.id for r in _sql(pg_dsn, "SELECT id FROM resets WHERE NOT dry_run")]
    plan4 = start("2")
    assert plan4.fresh_checkpoint and plan4.starting_offsets == {topic: {"0": 35, "1": 35, "2": 35}}
    seen, _ = _recorded_run(spark, kafka, pg_dsn, topic, plan4, tmp_path, max_per_trigger=9)
    assert seen == Counter(_values("c", 30)[-15:])  # 5 per partition, read again on purpose

    done = _cli("verify", "orders", "--dsn", pg_dsn)
    _capture("verify-ok.txt", done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    report = _cli("verify", "orders", "--dsn", pg_dsn, "-f", "json")
    assert report.returncode == 0, report.stderr
    doc = json.loads(report.stdout)
    assert doc["ok"] is True and doc["summary"]["unexplained"] == 0
    assert doc["summary"]["partitions"] == 3
    explained = [(s["partition"], s["fromOffset"], s["untilOffset"], s["kind"], s["explained"]) for s in doc["stretches"]]
    assert explained == [(p, 35, 40, "overlap", True) for p in range(3)]
    for s in doc["stretches"]:
        (why,) = s["reasons"]
        assert why["kind"] == "reset" and why["id"] == reset_id
        assert "alice" in why["detail"] and "replay after the sink fix" in why["detail"]
        assert {b["generation"] for b in s["batches"]} == {2, 3}  # the run before the reset and the one after
    assert [p["position"] for p in doc["partitions"]] == [40, 40, 40]

    # By hand: partition 0 of one of generation 1's batches starts 2 later (a gap), partition 1 of
    # another starts 3 earlier (an overlap). Both in stretches nothing else touches.
    q1 = _sql(pg_dsn, "SELECT r.query_id FROM runs r JOIN checkpoint_generations g ON g.id = r.generation_id "
                      "WHERE g.generation = 1 LIMIT 1")[0].query_id
    gap_row = _sql(pg_dsn, "SELECT batch_id, from_offset FROM v_batch_offsets WHERE query_id = :q AND \"partition\" = 0 "
                           "AND from_offset >= 6 AND until_offset - from_offset >= 3 ORDER BY batch_id LIMIT 1", q=q1)[0]
    over_row = _sql(pg_dsn, "SELECT batch_id, from_offset FROM v_batch_offsets WHERE query_id = :q AND \"partition\" = 1 "
                            "AND from_offset >= 9 ORDER BY batch_id LIMIT 1", q=q1)[0]
    engine = create_engine(pg_dsn)
    try:
        shift_recorded_start(engine, partition=0, by=2, batch_id=gap_row.batch_id, query_id=q1)
        shift_recorded_start(engine, partition=1, by=-3, batch_id=over_row.batch_id, query_id=q1)
    finally:
        engine.dispose()

    table = _cli("verify", "orders", "--dsn", pg_dsn)
    _capture("verify-unexplained.txt", table.stdout + table.stderr)
    assert table.returncode == 6, table.stdout + table.stderr
    assert "UNEXPLAINED" in table.stdout and "2 unexplained stretch(es)" in table.stderr
    bad = _cli("verify", "orders", "--dsn", pg_dsn, "-f", "json")
    assert bad.returncode == 6
    doc = json.loads(bad.stdout)
    _capture("verify-unexplained.json", bad.stdout)
    unexplained = [(s["topic"], s["partition"], s["fromOffset"], s["untilOffset"], s["kind"])
                   for s in doc["stretches"] if not s["explained"]]
    assert unexplained == [
        (topic, 0, gap_row.from_offset, gap_row.from_offset + 2, "gap"),
        (topic, 1, over_row.from_offset - 3, over_row.from_offset, "overlap"),
    ]
    gap = next(s for s in doc["stretches"] if s["kind"] == "gap")
    assert gap["after"] == {"queryId": q1, "batchId": gap_row.batch_id, "generation": 1}
    assert gap["before"]["generation"] == 1 and gap["before"]["batchId"] < gap_row.batch_id
    assert sum(1 for s in doc["stretches"] if s["explained"]) == 3  # the reset's, unchanged

    # The REST endpoint over the same ledger answers the same.
    from fastapi.testclient import TestClient

    from offset_ledger.api import create_app
    from offset_ledger.ledger.engine import make_engine
    from offset_ledger.operate.operations import Operations

    engine = make_engine(pg_dsn)
    try:
        client = TestClient(create_app(operations=Operations(engine), api_token=""), base_url="http://localhost")
        answer = client.get("/api/v1/pipelines/orders/verify", params={"unexplainedOnly": "true"}).json()
        assert answer["ok"] is False
        assert [(s["partition"], s["fromOffset"], s["kind"]) for s in answer["stretches"]] == [
            (0, gap_row.from_offset, "gap"), (1, over_row.from_offset - 3, "overlap")]
    finally:
        engine.dispose()
