"""The CLI, the REST API and the console are three faces of one answer (issue 51): for every
command/route pair the CLI's JSON holds what the API's does, under the same names with the same values,
nested keys in the same camelCase; each column the CLI's CSV prints is a name of that answer with its
value, or one of the few documented labels the table derives (``DERIVED``); a table header is that
name upper-cased (``support.header``).

The console renders the API's JSON itself (``console/static``), so it shares the API's names; its one
data endpoint of its own (``/api/v1/console/pipelines``) is held to the pipelines route's names and
values below. ``test_every_route_and_command_is_paired_or_says_why`` fails when a route or a command
appears that is neither in ``PAIRS`` nor listed as one face's own with a reason.
"""

from __future__ import annotations

import contextlib
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
from offset_ledger.cli.main import app as cli_app
from offset_ledger.cli.support import header
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.generations import NewGeneration, create_generation
from offset_ledger.ledger.policy_store import set_policies
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
    (["policy", "history", P], f"/api/v1/pipelines/{P}/policies/history", "changes", "changes"),
    (["topic", "orders"], "/api/v1/topics/orders", None, None),
]
#: Commands that ask only Kafka (no --dsn).
NO_LEDGER = {"topic"}
#: The pairs tested elsewhere in this file or beside it: (command, (method, route)).
PAIRED_ELSEWHERE = {
    "offsets": ("GET", "/api/v1/pipelines/{pipeline}/offsets"),  # test_offsets_csv_rows_are_the_api_positions
    "reset": ("POST", "/api/v1/pipelines/{pipeline}/resets"),  # test_reset_one_shape.py
    "policy set": ("PUT", "/api/v1/pipelines/{pipeline}/policies"),  # test_policy_set_is_the_put_answer
}
#: Routes only the API (or the console) has, and why no command answers the same question.
API_ONLY = {
    ("GET", "/v1/getCurrentOffsets"): "legacy endpoint kept exactly; `offsets -f json` prints the same map",
    ("GET", "/v1/getTopicDetails"): "legacy endpoint kept exactly (firstOffset, lastOffset); `topic` is /api/v1/topics/{topic}",
    ("GET", "/v1/resetOffsetOfAllPartitionsToEarliest"): "legacy endpoint (executes at once); `reset --to-earliest`",
    ("POST", "/v1/resetOffsetOfAllPartitionsToEarliest"): "legacy endpoint (executes at once); `reset --to-earliest`",
    ("GET", "/v1/resetOffsetOfAllPartitionsToLatest"): "legacy endpoint (executes at once); `reset --to-latest`",
    ("POST", "/v1/resetOffsetOfAllPartitionsToLatest"): "legacy endpoint (executes at once); `reset --to-latest`",
    ("GET", "/v1/resetOffsetOfPartitions"): "legacy endpoint (executes at once); `reset --to-offsets`",
    ("POST", "/v1/resetOffsetOfPartitions"): "legacy endpoint (executes at once); `reset --to-offsets`",
    ("GET", "/healthz"): "a probe of the server itself",
    ("GET", "/livez"): "a probe of the server itself",
    ("GET", "/metrics"): "Prometheus text for a scraper, not an answer a person asks",
    ("GET", "/api/v1/console/pipelines"): "the console's list: held to /api/v1/pipelines by test_console_list_is_the_pipelines_answer",
    ("GET", "/api/v1/pipelines/{pipeline}/runs"): "the console's runs and generations table; no command lists runs",
}
#: Commands only the CLI has, and why no route answers the same question.
CLI_ONLY = {
    "alerts": "writes Prometheus alert rules to a file",
    "db access": "administers the ledger database's roles",
    "db grant": "administers the ledger database's roles",
    "db upgrade": "migrates the ledger's schema",
    "failover": "changes which cluster a pipeline reads: an operator's deliberate step, not served over HTTP",
    "import-checkpoint": "reads a Spark checkpoint from the operator's storage",
    "mirror": "commits to a Kafka consumer group",
    "plan": "previews a restart with the job's own options (the restart's inputs live in the job)",
    "resolve": "prints the startingOffsets JSON to paste into a job",
    "prune": "deletes history (maintenance)",
    "serve": "starts the server itself",
    "watch": "runs a checkpoint watcher",
}
#: Table/CSV columns that are labels the CLI derives for people, not facts of the answer under
#: another name (each documented in docs/cli.md).
DERIVED = {
    ("pipelines", "generation"): "the generation object as N(appVersion)",
    ("pipelines", "foreignRuns"): "FOREIGN:<run ids> when foreignRunIds is not empty",
    ("pipelines", "headroom"): "headroomSeconds and headroomStatus in one cell",
    ("lag", "headroom"): "headroomSeconds and headroomStatus in one cell (the table's; CSV has the three fields)",
    ("resets", "kind"): "DRY RUN or reset, from dryRun",
    ("resets", "partitions"): "the number of partitions (the JSON lists them)",
    ("resets", "changes"): "the first four partitions' moves",
}
CAMEL = re.compile(r"^[a-z][A-Za-z0-9]*$")
#: A finding's details as the ledger stores them (snake_case), with a list of records and a map keyed by data.
DETAILS = {"kind": "below_log_start", "log_start_offset": 410,
           "lost": [{"next_offset": 400, "records_lost": 10}], "topic_map": {"orders_v2": "backup.orders_v2"}}


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
        set_policies(conn, P, {"on_data_loss": "earliest"}, actor="t", reason="retention is short")
        set_policies(conn, P, {"window": "10m"}, actor="t", reason="windowed since v2")
        conn.execute(insert(findings), [{"pipeline": P, "consumer_group": P, "kind": "gap", "topic": "orders",
                                         "partition": 0, "message": "a gap", "created_at": datetime.now(timezone.utc),
                                         "expected_offset": 400, "actual_offset": 410,
                                         "details": DETAILS}])
    engine.dispose()

    def operations(ledger: Any, kafka: Any = None) -> Operations:
        return Operations(make_engine(url, create=False), kafka=StandInKafka())  # type: ignore[arg-type]

    for module in pkgutil.iter_modules(cli_package.__path__):
        mod = importlib.import_module(f"offset_ledger.cli.{module.name}")
        if hasattr(mod, "open_operations"):
            monkeypatch.setattr(mod, "open_operations", operations)
        if hasattr(mod, "kafka_adapter"):  # `topic`: the API's stand-in cluster, reached the CLI's way
            monkeypatch.setattr(mod, "kafka_adapter", lambda address: contextlib.nullcontext(StandInKafka()))
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
                              "endingOffsets", "/assign", "/topicMap")) or str(k).isdigit():
                continue  # keyed by topic, partition or policy name: data, not field names
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
    ledger = [] if argv[0] in NO_LEDGER else ["--dsn", dsn]
    code, out, err = run_cli(capsys, *argv, *ledger, "-f", "json")
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
                if argv[0] not in ("replay", "verify", "topic") and argv[:2] != ["policy", "show"]]


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


