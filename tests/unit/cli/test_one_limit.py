"""One page-size range everywhere (issue 50, item 4): every CLI --limit and every API limit take
1..MAX_LIMIT, and ``resets --limit 1000`` is no longer refused (it asked the ledger for 1001)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.operate.inputs import MAX_LIMIT
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.reset_operations import reset
from offset_ledger.rules.resets import ResetRequest
from tests.ops_seed import seed_pipeline
from tests.unit.api.test_api_validation import StandInKafka
from tests.unit.cli.cli_run import run_cli


@pytest.fixture
def dsn(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = make_engine(url)
    upgrade(engine)
    seed_pipeline(engine, "orders-etl", {"orders": {0: 500, 1: 600, 2: 700}})
    ops = Operations(engine, kafka=StandInKafka())  # type: ignore[arg-type]
    for _ in range(3):
        reset(ops, "orders-etl", ResetRequest("earliest"), actor="t", reason=None, dry_run=True)
    engine.dispose()
    return url


@pytest.mark.parametrize("command", ["history", "findings", "resets"])
def test_every_cli_limit_takes_the_same_range(dsn: str, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = run_cli(capsys, command, "orders-etl", "--limit", str(MAX_LIMIT), "--dsn", dsn)
    assert code == 0, err
    for bad in (0, MAX_LIMIT + 1):
        code, _out, err = run_cli(capsys, command, "orders-etl", "--limit", str(bad), "--dsn", dsn)
        assert code == 2 and f"--limit must be between 1 and {MAX_LIMIT}, not {bad}" in err, err


def test_resets_says_when_there_is_more(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "resets", "orders-etl", "--limit", "2", "-f", "csv", "--dsn", dsn)
    assert code == 0 and len(out.splitlines()) == 3 and err.startswith("more: --limit 4"), (out, err)
    code, out, err = run_cli(capsys, "resets", "orders-etl", "--limit", "3", "-f", "csv", "--dsn", dsn)
    assert code == 0 and len(out.splitlines()) == 4 and err == "", err


def test_every_api_limit_takes_the_same_range(dsn: str) -> None:
    from offset_ledger.api import create_app

    engine = make_engine(dsn)
    app = create_app(operations=Operations(engine, kafka=StandInKafka()), api_token="")  # type: ignore[arg-type]
    client = TestClient(app, raise_server_exceptions=False, base_url="http://localhost")
    try:
        limits = {path: p["schema"] for path, ops in app.openapi()["paths"].items() for op in ops.values()
                  for p in op.get("parameters", []) if p["name"] == "limit"}
        assert len(limits) >= 3 and all(s["maximum"] == MAX_LIMIT and s["minimum"] == 1 for s in limits.values())
        for path in limits:
            url = path.replace("{pipeline}", "orders-etl")
            assert client.get(f"{url}?limit={MAX_LIMIT}").status_code == 200, url
            assert client.get(f"{url}?limit={MAX_LIMIT + 1}").status_code in (400, 422), url
    finally:
        engine.dispose()
