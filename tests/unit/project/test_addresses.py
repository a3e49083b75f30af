"""Connections have one home (issue 51): each face resolves its addresses once, and engines are made in
one place.

- **Resolved once.** Each face (the listener from its start to its first batch recorded, a sink,
  ``serve``'s app, ``replay_range``, ``failover``, ``import_checkpoint``) turns what its caller gave
  into a ``LedgerAddress`` / ``KafkaAddress`` at most once per call, and hands the value down:
  ``LedgerAddress.resolve``, ``KafkaAddress.resolve`` and ``Settings.resolved_dsn`` are wrapped with
  counters, and the engines made are counted too (one per address, not one per component that
  re-reads a DSN).
- **Made in one place.** ``make_engine(`` is called only by ``ledger.engine.engine_for`` (which
  ``Operations.open`` and the components that need only an engine call); the modules other helpers
  are still converting are an explicit allow-list, each entry naming its owner, that only shrinks.
  ``KafkaAdapter(`` is called only by ``KafkaAdapter.open(address)`` (which ``Operations``, the
  listener's mirror, a failover's target, the demo and the CLI's ``topic`` call). Handing either
  over uncalled (``functools.partial(make_engine, dsn)``, a factory) counts as a call.

Everything runs on the embedded SQLite ledger: no services.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from offset_ledger.addresses import KafkaAddress, LedgerAddress
from offset_ledger.config import Settings
from offset_ledger.ledger import engine as engine_module

PACKAGE = Path(__file__).resolve().parents[3] / "offset_ledger"
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints" / "spark-4.2.0"

#: Where ``make_engine(`` may be called: (module path under offset_ledger, enclosing function).
MAKES_ENGINES = {("ledger/engine.py", "engine_for")}
#: Where ``KafkaAdapter(`` may be called: the factory that takes a ``KafkaAddress``.
MAKES_KAFKA_CLIENTS = {("kafka/adapter.py", "open")}
#: Calls still outstanding, by module: {path: (calls, who converts them)}. It only shrinks: an entry
#: whose module no longer calls ``make_engine`` that often fails the test until it is lowered or
#: removed. Empty since every face opens through ``Operations.open``/``engine_for`` (issue 51).
OUTSTANDING: dict[str, tuple[int, str]] = {}


def _named(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def calls_of(source: str, callee: str) -> list[tuple[int, str | None]]:
    """(line, enclosing function) of every ``callee(...)`` / ``x.callee(...)`` call in ``source``, and of
    every call handed ``callee`` itself as an argument (``functools.partial(callee, ...)``: made later)."""
    found: list[tuple[int, str | None]] = []

    def walk(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Call):
                # isinstance(x, KafkaAdapter) names the class without making one
                handed = [] if _named(child.func) in ("isinstance", "issubclass", "cast") else [
                    *child.args, *(k.value for k in child.keywords)]
                if _named(child.func) == callee or any(_named(a) == callee for a in handed):
                    found.append((child.lineno, function))
            walk(child, inner)

    walk(ast.parse(source), None)
    return found


def make_engine_calls(source: str) -> list[tuple[int, str | None]]:
    """(line, enclosing function) of every ``make_engine(...)`` / ``x.make_engine(...)`` call in ``source``."""
    return calls_of(source, "make_engine")


def engine_makers() -> dict[str, list[tuple[int, str | None]]]:
    out: dict[str, list[tuple[int, str | None]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        calls = make_engine_calls(path.read_text(encoding="utf-8"))
        if calls:
            out[path.relative_to(PACKAGE).as_posix()] = calls
    return out


def test_engines_are_made_only_by_engine_for() -> None:
    strays = []
    for module, calls in engine_makers().items():
        rest = [(line, fn) for line, fn in calls if (module, fn) not in MAKES_ENGINES]
        allowed, owner = OUTSTANDING.get(module, (0, ""))
        if len(rest) > allowed:
            strays.append(f"{module}: make_engine( at lines {[line for line, _ in rest]} (allowed {allowed}"
                          f"{', ' + owner if owner else ''}): take a LedgerAddress and use Operations.open or "
                          "ledger.engine.engine_for")
    assert not strays, "\n".join(strays)


def test_kafka_clients_are_made_only_by_kafka_adapter_open() -> None:
    strays = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        calls = calls_of(path.read_text(encoding="utf-8"), "KafkaAdapter")
        rest = [line for line, fn in calls if (module, fn) not in MAKES_KAFKA_CLIENTS]
        if rest:
            strays.append(f"{module}: KafkaAdapter( at lines {rest}: take a KafkaAddress and use "
                          "KafkaAdapter.open(address) (or Operations.open's ops.kafka)")
    assert not strays, "\n".join(strays)
    # The one place is there: a rename of the factory must move the allowance with it.
    assert [fn for _, fn in calls_of((PACKAGE / "kafka" / "adapter.py").read_text(encoding="utf-8"),
                                     "KafkaAdapter")] == ["open"]


def test_the_allow_list_only_shrinks() -> None:
    makers = engine_makers()
    stale = [f"{module}: {len(makers.get(module, []))} make_engine calls left, the allow-list says {n}: lower it"
             for module, (n, _owner) in OUTSTANDING.items() if len(makers.get(module, [])) < n]
    assert not stale, "\n".join(stale)


def test_the_static_check_can_fail() -> None:
    source = ("from offset_ledger.ledger import engine\nfrom offset_ledger.ledger.engine import make_engine\n"
              "def f(dsn):\n    return make_engine(dsn)\n"
              "class C:\n    def g(self):\n        return engine.make_engine('sqlite://')\n")
    assert make_engine_calls(source) == [(4, "f"), (7, "g")]
    assert make_engine_calls("def engine_for(a):\n    return make_engine(a.dsn)\n") == [(2, "engine_for")]
    clients = ("import functools\nfrom offset_ledger.kafka import adapter\n"
               "def f(address):\n    return adapter.KafkaAdapter(address.require())\n"
               "def g(servers):\n    return functools.partial(KafkaAdapter, servers)\n"
               "def h(address, x):\n    return KafkaAdapter.open(address) if isinstance(x, KafkaAdapter) else None\n")
    assert calls_of(clients, "KafkaAdapter") == [(4, "f"), (6, "g")]


#: The bootstrap-servers fallback (``kafka.bootstrap.servers`` in the options, else
#: ``OFFSET_LEDGER_BOOTSTRAP_SERVERS``) lives in ``KafkaAddress.resolve``; copies still outstanding, by
#: module, shrinking like ``OUTSTANDING``.
FALLBACK_OUTSTANDING: dict[str, tuple[int, str]] = {}


def fallback_copies(source: str) -> list[int]:
    """Lines that look the servers up themselves: ``x.get("kafka.bootstrap.servers")``, ``settings().bootstrap_servers``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and node.args and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == "kafka.bootstrap.servers"):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Attribute) and node.attr == "bootstrap_servers" and isinstance(node.value, ast.Call)
              and isinstance(node.value.func, ast.Name) and node.value.func.id == "settings"):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_bootstrap_servers_fallback_is_written_once() -> None:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module == "addresses.py":
            continue
        lines = fallback_copies(path.read_text(encoding="utf-8"))
        allowed, owner = FALLBACK_OUTSTANDING.get(module, (0, ""))
        if len(lines) > allowed:
            problems.append(f"{module}: the bootstrap-servers fallback at lines {lines}: use KafkaAddress.resolve")
        elif len(lines) < allowed:
            problems.append(f"{module}: {len(lines)} copies left, FALLBACK_OUTSTANDING says {allowed} ({owner}): lower it")
    assert not problems, "\n".join(problems)
    assert fallback_copies("s = o.get('kafka.bootstrap.servers') or settings().bootstrap_servers\n") == [1, 1]