def test_topic_rows_are_the_api_partitions(dsn: str, api: TestClient, capsys: pytest.CaptureFixture[str]) -> None:
    """``topic``'s CSV rows are the route's partitions (a map keyed by partition), one row each with the
    same logStartOffset and logEndOffset; the legacy getTopicDetails has the same values under its own
    names (firstOffset, lastOffset: the log-end, kept exactly)."""
    doc = api.get("/api/v1/topics/orders").json()
    code, out, err = run_cli(capsys, "topic", "orders", "-f", "csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == ["partition", "logStartOffset", "logEndOffset"]
    assert [(int(r["partition"]), int(r["logStartOffset"]), int(r["logEndOffset"])) for r in rows] == [
        (int(p), v["logStartOffset"], v["logEndOffset"]) for p, v in doc["partitions"].items()]
    legacy = api.get("/v1/getTopicDetails", params={"topicName": "orders"}).json()
    assert legacy == {"name": "orders", "partitions": {
        p: {"firstOffset": v["logStartOffset"], "lastOffset": v["logEndOffset"]} for p, v in doc["partitions"].items()}}


def test_table_headers_are_the_names_upper_cased(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each table header is a CSV column's name in upper snake case (``support.header``): the table may
    show fewer columns than the CSV (it fits a terminal), never another name."""
    for argv, _items in CSV_COMMANDS:
        code, out, _ = run_cli(capsys, *argv, "--dsn", dsn, "-f", "csv")
        columns = next(csv.reader(io.StringIO(out)))
        assert all(header(c) == re.sub(r"(?<!^)([A-Z])", r"_\1", c).upper() for c in columns), columns
        code, out, err = run_cli(capsys, *argv, "--dsn", dsn, "-f", "table", "--no-truncate")
        assert code == 0, err
        shown = out.splitlines()[0].split()
        named = {header(c) for c in columns} | {header(c) for cmd, c in DERIVED if cmd == argv[0]}
        assert shown and set(shown) <= named, (argv[0], sorted(set(shown) - named))


def test_policy_set_is_the_put_answer(dsn: str, api: TestClient, capsys: pytest.CaptureFixture[str]) -> None:
    """``policy set`` prints the policies after the change with the same names and values as PUT's answer."""
    code, out, err = run_cli(capsys, "policy", "set", P, "--slide", "5m", "--reason", "r", "--dsn", dsn)
    assert code == 0, err
    shown = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:] if line.strip()}
    put = api.put(f"/api/v1/pipelines/{P}/policies", json={"policies": {"slide": "5m"}, "dryRun": True})
    assert put.status_code == 200, put.text
    effective = put.json()["effective"]
    assert set(shown) == set(effective), (shown, effective)
    for name, cells in shown.items():
        assert cells[0] == ("-" if effective[name] is None else str(effective[name])), (name, cells, effective[name])


