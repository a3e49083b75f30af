"""The REST API refuses what does not exist and says what does, like the CLI (issue 34).

SQLite ledger seeded through the listener's rows (tests/ops_seed.py); Kafka is a stand-in.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert

from offset_ledger.api import create_app
from offset_ledger.cli.main import main
from offset_ledger.ledger.engine import head_revision, make_engine, upgrade
from offset_ledger.ledger.finding_store import store_findings
from offset_ledger.operate.operations import Operations
from tests.ops_seed import seed_pipeline
from tests.unit.api.test_api_validation import StandInKafka

T0 = datetime(2026, 5, 1, tzinfo=timezone.utc)


@pytest.fixture
def engine(tmp_path: Path):  # type: ignore[no-untyped-def]
    eng = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    upgrade(eng)
    seed_pipeline(eng, "orders", {"orders": {0: 100, 1: 50}, "payments": {0: 10}})
    with eng.begin() as conn:
        store_findings(conn, insert, [
            {"pipeline": "orders", "consumer_group": "orders", "kind": kind, "topic": "orders", "partition": 0,
             "message": f"{kind} {i}", "created_at": T0 + timedelta(hours=i), "run_id": None}
            for i, kind in enumerate(["gap", "data_loss", "gap", "gap"])])
    yield eng
    eng.dispose()


def _client(engine: Any) -> TestClient:
    ops = Operations(engine, kafka=StandInKafka())  # type: ignore[arg-type]
    return TestClient(create_app(operations=ops, tokens=[]), raise_server_exceptions=False,
                      base_url="http://localhost")


@pytest.mark.parametrize("path, message", [
    ("/api/v1/pipelines/ordrs/offsets", "unknown pipeline 'ordrs' (did you mean 'orders'? pipelines: orders)"),
    ("/api/v1/pipelines/orders/offsets?consumerGroup=nope",
     "consumer group 'nope' is not used by pipeline 'orders' (groups: orders)"),
    ("/api/v1/pipelines/orders/history?topic=nosuch",
     "topic 'nosuch' is not read by pipeline 'orders' (topics: orders, payments)"),
    ("/api/v1/pipelines/orders/verify?topic=nosuch",
     "topic 'nosuch' is not read by pipeline 'orders' (topics: orders, payments)"),
    ("/api/v1/pipelines/orders/findings?consumerGroup=nope", "consumer group 'nope'"),
    ("/api/v1/pipelines/ordrs/policies", "unknown pipeline 'ordrs'"),
])
def test_unknown_names_are_404_naming_what_exists(engine: Any, path: str, message: str) -> None:
    answer = _client(engine).get(path)
    assert answer.status_code == 404, answer.text
    assert message in answer.json()["message"] and answer.json()["error"].startswith("Unknown")


def test_the_findings_route_takes_the_cli_filters(engine: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    client = _client(engine)
    every = client.get("/api/v1/pipelines/orders/findings").json()
    assert [f["message"] for f in every["findings"]] == ["gap 3", "gap 2", "data_loss 1", "gap 0"]
    gaps = client.get("/api/v1/pipelines/orders/findings?kind=gap&limit=2").json()
    assert [f["message"] for f in gaps["findings"]] == ["gap 3", "gap 2"] and gaps["nextBefore"] is not None
    rest = client.get(f"/api/v1/pipelines/orders/findings?kind=gap&before={gaps['nextBefore']}").json()
    assert [f["message"] for f in rest["findings"]] == ["gap 0"] and rest["nextBefore"] is None
    since = client.get("/api/v1/pipelines/orders/findings?since=2026-05-01T01:30:00Z").json()
    assert [f["message"] for f in since["findings"]] == ["gap 3", "gap 2"]
    # The command line answers the same rows, field for field.
    try:
        main(["findings", "orders", "--kind", "gap", "--limit", "2", "-f", "json",
              "--dsn", engine.url.render_as_string()])
    except SystemExit as exc:
        assert exc.code in (0, None)
    assert json.loads(capsys.readouterr().out)["findings"] == gaps["findings"]
    bad = client.get("/api/v1/pipelines/orders/findings?since=yesterday")
    assert bad.status_code == 400, bad.text


def test_healthz_reports_the_schema_and_livez_asks_nothing(engine: Any, tmp_path: Path) -> None:
    assert _client(engine).get("/healthz").json() == {"status": "ok",
                                                      "ledger": {"reachable": True, "schema": head_revision()}}
    bare = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")  # a database, but no ledger in it
    try:
        client = _client(bare)
        answer = client.get("/healthz")
        assert answer.status_code == 503 and answer.json()["error"] == "LedgerWithoutSchema", answer.text
        assert client.get("/livez").json() == {"status": "alive"}
    finally:
        bare.dispose()


def test_create_app_never_creates_a_ledger(tmp_path: Path) -> None:
    from offset_ledger.errors import ConfigError

    with pytest.raises(ConfigError, match="no ledger database"):
        create_app(dsn=f"sqlite:///{tmp_path / 'typo.db'}", tokens=[])
    assert not (tmp_path / "typo.db").exists()
