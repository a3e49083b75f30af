"""Every command, walked with a misspelled pipeline, group, topic, file, DSN and duration (issue 34).

Each mistake must be exit 2 (or the code docs/cli.md documents for it), exactly one line on stderr
naming what was wrong, no traceback, and the ledger unchanged (every table dumped before and after).
The command list comes from the Typer app itself: a new command without an entry in ``BASE`` fails
``test_every_command_is_walked``, and the mistakes that apply to it follow from its parameters.

Kafka is never reached: every Kafka option points at a closed port, so a command that asked the
cluster before checking the name would answer exit 5, not 2. The ledger is SQLite, seeded through
the listener's rows (tests/ops_seed.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from offset_ledger.cli.main import main
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.tables import metadata
from tests.ops_seed import seed_pipeline
from tests.unit.cli.cli_run import click_commands

KAFKA = ["--bootstrap-server", "127.0.0.1:1", "--timeout", "1000"]
CHECKPOINT_FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints" / "spark-4.2.0" / "kafka-one"

# A valid call of each command on the seeded ledger ("CKPT": a checkpoint directory). The walk
# varies one thing at a time from here.
BASE: dict[str, list[str]] = {
    "pipelines": ["pipelines", "--no-lag"],
    "offsets": ["offsets", "orders"],
    "history": ["history", "orders"],
    "topic": ["topic", "orders", *KAFKA],
    "lag": ["lag", "orders", *KAFKA],
    "serve": ["serve"],
    "prune": ["prune", "--older-than", "30d", "--pipeline", "orders"],
    "findings": ["findings", "orders"],
    "resets": ["resets", "orders"],
    "mirror": ["mirror", "orders", "--once", *KAFKA],
    "import-checkpoint": ["import-checkpoint", "adopted", "CKPT", *KAFKA],  # adopts a new pipeline
    "replay": ["replay", "orders", "--batch", "1", *KAFKA],
    "failover": ["failover", "orders", "--to-bootstrap", "127.0.0.1:1", "--source-alias", "primary",
                 "-o", "request.timeout.ms=1000"],
    "reset": ["reset", "orders", "--to-earliest", *KAFKA],
    "resolve": ["resolve", "orders", "--topic", "orders", *KAFKA],
    "plan": ["plan", "orders", "--checkpoint-root", "/tmp/offset-ledger-walk-ck", "--topic", "orders", *KAFKA],
    "verify": ["verify", "orders"],
    "watch": ["watch", "orders", "CKPT", "--once"],
    "db upgrade": ["db", "upgrade"],
    "db grant": ["db", "grant", "--role", "team_a", "--pipelines", "orders"],
    "db access": ["db", "access"],
    "policy show": ["policy", "show", "orders"],
    "policy set": ["policy", "set", "orders", "--on-data-loss", "earliest", "--reason", "r"],
    "policy history": ["policy", "history", "orders"],
    "alerts": ["alerts", "--format", "prometheus"],
}

# Options that choose a command's mode: varying one replaces the base's mode option.
MODES = {"reset": "--to-earliest"}

# Names a command may take that the ledger does not know yet, on purpose (docs/cli.md):
# the recorders (watch, import-checkpoint) start a pipeline; resolve and plan read
# the topics it is given from Kafka; db upgrade creates the ledger its --dsn names.
NEW_ON_PURPOSE = {
    ("watch", "pipeline"), ("watch", "group"), ("watch", "dsn_missing"),
    ("import-checkpoint", "group"), ("import-checkpoint", "dsn_missing"),
    ("resolve", "topic"), ("plan", "topic"),
    ("db upgrade", "dsn_missing"), ("db upgrade", "dsn_no_schema"),
    # the recorders create the schema of the ledger they record into, as the listener does
    ("watch", "dsn_no_schema"), ("import-checkpoint", "dsn_no_schema"),
}

# (import-checkpoint's dry run on a ledger that does not exist yet answers, and creates nothing:
# test_a_dry_run_import_creates_no_ledger.)

# A mistake whose documented answer is not 2: resolve of a known pipeline under a group it never
# ran under is a refused first run (3, FirstRunRefused).
EXPECTED_CODE = {("resolve", "group"): 3, ("plan", "group"): 3}

DURATION_OPTIONS = {"--older-than", "--by-duration", "--window", "--slide", "--watermark-delay"}
FILE_OPTIONS = {"--from-file", "--to-offsets", "--command-config"}


def _opts(command: Any) -> set[str]:
    return {o for p in command.params for o in getattr(p, "opts", [])}


def _args(command: Any) -> set[str]:
    return {p.name for p in command.params if p.param_type_name == "argument"}


def _with(argv: list[str], option: str, value: str, mode: str | None = None) -> list[str]:
    """``argv`` with ``option value`` (replacing the option, and the mode option when it is one)."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == option and i + 1 < len(argv):
            skip = True
            continue
        if mode is not None and a == mode:
            continue
        out.append(a)
    return [*out, option, value]


