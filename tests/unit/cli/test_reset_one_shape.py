"""One fact, one name, one value: a reset's partitions as the CLI (table, CSV, JSON) and the REST API
show them, and the audit trail after it (issue 51, the reset family).

Before: the CLI's CSV said ``before/target/skip`` where the JSON said ``beforeNextOffset/
targetNextOffset/recordsSkipped`` and the audit ``afterNextOffset``; a refused target was ``-`` in the
table but 99,999 in JSON with 97,059 records "skipped" beside it, and the audit trail showed the
refused move unmarked. Every reset mode and out-of-range case runs through every face here, and
each column a face prints is checked against the JSON field of the same name.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from offset_ledger.cli import reset as cli_reset
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.operate.operations import Operations
from tests.ops_seed import seed_pipeline
from tests.unit.api.test_api_validation import StandInKafka
from tests.unit.cli.cli_run import run_cli

# (CLI arguments, the same request as the API's body); the log holds [10, 1000), positions 500/600/700.
CASES = [
    (["--to-earliest"], {"mode": "earliest"}),
    (["--to-latest"], {"mode": "latest"}),
    (["--shift-by", "-550", "--out-of-range", "clamp"], {"mode": "shift", "shiftBy": -550, "outOfRange": "clamp"}),
    (["--shift-by", "-550", "--out-of-range", "refuse"], {"mode": "shift", "shiftBy": -550, "outOfRange": "refuse"}),
    (["--to-offset", "99999"], {"mode": "offsets", "offsets": {"orders": {"0": 99999, "1": 99999, "2": 99999}}}),
    (["--to-offset", "99999", "--out-of-range", "clamp"],
     {"mode": "offsets", "offsets": {"orders": {"0": 99999, "1": 99999, "2": 99999}}, "outOfRange": "clamp"}),
]


@pytest.fixture
def dsn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = make_engine(url)
    upgrade(engine)
    seed_pipeline(engine, "orders-etl", {"orders": {0: 500, 1: 600, 2: 700}})
    engine.dispose()

    def operations(ledger: Any, kafka: Any = None) -> Operations:
        return Operations(make_engine(ledger.dsn, create=False), kafka=StandInKafka())  # type: ignore[arg-type]

    monkeypatch.setattr(cli_reset, "open_operations", operations)
    return url


def _api(dsn: str) -> tuple[TestClient, Any]:
    from offset_ledger.api import create_app

    engine = make_engine(dsn)
    ops = Operations(engine, kafka=StandInKafka())  # type: ignore[arg-type]
    return TestClient(create_app(operations=ops, api_token=""), raise_server_exceptions=False,
                      base_url="http://localhost"), engine


def _as_csv(value: Any) -> str:
    return "" if value is None else str(value)


@pytest.mark.parametrize("argv, body", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_every_face_names_and_values_a_reset_the_same(dsn: str, argv: list[str], body: dict[str, Any],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "reset", "orders-etl", *argv, "--dsn", dsn, "-f", "json")
    assert code == 0, err
    from_cli = json.loads(out)
    code, out, _ = run_cli(capsys, "reset", "orders-etl", *argv, "--dsn", dsn, "-f", "csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    client, engine = _api(dsn)
    try:
        r = client.post("/api/v1/pipelines/orders-etl/resets", json={**body, "dryRun": True})
        assert r.status_code == 200, r.text
        from_api = r.json()
    finally:
        engine.dispose()

    assert from_cli["partitions"] == from_api["partitions"]
    assert from_cli["newPositions"] == from_api["newPositions"]
    assert from_cli["wouldBeRefused"] == from_api["wouldBeRefused"]
    costs = {(c["topic"], c["partition"]): c for c in (from_cli["cost"] or {}).get("partitions", [])}
    by_tp = {(p["topic"], p["partition"]): p for p in from_cli["partitions"]}
    assert len(rows) == len(by_tp)
    vocabulary = {k for p in from_cli["partitions"] for k in p} | {"approxBytes", "spanSeconds"}
    for c in costs.values():  # the cost's per-partition names, as the API's cost.partitions spells them
        assert {"approxBytes", "spanSeconds"} <= set(c)
    for row in rows:
        tp = (row["topic"], int(row["partition"]))
        fact = {**costs.get(tp, {}), **by_tp[tp]}
        for column, shown in row.items():
            assert column in vocabulary, f"CSV column {column!r} is no name the JSON answer uses"
            assert shown == _as_csv(fact.get(column)), (column, shown, fact.get(column))

    for p in from_cli["partitions"]:
        refused = p["outOfRange"] is not None and not p["clamped"]
        assert p["refused"] is refused
        if refused:  # not a target: nothing would be written, replayed or skipped there
            assert p["targetNextOffset"] is None and p["recordsReplayed"] is None and p["recordsSkipped"] is None
            assert p["requestedNextOffset"] in (99999, p["beforeNextOffset"] - 550)
            assert str(p["partition"]) not in from_cli["newPositions"].get(p["topic"], {})
            assert (p["topic"], p["partition"]) not in costs  # the cost counts moves that can happen
        else:
            assert from_cli["newPositions"][p["topic"]][str(p["partition"])] == p["targetNextOffset"]
            assert p["logStartOffset"] <= p["targetNextOffset"] <= p["logEndOffset"]
    refused = sum(p["refused"] for p in from_cli["partitions"])
    assert from_cli["wouldBeRefused"] is (refused > 0)


def test_a_refused_move_reads_as_refused_on_stderr_and_in_the_audit_trail(
        dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "reset", "orders-etl", "--to-offset", "99999", "--dsn", dsn)
    assert code == 0
    assert "skips" not in err.split("\n")[0] or "not counted" in err.split("\n")[0], err
    assert "3 partitions refused" in err
    head, *lines = out.splitlines()
    target = head.split().index("TARGET_NEXT_OFFSET")
    assert [line.split()[target] for line in lines] == ["-"] * 3  # never a position Kafka could not hold
    code, out, _ = run_cli(capsys, "resets", "orders-etl", "--dsn", dsn, "-f", "json")
    from_cli = json.loads(out)
    client, engine = _api(dsn)
    try:
        from_api = client.get("/api/v1/pipelines/orders-etl/resets").json()
    finally:
        engine.dispose()
    assert from_cli["resets"] == from_api["resets"]
    (audited,) = from_cli["resets"]
    for p in audited["partitions"]:
        assert p["refused"] is True and p["targetNextOffset"] is None
        assert p["afterNextOffset"] == 99999  # the stored request, kept under its old name for scripts
    code, out, _ = run_cli(capsys, "resets", "orders-etl", "--dsn", dsn, "-f", "csv")
    (row,) = list(csv.DictReader(io.StringIO(out)))
    assert "orders:0 500->99999 refused" in row["changes"]


def test_an_export_of_a_refused_plan_is_refused(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--export`` writes targets to apply (``--from-file``): a target Kafka cannot hold is not written."""
    code, out, err = run_cli(capsys, "reset", "orders-etl", "--to-offset", "99999", "--export", "--dsn", dsn)
    assert code == 3 and out == "" and "outside the log" in err