def test_console_list_is_the_pipelines_answer(dsn: str, api: TestClient) -> None:
    """The console's list is the pipelines route's items, name for name and value for value, plus the
    few facts only the console shows (each listed here)."""
    console_only = {"staleRunIds", "appVersion", "groupCount"}
    engine = make_engine(dsn)
    with engine.begin() as conn:  # a checkpoint generation: the list's generation object is filled
        create_generation(conn, NewGeneration(
            pipeline=P, consumer_group=P, checkpoint_root="/tmp/ckpt", app_version="2.0", reason="first",
            starting_offsets={"orders": {"0": 480, "1": 600, "2": 700}},
            resolved_offsets={"orders": {"0": 480, "1": 600, "2": 700}}))
    engine.dispose()
    listed = api.get("/api/v1/pipelines?lag=false").json()["pipelines"]
    shown = api.get("/api/v1/console/pipelines").json()["pipelines"]
    assert len(shown) == len(listed) >= 1
    assert listed[0]["generation"]["generation"] == 1, listed[0]
    for item, row in zip(listed, shown):
        assert set(row) - set(item) == console_only
        for name, value in item.items():
            if name in ("lag", "status", "headroomSeconds", "headroomStatus", "headroomBasis"):
                continue  # the console asks Kafka (the list above was asked without lag)
            assert row[name] == value, (name, row[name], value)


def _commands(group: Any, prefix: str = "") -> set[str]:
    import typer.main

    click = typer.main.get_command(group) if prefix == "" else group
    out: set[str] = set()
    for name, sub in getattr(click, "commands", {}).items():
        if sub.hidden:
            continue
        if getattr(sub, "commands", None):
            out |= _commands(sub, f"{prefix}{name} ")
        else:
            out.add(f"{prefix}{name}")
    return out


def test_every_route_and_command_is_paired_or_says_why(api: TestClient) -> None:
    """A new route or command joins ``PAIRS`` (and the comparisons above) or says why it is one face's own."""
    paired_commands = {" ".join(argv[:2]) if argv[0] == "policy" else argv[0] for argv, *_ in PAIRS}
    paired_routes = {("GET", re.sub(r"/(orders-etl|orders|1)(?=/|$|\?)", lambda m: {
        P: "/{pipeline}", "orders": "/{topic}", "1": "/{batch}"}[m.group(1)], route.split("?")[0]))
        for _argv, route, *_ in PAIRS}
    paired_commands |= set(PAIRED_ELSEWHERE)
    paired_routes |= set(PAIRED_ELSEWHERE.values())
    routes = {(method.upper(), path) for path, ops in api.get("/openapi.json").json()["paths"].items()
              for method in ops}
    unpaired = routes - paired_routes - set(API_ONLY)
    assert not unpaired, f"routes neither paired with a command nor listed in API_ONLY: {sorted(unpaired)}"
    assert not (set(API_ONLY) - routes), f"API_ONLY lists routes that are gone: {sorted(set(API_ONLY) - routes)}"
    assert paired_routes <= routes, sorted(paired_routes - routes)
    commands = _commands(cli_app)
    unpaired_cli = commands - paired_commands - set(CLI_ONLY)
    assert not unpaired_cli, f"commands neither paired with a route nor listed in CLI_ONLY: {sorted(unpaired_cli)}"
    assert not (set(CLI_ONLY) - commands), f"CLI_ONLY lists commands that are gone: {sorted(set(CLI_ONLY) - commands)}"
    assert paired_commands <= commands, sorted(paired_commands - commands)