def _cases() -> Iterator[Any]:
    """(command, mistake, argv, what stderr must name) for every mistake that applies."""
    for name, command in click_commands():
        if name not in BASE:
            continue  # test_every_command_is_walked fails for it
        base, opts, args = BASE[name], _opts(command), _args(command)
        found: list[tuple[str, list[str], str]] = []
        if "pipeline" in args and "orders" in base:
            at = base.index("orders")
            found.append(("pipeline", [*base[:at], "ordrs", *base[at + 1:]], "'ordrs'"))
        if "--consumer-group" in opts:
            found.append(("group", _with(base, "--consumer-group", "nope"), "'nope'"))
        if "--topic" in opts:
            found.append(("topic", _with(base, "--topic", "nosuch"), "'nosuch'"))
        if "--dsn" in opts:
            found.append(("dsn_missing", _with(base, "--dsn", "sqlite:///MISSING"), "MISSING"))
            found.append(("dsn_not_a_database", _with(base, "--dsn", "sqlite:///CSV"), "not a database"))
            found.append(("dsn_no_schema", _with(base, "--dsn", "sqlite:///EMPTY"), "no offset-ledger schema"))
        if "checkpoint" in args:
            at = base.index("CKPT")
            found.append(("checkpoint", [*base[:at], "/nonexistent/ckpt", *base[at + 1:]], "/nonexistent/ckpt"))
        for option in sorted(opts & FILE_OPTIONS):
            found.append((f"file{option}", _with(base, option, "NOFILE", MODES.get(name)), "NOFILE"))
            found.append((f"binary{option}", _with(base, option, "BINARY", MODES.get(name)), "not UTF-8"))
        for option in sorted(opts & DURATION_OPTIONS):
            found.append((f"duration{option}", _with(base, option, "10 parsecs", MODES.get(name)), "10 parsecs"))
        for mistake, argv, named in found:
            kind = mistake.split("-")[0].rstrip("-")
            if (name, kind) in NEW_ON_PURPOSE or (name, mistake) in NEW_ON_PURPOSE:
                continue
            yield pytest.param(name, mistake, argv, named, id=f"{name}:{mistake}")


def _dump(engine: Any) -> dict[str, list[tuple[Any, ...]]]:
    with engine.connect() as conn:
        return {t.name: sorted((tuple(r) for r in conn.execute(select(t))), key=repr)
                for t in metadata.sorted_tables}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("walk")
    engine = make_engine(f"sqlite:///{root / 'ledger.db'}")
    upgrade(engine)
    seed_pipeline(engine, "orders", {"orders": {0: 100, 1: 50}, "payments": {0: 10}})
    seed_pipeline(engine, "multi", {"orders": {0: 100}}, consumer_group="g1")
    engine.dispose()
    return root


@pytest.fixture
def world(seeded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    for var in ("OFFSET_LEDGER_DSN", "OFFSET_LEDGER_BOOTSTRAP_SERVERS", "OFFSET_LEDGER_KAFKA_COMMAND_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    shutil.copy(seeded / "ledger.db", tmp_path / "ledger.db")
    monkeypatch.setenv("OFFSET_LEDGER_DSN", f"sqlite:///{tmp_path / 'ledger.db'}")
    (tmp_path / "offsets.csv").write_text("topic,partition,offset\norders,0,1\n")
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00orders,0,\x9c1\n")
    checkpoint = tmp_path / "ckpt"
    empty = tmp_path / "empty.db"  # a database (SQLite takes an empty file as one) without the schema
    empty.write_bytes(b"")
    shutil.copytree(CHECKPOINT_FIXTURE, checkpoint)

    import uvicorn

    def no_server(*_a: Any, **_k: Any) -> None:
        raise AssertionError("serve started although its input was wrong")

    monkeypatch.setattr(uvicorn, "run", no_server)
    return {"root": tmp_path, "engine": make_engine(f"sqlite:///{tmp_path / 'ledger.db'}"),
            "subst": {"EMPTY": str(empty), "CKPT": str(checkpoint), "MISSING": str(tmp_path / "missing" / "ledgr.db"),
                      "CSV": str(tmp_path / "offsets.csv"), "NOFILE": str(tmp_path / "no-such-file.csv"),
                      "BINARY": str(tmp_path / "binary")}}


def _tables(path: str) -> int:
    import sqlite3

    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0])


def _fill(text: str, subst: dict[str, str]) -> str:
    for key, value in subst.items():
        text = text.replace(key, value)
    return text


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def test_every_command_is_walked() -> None:
    names = {name for name, _ in click_commands()}
    assert names - set(BASE) == set(), "add the new command to BASE: the walk must cover it"
    assert set(BASE) - names == set()