# ---------------------------------------------------------------------------------- resolved once


class Resolutions:
    """Counts the address resolutions and the engines made while a face runs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.counts: Counter[str] = Counter()
        self.engines: list[str] = []
        ledger_resolve = LedgerAddress.resolve.__func__  # type: ignore[attr-defined]
        kafka_resolve = KafkaAddress.resolve.__func__  # type: ignore[attr-defined]
        resolved_dsn = Settings.resolved_dsn
        make_engine = engine_module.make_engine

        def counting_ledger(cls: type, *a: Any, **kw: Any) -> Any:
            self.counts["LedgerAddress.resolve"] += 1
            return ledger_resolve(cls, *a, **kw)

        def counting_kafka(cls: type, *a: Any, **kw: Any) -> Any:
            self.counts["KafkaAddress.resolve"] += 1
            return kafka_resolve(cls, *a, **kw)

        def counting_dsn(settings: Settings, *a: Any, **kw: Any) -> str:
            self.counts["resolved_dsn"] += 1
            return resolved_dsn(settings, *a, **kw)

        def counting_engine(dsn: str | None = None, **kw: Any) -> Any:
            self.engines.append(str(dsn))
            return make_engine(dsn, **kw)

        monkeypatch.setattr(LedgerAddress, "resolve", classmethod(counting_ledger))
        monkeypatch.setattr(KafkaAddress, "resolve", classmethod(counting_kafka))
        monkeypatch.setattr(Settings, "resolved_dsn", counting_dsn)
        monkeypatch.setattr(engine_module, "make_engine", counting_engine)

    def reset(self) -> None:
        self.counts.clear()
        self.engines.clear()

    def at_most_once(self) -> None:
        assert all(n <= 1 for n in self.counts.values()), dict(self.counts)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Resolutions:
    return Resolutions(monkeypatch)


@pytest.fixture(params=["argument", "environment"])
def ledger_dsn(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[
        tuple[str | None, str]]:
    """(the ``dsn=`` a face is given, the DSN it must use): given as an argument, or only in OFFSET_LEDGER_DSN."""
    dsn = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.delenv("OFFSET_LEDGER_BOOTSTRAP_SERVERS", raising=False)
    if request.param == "argument":
        monkeypatch.delenv("OFFSET_LEDGER_DSN", raising=False)
        yield dsn, dsn
    else:
        monkeypatch.setenv("OFFSET_LEDGER_DSN", dsn)
        yield None, dsn


def _ready(dsn: str) -> Any:
    from offset_ledger.ledger.engine import ensure_schema, make_engine

    engine = make_engine(dsn)
    ensure_schema(engine)
    return engine


QID, RID = "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"


def test_the_listener_resolves_once_from_its_start_to_its_first_batch(
        counted: Resolutions, ledger_dsn: tuple[str | None, str], tmp_path: Path) -> None:
    try:
        import pyspark  # noqa: F401 - the listener subclasses PySpark's StreamingQueryListener
    except ImportError:
        message = "PySpark missing: pip install -e '.[test,spark]' -c constraints.txt"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    from offset_ledger.capture.listener import OffsetLedgerListener
    from tests.unit.capture.test_writer import progress

    given, dsn = ledger_dsn
    listener = OffsetLedgerListener(dsn=given, pipeline="orders", spool_dir=tmp_path / "spool", heartbeat_every=0.05)
    try:
        listener.accept_json("started", json.dumps({"id": QID, "runId": RID, "name": "orders",
                                                    "timestamp": "2026-11-22T20:42:10.000Z"}))
        listener.accept_json("progress", progress(0, query=QID))
        assert listener.flush(20)
        assert listener.health().written == 2
    finally:
        assert listener.close(20)
    counted.at_most_once()
    assert counted.counts["LedgerAddress.resolve"] == 1
    # The recorder's and the heartbeat's engines, each on the one address (resolved: never None).
    assert counted.engines and set(counted.engines) == {dsn}
    assert listener.health().ledger == f"sqlite://{tmp_path / 'ledger.db'}"


def test_a_sink_resolves_once_and_makes_one_engine_for_all_its_batches(
        counted: Resolutions, ledger_dsn: tuple[str | None, str], tmp_path: Path) -> None:
    from offset_ledger.errors import OffsetLedgerError
    from offset_ledger.sinks import DeltaSink
    from offset_ledger.sinks import postgres as sink_engines

    given, dsn = ledger_dsn
    (tmp_path / "checkpoint").mkdir()
    sink = DeltaSink(path=str(tmp_path / "table"), pipeline="orders", dsn=given).bind(str(tmp_path / "checkpoint"))
    try:
        for batch_id in (0, 1):  # the checkpoint has no batch: refused after the ledger's engine is made
            with pytest.raises(OffsetLedgerError):
                sink.write(None, batch_id)
    finally:
        engine = sink_engines.sink_engine(dsn)
        with sink_engines._ENGINES_LOCK:
            sink_engines._ENGINES.pop(dsn, None)
        engine.dispose()
    counted.at_most_once()
    assert counted.engines == [dsn]


def test_serves_app_resolves_once(counted: Resolutions, ledger_dsn: tuple[str | None, str]) -> None:
    from fastapi.testclient import TestClient

    from offset_ledger.api.app import create_app

    from tests.ops_seed import seed_pipeline

    given, dsn = ledger_dsn
    engine = _ready(dsn)
    seed_pipeline(engine, "orders", {"orders": {0: 30}})
    engine.dispose()
    counted.reset()
    app = create_app(dsn=given, bootstrap_servers="localhost:9", tokens=[])
    with TestClient(app, base_url="http://localhost") as client:
        for _ in range(2):  # requests share the app's context: nothing resolves per request
            assert client.get("/api/v1/pipelines/orders/history").status_code == 200
    counted.at_most_once()
    assert counted.counts["LedgerAddress.resolve"] == 1 and counted.counts["KafkaAddress.resolve"] == 1
    assert counted.engines == [dsn]
    assert app.state.operations.has_kafka


def test_replay_range_resolves_once(counted: Resolutions, ledger_dsn: tuple[str | None, str]) -> None:
    from offset_ledger.operate.replay import replay_range
    from tests.ops_seed import seed_pipeline

    given, dsn = ledger_dsn
    engine = _ready(dsn)
    seed_pipeline(engine, "orders", {"orders": {0: 30}})
    engine.dispose()
    counted.reset()
    result = replay_range("orders", batch=1, dsn=given)
    assert result.records > 0 and result.warnings[-1].endswith("no Kafka bootstrap servers given")
    counted.at_most_once()
    assert counted.counts["LedgerAddress.resolve"] == 1 and counted.counts["KafkaAddress.resolve"] == 1
    assert counted.engines == [dsn]


def test_failover_resolves_its_ledger_once(counted: Resolutions, ledger_dsn: tuple[str | None, str]) -> None:
    from offset_ledger.errors import UnknownPipeline
    from offset_ledger.operate.failover import failover

    given, dsn = ledger_dsn
    _ready(dsn).dispose()
    counted.reset()
    with pytest.raises(UnknownPipeline):  # before any cluster is asked
        failover("orders", to_bootstrap="localhost:9", dsn=given, dry_run=True)
    counted.at_most_once()
    # The target cluster is the request's: never resolved from OFFSET_LEDGER_BOOTSTRAP_SERVERS.
    assert counted.counts["LedgerAddress.resolve"] == 1 and counted.counts["KafkaAddress.resolve"] == 0
    assert counted.engines == [dsn]


@pytest.mark.parametrize("execute", [False, True])
def test_import_checkpoint_resolves_once(counted: Resolutions, ledger_dsn: tuple[str | None, str], tmp_path: Path,
                                         execute: bool) -> None:
    from offset_ledger.operate.adopt import import_checkpoint

    given, dsn = ledger_dsn
    checkpoint = tmp_path / "jobs" / "orders"
    shutil.copytree(FIXTURES / "kafka-one", checkpoint)
    result = import_checkpoint(str(checkpoint), pipeline="orders", dsn=given, execute=execute)
    assert result.positions
    counted.at_most_once()
    assert counted.counts["LedgerAddress.resolve"] == 1 and counted.counts["KafkaAddress.resolve"] == 1
    # One engine asked for (a dry run's is refused when the ledger does not exist: none is created).
    assert counted.engines == [dsn]
    assert (tmp_path / "ledger.db").exists() == execute