def test_a_findings_details_are_camel_case_under_camel_case_parents(dsn: str, api: TestClient) -> None:
    """Nested names follow their parents' casing; a map keyed by data (a topic) keeps its keys."""
    (found,) = api.get(f"/api/v1/pipelines/{P}/findings").json()["findings"]
    assert found["details"] == {"kind": "below_log_start", "logStartOffset": 410,
                                "lost": [{"nextOffset": 400, "recordsLost": 10}],
                                "topicMap": {"orders_v2": "backup.orders_v2"}}


# -- errors: one shape on every face ------------------------------------------------------------

#: A value for each parameter an error class's constructor takes, by name (a new class with a new
#: parameter fails ``test_an_errors_details_are_the_same_on_the_api_and_the_cli_json`` until it has one):
#: snake_case records in lists and a map keyed by data, so the nesting rule is exercised.
ERROR_ARGS: dict[str, Any] = {
    "message": "refused on purpose", "pipeline": P, "consumer_group": "orders_etl", "topic": "orders",
    "partition": 3, "known": ["orders", "payments"], "existing": [0, 1], "text": "ten minits", "name": "window",
    "reason": "not a checkpoint", "value": "-7", "path": "/ck/offsets/3", "group": "orders_etl", "members": 2,
    "detail": "2 members", "attempts": 3, "changed": ["positions of orders"], "groups": ["orders_etl", "orders-b"],
    "topics": ["orders"], "run_ids": ["0374a913"], "evidence": "last event 12 s ago",
    "out_of_range": [{"topic": "orders", "partition": 0, "requested": 5, "log_start_offset": 10,
                      "log_end_offset": 20, "kind": "below_log_start"}],
    "lost": [{"topic": "orders", "partition": 1, "next_offset": 4, "log_start_offset": 9, "log_end_offset": 30}],
    "unknown_starts": [{"query_id": "q-1", "batch_id": 7, "topic": "orders", "partition": 0, "until_offset": 40}],
}
#: What a class whose parameter of that name means another thing gets (a footprint per group, or one group's).
ERROR_ARGS_OF = {
    "AdoptionRefused": {"footprint": {"topics": ["orders"], "generations": 1, "batches": 4, "runs": 1}},
    "FirstRunRefused": {"footprint": {"orders_etl": {"topics": ["orders"], "batches": 4, "runs": 1,
                                                     "generations": 0}}},
}
#: The details a class given ``**details`` (raised with keyword arguments at its call sites) gets.
SNAKE_DETAILS: dict[str, Any] = {
    "checkpoint_location": "/ck/gen-2", "query_id": "q-1", "missing_partitions": [2],
    "earliest_partitions": [{"topic": "orders", "partition": 0, "log_start_offset": 10}],
    "topic_map": {"orders_v2": "backup.orders_v2"},
}
#: Maps keyed by data under an error's field (consumer groups), kept as they are.
ERROR_DATA_MAPS = {("FirstRunRefused", "/ledger")}


