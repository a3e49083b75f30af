"""The CLI and the REST API are two faces of one answer (issue 51): for every command/route pair the
CLI's JSON holds what the API's does, under the same names with the same values, nested keys in the
same camelCase; and each column the CLI's CSV prints is a name of that answer with its value, or one
of the few documented labels the table derives (``DERIVED``).

The console renders the API's JSON itself (``console/static``), so it shares the API's names.
"""

from __future__ import annotations

import csv
import importlib
import io
import json
import pkgutil
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert

import offset_ledger.cli as cli_package
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.tables import findings
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.reset_operations import reset
from offset_ledger.rules.model import TopicPartition
from offset_ledger.rules.resets import ResetRequest
from tests.ops_seed import seed_pipeline
from tests.unit.api.test_api_validation import StandInKafka
from tests.unit.cli.cli_run import run_cli

P = "orders-etl"
#: (CLI arguments, API route, the key of the API's list of items, the key of the CLI JSON's list or None
#: when the CLI's JSON is the list itself)
PAIRS = [
    (["pipelines", "--no-lag"], "/api/v1/pipelines?lag=false", "pipelines", None),
    (["history", P], f"/api/v1/pipelines/{P}/history", "batches", "batches"),
    (["findings", P], f"/api/v1/pipelines/{P}/findings", "findings", "findings"),
    (["resets", P], f"/api/v1/pipelines/{P}/resets", "resets", "resets"),
    (["lag", P], f"/api/v1/pipelines/{P}/lag", "partitions", None),
    (["verify", P], f"/api/v1/pipelines/{P}/verify", "partitions", "partitions"),
    (["policy", "show", P], f"/api/v1/pipelines/{P}/policies", None, None),
    (["replay", P, "--batch", "1"], f"/api/v1/pipelines/{P}/batches/1/range", None, None),
]
#: Table/CSV columns that are labels the CLI derives for people, not facts of the answer under
#: another name (each documented in docs/cli.md).
DERIVED = {
    ("pipelines", "generation"): "the generation object as N(appVersion)",
    ("pipelines", "foreignRuns"): "FOREIGN:<run ids> when foreignRunIds is not empty",
    ("pipelines", "headroom"): "headroomSeconds and headroomStatus in one cell",
    ("resets", "kind"): "DRY RUN or reset, from dryRun",
    ("resets", "partitions"): "the number of partitions (the JSON lists them)",
    ("resets", "changes"): "the first four partitions' moves",
}
CAMEL = re.compile(r"^[a-z][A-Za-z0-9]*$")


@pytest.fixture
def dsn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = make_engine(url)
    upgrade(engine)
    seed_pipeline(engine, P, {"orders": {0: 500, 1: 600, 2: 700}})
    ops = Operations(engine, kafka=StandInKafka())  # type: ignore[arg-type]
    reset(ops, P, ResetRequest("offsets", offsets={TopicPartition("orders", 0): 99_999}), actor="t", reason="look",
          dry_run=True)
    reset(ops, P, ResetRequest("shift", shift_by=-20, out_of_range="clamp"), actor="t", reason="replay",
          dry_run=False)
    with engine.begin() as conn:
        conn.execute(insert(findings), [{"pipeline": P, "consumer_group": P, "kind": "gap", "topic": "orders",
                                         "partition": 0, "message": "a gap", "created_at": datetime.now(timezone.utc),
                                         "expected_offset": 400, "actual_offset": 410}])
    engine.dispose()

    def operations(ledger: Any, kafka: Any = None) -> Operations:
        return Operations(make_engine(url, create=False), kafka=StandInKafka())  # type: ignore[arg-type]

    for module in pkgutil.iter_modules(cli_package.__path__):
        mod = importlib.import_module(f"offset_ledger.cli.{module.name}")
        if hasattr(mod, "open_operations"):
            monkeypatch.setattr(mod, "open_operations", operations)
    return url


@pytest.fixture
def api(dsn: str):  # type: ignore[no-untyped-def]
    from offset_ledger.api import create_app

    engine = make_engine(dsn)
    ops = Operations(engine, kafka=StandInKafka())  # type: ignore[arg-type]
    yield TestClient(create_app(operations=ops, api_token=""), base_url="http://localhost")
    engine.dispose()


