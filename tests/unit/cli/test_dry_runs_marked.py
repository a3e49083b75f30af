"""Dry runs stay in the audit trail (who looked at which move, and when) but are marked as such
wherever the trail is shown, and can be left out (issue 50, item 4)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from offset_ledger.ledger.engine import make_engine, upgrade
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
    reset(ops, "orders-etl", ResetRequest("earliest"), actor="t", reason=None, dry_run=True)
    reset(ops, "orders-etl", ResetRequest("latest"), actor="t", reason="really", dry_run=False)
    reset(ops, "orders-etl", ResetRequest("earliest"), actor="t", reason=None, dry_run=True)
    engine.dispose()
    return url


def test_the_cli_table_marks_dry_runs_first_thing(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "resets", "orders-etl", "--wide", "--dsn", dsn)
    head, *rows = out.splitlines()
    assert code == 0 and head.split()[:2] == ["RESET_ID", "KIND"]
    assert [r.split()[1] for r in rows] == ["DRY", "reset", "DRY"] and all(r.split()[2] == "RUN" for r in rows[::2])
    assert err == "2 of 3 shown are dry runs: audited, nothing applied (--no-dry-runs hides them)\n"
    code, out, err = run_cli(capsys, "resets", "orders-etl", "--no-dry-runs", "-f", "csv", "--dsn", dsn)
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and [(r["mode"], r["dryRun"]) for r in rows] == [("latest", "False")] and err == ""


def test_the_api_marks_them_and_can_leave_them_out(dsn: str) -> None:
    from offset_ledger.api import create_app

    engine = make_engine(dsn)
    ops = Operations(engine, kafka=StandInKafka())  # type: ignore[arg-type]
    client = TestClient(create_app(operations=ops, api_token=""), raise_server_exceptions=False,
                        base_url="http://localhost")
    try:
        every = client.get("/api/v1/pipelines/orders-etl/resets").json()["resets"]
        assert [(r["dryRun"], r["status"]) for r in every] == [(True, "dry_run"), (False, "pending"), (True, "dry_run")]
        executed = client.get("/api/v1/pipelines/orders-etl/resets?dryRuns=false").json()["resets"]
        assert [r["mode"] for r in executed] == ["latest"]
    finally:
        engine.dispose()


def test_the_console_audit_trail_marks_them() -> None:
    """The console's audit rows carry data-dry-run and a "dry run" badge; the stylesheet mutes them
    (the browser test in tests/integration/test_console.py drives the page itself)."""
    root = Path(__file__).resolve().parents[3] / "offset_ledger" / "console" / "static"
    script, css = (root / "pipeline.js").read_text(), (root / "console.css").read_text()
    assert '"data-dry-run": r.dryRun' in script and '"badge dry-run"' in script
    assert "tr[data-dry-run]" in css and ".badge.dry-run" in css