def _error_classes() -> list[type]:
    from offset_ledger.errors import OffsetLedgerError

    found, todo = [], [OffsetLedgerError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return sorted({c for c in found if c.__module__ == "offset_ledger.errors"}, key=lambda c: c.__name__)


def _error_of(cls: type) -> Any:
    import inspect

    args: dict[str, Any] = {}
    for name, param in inspect.signature(cls).parameters.items():
        if param.kind is param.VAR_KEYWORD:
            args.update(SNAKE_DETAILS)
            continue
        samples = {**ERROR_ARGS, **ERROR_ARGS_OF.get(cls.__name__, {})}
        if name in samples:
            args[name] = samples[name]
        else:
            assert param.default is not param.empty, f"{cls.__name__}({name}=...): add a sample to ERROR_ARGS"
    return cls(**args)


def _leaves(doc: Any) -> list[str]:
    """Every value of a document (not its names), as JSON text, sorted: what a renaming must keep."""
    if isinstance(doc, dict):
        return sorted(x for v in doc.values() for x in _leaves(v))
    if isinstance(doc, list):
        return sorted(x for v in doc for x in _leaves(v))
    return [json.dumps(doc)]


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda c: c.__name__)
def test_an_errors_details_are_the_same_on_the_api_and_the_cli_json(
        dsn: str, api: TestClient, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        cls: type) -> None:
    """Every class of the exception tree, raised under the lag route and the ``lag`` command: the API's
    error body and the CLI's ``-f json`` error are one document, with the error's details under
    camelCase names (in the records of its lists too), every value as the exception holds it."""
    from offset_ledger.errors import exit_code
    from offset_ledger.operate import reads

    exc = _error_of(cls)
    assert exc.details, f"{cls.__name__}: the sample gives it no details"

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise exc

    monkeypatch.setattr(reads, "lag", refuse)
    r = api.get(f"/api/v1/pipelines/{P}/lag")
    body = r.json()
    assert r.status_code >= 400 and (body["error"], body["message"]) == (cls.__name__, exc.message)
    code, out, err = run_cli(capsys, "lag", P, "--dsn", dsn, "-f", "json")
    assert code == exit_code(exc) != 0 and err.startswith("offset-ledger: error: "), err
    if exc.after_answer:  # verify's verdict: the report was the answer, the error is the exit code
        assert out == ""
        return
    assert json.loads(out) == body
    data = {path for name, path in ERROR_DATA_MAPS if name == cls.__name__}
    names = [k for k in _keys(body) if not any(k.startswith(d + "/") for d in data)]
    bad = [k for k in names if not CAMEL.match(k.rsplit("/", 1)[-1])]
    assert not bad, f"{cls.__name__}: keys not in camelCase: {bad}"
    # The same values: only names changed; a map keyed by data keeps its keys.
    assert _leaves({k: v for k, v in body.items() if k not in ("error", "message")}) == _leaves(exc.details)
    if "topic_map" in exc.details:
        assert body["topicMap"] == {"orders_v2": "backup.orders_v2"}
    if cls.__name__ == "FirstRunRefused":
        assert list(body["ledger"]) == ["orders_etl"]


def test_the_cli_writes_no_error_json_unless_asked(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Without ``-f json`` an error is one line on stderr and nothing on stdout; ``--format=json`` and
    ``-fjson`` ask as ``-f json`` does."""
    code, out, err = run_cli(capsys, "lag", "nosuch", "--dsn", dsn)
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    for spelling in (["--format=json"], ["-fjson"], ["--format", "json"]):
        code, out, err = run_cli(capsys, "lag", "nosuch", "--dsn", dsn, *spelling)
        assert code == 2 and json.loads(out)["error"] == "UnknownPipeline", (spelling, out)
    code, out, _ = run_cli(capsys, "lag", "nosuch", "--dsn", dsn, "-f", "json", "-f", "csv")
    assert out == ""


#: The ``...Offset`` names an answer may use besides ``nextOffset`` and ``<something>NextOffset``, each
#: with the convention it carries (STYLE.md: names say which offset convention they carry).
OFFSET_NAMES = {
    "logStartOffset": "the first offset still in the log",
    "logEndOffset": "the next offset Kafka writes (log-end)",
    "fromOffset": "a range's first offset, inclusive (Spark's OffsetRange name)",
    "untilOffset": "a range's end, exclusive (Spark's OffsetRange name)",
    "firstOffset": "verify: the first offset the recorded history read, inclusive",
    "endOffset": "verify: the end of what was read, exclusive (an end, like logEndOffset)",
    # Findings: next offsets (a position, a range's start or end) under names that do not say so. Left:
    # expectedNextOffset / actualNextOffset widen the findings table past a 120-column terminal.
    "expectedOffset": "findings: the next offset expected (a position or a batch's end)",
    "actualOffset": "findings: the next offset seen instead (a batch's start or end, where a restart resumed)",
}


def test_each_offset_name_says_its_convention(dsn: str, api: TestClient) -> None:
    """Every ``...Offset`` key of every paired answer (and a reset's) is a next offset named so, or a
    name listed in ``OFFSET_NAMES`` with its convention: no ``lastOffset`` that carries a log-end,
    no ``committedOffset`` that is a next offset under a bare name."""
    docs = [api.get(route).json() for _argv, route, *_ in PAIRS]
    docs.append(api.post(f"/api/v1/pipelines/{P}/resets", json={"mode": "earliest"}).json())
    names = {k.rsplit("/", 1)[-1] for doc in docs for k in _keys(doc)}
    offsets = {n for n in names if n.endswith("Offset")}
    assert {"nextOffset", "logEndOffset", "beforeNextOffset"} <= offsets, offsets  # the check sees answers
    unsaid = sorted(n for n in offsets if not (n == "nextOffset" or n.endswith("NextOffset")) and n not in OFFSET_NAMES)
    assert not unsaid, f"offset names that do not say their convention: {unsaid}"