def _keys(doc: Any, path: str = "") -> list[str]:
    """Every key of a JSON document with its path; the keys of maps keyed by data (topics, partitions) skipped."""
    out: list[str] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            if path.endswith(("/scope", "/offsets", "/newPositions", "/effective", "/sources", "startingOffsets",
                              "endingOffsets", "/assign")):
                continue  # keyed by topic or policy name: data, not field names
            out.append(f"{path}/{k}")
            out += _keys(v, f"{path}/{k}")
    elif isinstance(doc, list):
        for v in doc:
            out += _keys(v, f"{path}[]")
    return out


def _without_timing(doc: Any) -> Any:
    """The answer without what differs between two calls by nature (how long the check took)."""
    if isinstance(doc, dict):
        return {k: _without_timing(v) for k, v in doc.items() if k != "seconds"}
    if isinstance(doc, list):
        return [_without_timing(v) for v in doc]
    return doc


@pytest.mark.parametrize("argv, route, api_items, cli_items", PAIRS, ids=[" ".join(p[0][:2]) for p in PAIRS])
def test_the_cli_json_is_the_api_answer(dsn: str, api: TestClient, capsys: pytest.CaptureFixture[str],
                                        argv: list[str], route: str, api_items: str | None,
                                        cli_items: str | None) -> None:
    code, out, err = run_cli(capsys, *argv, "--dsn", dsn, "-f", "json")
    assert code == 0, err
    from_cli = _without_timing(json.loads(out))
    r = api.get(route)
    assert r.status_code == 200, r.text
    from_api = _without_timing(r.json())
    if cli_items is None and api_items is not None:  # the CLI prints the list itself (kept for scripts)
        assert from_cli == from_api[api_items]
    else:
        assert from_cli == from_api
    bad = [k for k in _keys(from_api) if not CAMEL.match(k.rsplit("/", 1)[-1])]
    assert not bad, f"keys not in camelCase: {bad}"


# replay prints options or JSON; policy show its own rows (policy, value, source); verify one row per
# stretch, none on an exact ledger (test_verify's own CSV tests).
CSV_COMMANDS = [(argv, api_items) for argv, _route, api_items, _c in PAIRS
                if argv[0] not in ("replay", "policy", "verify")]


@pytest.mark.parametrize("argv, items", CSV_COMMANDS, ids=[" ".join(a[:2]) for a, _ in CSV_COMMANDS])
def test_each_csv_column_is_a_fact_of_the_answer_with_its_value(
        dsn: str, capsys: pytest.CaptureFixture[str], argv: list[str], items: str) -> None:
    code, out, _ = run_cli(capsys, *argv, "--dsn", dsn, "-f", "json")
    doc = json.loads(out)
    listed = doc if isinstance(doc, list) else doc[items]
    code, out, err = run_cli(capsys, *argv, "--dsn", dsn, "-f", "csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows, "the seeded ledger gives every command rows"
    names = {k.rsplit("/", 1)[-1] for k in _keys(listed)}
    for column in rows[0]:
        assert column in names or (argv[0], column) in DERIVED, f"{argv[0]}: CSV column {column!r} is no name of the answer"
    if len(rows) != len(listed):
        return  # one row per item and partition (history): the names checked, the values per item below
    for row, item in zip(rows, listed):
        for column, shown in row.items():
            if (argv[0], column) in DERIVED or column not in item or isinstance(item[column], (dict, list)):
                continue
            value = item[column]
            assert shown == ("" if value is None else str(value)), (argv[0], column, shown, value)


def test_offsets_csv_rows_are_the_api_positions(dsn: str, api: TestClient, capsys: pytest.CaptureFixture[str]) -> None:
    """``offsets -f json`` keeps the legacy ``{"topic": {"0": n}}`` (scripts feed it back); its CSV rows
    are the API's ``positions`` items, what placed each position and when included."""
    code, out, err = run_cli(capsys, "offsets", P, "--dsn", dsn, "-f", "csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    items = api.get(f"/api/v1/pipelines/{P}/offsets").json()["positions"]
    assert len(rows) == len(items) == 3
    for row, item in zip(rows, items):
        for column, shown in row.items():
            assert column in item, f"offsets: CSV column {column!r} is no name of the answer"
            assert shown == ("" if item[column] is None else str(item[column])), (column, shown, item[column])
    code, out, _ = run_cli(capsys, "offsets", P, "--dsn", dsn, "-f", "json")
    assert json.loads(out) == {"orders": {str(i["partition"]): i["nextOffset"] for i in items}}