def test_the_walk_covers_every_kind_of_mistake() -> None:
    kinds = {case.values[1].split("-")[0] for case in _cases()}
    assert {"pipeline", "group", "topic", "dsn_missing", "dsn_not_a_database", "dsn_no_schema", "checkpoint", "file",
            "binary", "duration"} <= kinds


@pytest.mark.parametrize("name, mistake, argv, named", list(_cases()))
def test_a_mistake_is_one_line_exit_2_and_changes_nothing(name: str, mistake: str, argv: list[str], named: str,
                                                          world: dict[str, Any],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    subst = world["subst"]
    argv, named = [_fill(a, subst) for a in argv], _fill(named, subst)
    before = _dump(world["engine"])
    code, err = _run(argv, capsys)
    assert code == EXPECTED_CODE.get((name, mistake), 2), (argv, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("offset-ledger: error: "), err
    assert "Traceback" not in err and "internal error" not in err, err
    assert named in err, (named, err)
    assert _dump(world["engine"]) == before  # nothing written
    assert not Path(subst["MISSING"]).exists() and not Path(subst["MISSING"]).parent.exists()
    assert _tables(subst["EMPTY"]) == 0  # no schema was created by a read


@pytest.mark.parametrize("name", sorted(BASE))
def test_the_base_calls_name_real_things(name: str, world: dict[str, Any],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The walk's starting points are right: without a mistake no command complains about a name
    (it may still fail on the closed Kafka port, exit 5, or on purpose: serve's stand-in server)."""
    argv = [_fill(a, world["subst"]) for a in BASE[name]]
    code, err = _run(argv, capsys)
    if name == "serve":  # it got as far as starting the server (a stand-in that refuses)
        assert code == 1 and "serve started" in err, err
        return
    if name == "db grant":  # roles are PostgreSQL's: the walk's SQLite ledger is refused on purpose
        assert code == 2 and "SQLite is a single-user file" in err, err
        return
    assert code in (0, 5), (argv, err)
    for fragment in ("unknown pipeline", "is not used by", "is not read by", "no such", "not UTF-8"):
        assert fragment not in err, err


def test_a_dry_run_import_creates_no_ledger(world: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    missing = world["subst"]["MISSING"]
    code, err = _run(["import-checkpoint", "adopted", world["subst"]["CKPT"], "--dsn", f"sqlite:///{missing}"], capsys)
    assert code == 0 and "dry run: nothing written" in err, err
    assert not Path(missing).exists() and not Path(missing).parent.exists()


class _TwoPartitions:
    """The cluster as a reset sees it: topic ``orders`` of partitions 0 and 1, ``payments`` of 0."""

    def snapshot(self, topics: list[str]) -> Any:
        from offset_ledger.kafka.snapshot import ClusterSnapshot
        from offset_ledger.rules.model import TopicPartition, Watermarks

        layout = {"orders": [0, 1], "payments": [0]}
        parts = {t: layout[t] for t in topics if t in layout}
        return ClusterSnapshot(parts, {}, {TopicPartition(t, p): Watermarks(0, 100) for t in parts for p in parts[t]})

    def offsets_for_time(self, tps: Any, timestamp_ms: int) -> dict[Any, None]:
        return {tp: None for tp in tps}

    def close(self) -> None:
        pass


@pytest.mark.parametrize("mode", [
    ["--topic", "orders:9", "--to-earliest"],
    ["--topic", "orders:0,9", "--shift-by", "-1"],
    ["--topic", "orders:9", "--to-offset", "5"],
    ["--to-offsets", "NINE_J"],
    ["--from-file", "NINE_C"],
])
def test_a_partition_the_topic_does_not_have(mode: list[str], world: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A partition that does not exist is named with the ones that do (exit 2, one line, nothing written),
    in every way a reset names a partition (issue 34: "T:9")."""
    from offset_ledger.cli import reset as cli_reset
    from offset_ledger.operate.operations import Operations

    monkeypatch.setattr(cli_reset, "open_operations", lambda ledger, kafka=None: Operations(
        make_engine(ledger.dsn, create=False), kafka=_TwoPartitions()))  # type: ignore[arg-type]
    root = world["root"]
    (root / "nine.json").write_text('{"orders": {"9": 5}}')
    (root / "nine.csv").write_text("orders,9,5\n")
    subst = {"NINE_J": str(root / "nine.json"), "NINE_C": str(root / "nine.csv"), **world["subst"]}
    before = _dump(world["engine"])
    for execute in ([], ["--execute"]):
        code, err = _run(["reset", "orders", *[_fill(a, subst) for a in mode], "--reason", "r", *execute], capsys)
        assert code == 2, err
        assert err == "offset-ledger: error: unknown partition 9 of topic 'orders' (partitions: 0, 1)\n", err
    assert _dump(world["engine"]) == before
