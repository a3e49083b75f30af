"""Option groups (``cli/option_groups``) and the connections they resolve (``cli/connections``), issue 51:
each command resolves its ledger and Kafka addresses at most once, opens them only through
``Operations.open``, and takes at most 10 parameters as written."""

from __future__ import annotations

import inspect
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Iterator, Optional

import pytest
import typer
from typer.testing import CliRunner

from offset_ledger.addresses import KafkaAddress, LedgerAddress
from offset_ledger.cli.connections import KafkaOptions
from offset_ledger.cli.main import app
from offset_ledger.cli.option_groups import grouped, written
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.operate.operations import Operations
from tests.ops_seed import seed_pipeline
from tests.unit.api.test_api_validation import StandInKafka
from tests.unit.cli.cli_run import run_cli

CLI = Path(__file__).resolve().parents[3] / "offset_ledger" / "cli"


# -- the mechanism -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Window:
    size: Annotated[str, typer.Option("--size", help="How wide.")]
    slide: Annotated[Optional[str], typer.Option("--slide", help="How far each step moves.")] = None
    tags: Annotated[Optional[list[str]], typer.Option("--tag", "-t", help="Repeatable.")] = None


def _toy() -> tuple[typer.Typer, list[Any]]:
    seen: list[Any] = []
    toy = typer.Typer()

    @toy.command()
    @grouped
    def run(name: str = typer.Argument(..., metavar="NAME"), *, window: Window,
            loud: bool = typer.Option(False, "--loud")) -> None:
        """Run a toy."""
        seen.append((name, window, loud))

    return toy, seen


def test_a_group_reaches_the_command_as_one_value_built_from_its_options() -> None:
    toy, seen = _toy()
    done = CliRunner().invoke(toy, ["n", "--size", "10m", "-t", "a", "--tag", "b", "--loud"])
    assert done.exit_code == 0, done.output
    assert seen == [("n", Window("10m", None, ["a", "b"]), True)]
    seen.clear()
    done = CliRunner().invoke(toy, ["n", "--size", "5m"])
    assert done.exit_code == 0, done.output
    assert seen == [("n", Window("5m"), False)]  # the dataclass's defaults are the options' defaults


def test_a_groups_options_are_in_the_help_and_its_required_ones_are_required() -> None:
    toy, seen = _toy()
    shown = CliRunner().invoke(toy, ["--help"], env={"COLUMNS": "200"})
    for option, help_ in (("--size", "How wide."), ("--slide", "How far each step moves."), ("--tag", "Repeatable.")):
        assert re.search(rf"{option}\b.*{re.escape(help_)}", shown.output), (option, shown.output)
    missing = CliRunner().invoke(toy, ["n"])
    assert missing.exit_code == 2 and "--size" in missing.output and not seen


def test_two_groups_naming_one_option_are_refused_when_typer_looks() -> None:
    @dataclass(frozen=True)
    class Other:
        slide: Annotated[Optional[str], typer.Option("--other-slide")] = None

    def clash(*, window: Window, other: Other) -> None:
        pass

    clash.__annotations__ = {"window": Window, "other": Other, "return": None}
    with pytest.raises(TypeError, match="slide"):
        inspect.signature(grouped(clash))


def _commands() -> Iterator[tuple[str, Any]]:
    def walk(t: typer.Typer, prefix: str) -> Iterator[tuple[str, Any]]:
        for command in t.registered_commands:
            yield prefix + (command.name or command.callback.__name__), command.callback
        for group in t.registered_groups:
            yield from walk(group.typer_instance, f"{prefix}{group.name} ")

    return walk(app, "")


def test_no_command_function_takes_more_than_ten_parameters() -> None:
    for _name, f in _commands():
        inspect.signature(f)  # every command's groups spread (no option named twice)
    wide = {name: len(inspect.signature(written(f)).parameters) for name, f in _commands()}
    assert len(wide) >= 25
    assert {name: n for name, n in wide.items() if n > 10} == {}


def test_the_command_line_makes_no_engine_and_no_kafka_client_of_its_own() -> None:
    """``Operations.open`` is the one place (issue 51); ``connections.kafka_adapter`` the one Kafka-only client."""
    for path in sorted(CLI.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert "make_engine" not in text, path.name
        if path.name not in ("connections.py", "demo.py"):  # the demo talks to its own throwaway broker
            assert "KafkaAdapter(" not in text, path.name


# -- the addresses: resolved once per command ------------------------------------------------------

@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    counts: Counter[str] = Counter()
    ledger_resolve, kafka_resolve = LedgerAddress.resolve.__func__, KafkaAddress.resolve.__func__  # type: ignore[attr-defined]

    def ledger(cls: type, *args: Any, **kwargs: Any) -> LedgerAddress:
        counts["ledger"] += 1
        return ledger_resolve(cls, *args, **kwargs)

    def kafka(cls: type, *args: Any, **kwargs: Any) -> KafkaAddress:
        counts["kafka"] += 1
        return kafka_resolve(cls, *args, **kwargs)

    monkeypatch.setattr(LedgerAddress, "resolve", classmethod(ledger))
    monkeypatch.setattr(KafkaAddress, "resolve", classmethod(kafka))
    return counts


@pytest.fixture
def dsn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = make_engine(url)
    upgrade(engine)
    seed_pipeline(engine, "orders-etl", {"orders": {0: 500, 1: 600, 2: 700}})
    engine.dispose()
    monkeypatch.delenv("OFFSET_LEDGER_DSN", raising=False)
    monkeypatch.delenv("OFFSET_LEDGER_BOOTSTRAP_SERVERS", raising=False)
    return url


@pytest.fixture
def stand_in_kafka(monkeypatch: pytest.MonkeyPatch) -> list[tuple[LedgerAddress, KafkaAddress | None]]:
    """Commands that ask Kafka get a stand-in over the addresses they resolved (recorded here)."""
    from offset_ledger.cli import main as cli_main
    from offset_ledger.cli import reset as cli_reset

    opened: list[tuple[LedgerAddress, KafkaAddress | None]] = []

    def open_operations(ledger: LedgerAddress, kafka: KafkaAddress | None = None) -> Operations:
        opened.append((ledger, kafka))
        return Operations(Operations.open(ledger).engine, kafka=StandInKafka())  # type: ignore[arg-type]

    for module in (cli_main, cli_reset):
        monkeypatch.setattr(module, "open_operations", open_operations)
    return opened


READS = [
    ["offsets", "orders-etl"], ["history", "orders-etl", "--all"], ["findings", "orders-etl"],
    ["resets", "orders-etl"], ["verify", "orders-etl"], ["pipelines", "--no-lag"], ["policy", "show", "orders-etl"],
    ["policy", "history", "orders-etl"], ["prune", "--older-than", "30d"], ["db", "upgrade"],
]


@pytest.mark.parametrize("argv", READS, ids=[" ".join(a[:2]) for a in READS])
def test_a_ledger_command_resolves_its_ledger_once(argv: list[str], dsn: str, counted: Counter[str],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = run_cli(capsys, *argv, "--dsn", dsn)
    assert code == 0, err
    assert counted["ledger"] == 1, counted
    assert counted["kafka"] <= 1, counted


def test_a_policy_change_reads_and_writes_through_one_resolution(dsn: str, counted: Counter[str],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = run_cli(capsys, "policy", "set", "orders-etl", "--on-data-loss", "earliest", "--reason", "r",
                              "--dsn", dsn)
    assert code == 0, err
    assert counted == Counter(ledger=1), counted


@pytest.mark.parametrize("argv", [
    ["lag", "orders-etl"], ["pipelines"],
    ["reset", "orders-etl", "--to-earliest", "--execute", "--reason", "r"],
    ["reset", "orders-etl", "--shift-by", "-5"],
], ids=["lag", "pipelines", "reset --execute", "reset dry run"])
def test_a_kafka_command_resolves_each_address_once_and_opens_what_it_resolved(
        argv: list[str], dsn: str, counted: Counter[str], stand_in_kafka: list[Any], tmp_path: Path) -> None:
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=PLAINTEXT\nclient.id=from-file\n")
    # Typer's CliRunner this time (run_cli above): the same command line, in process.
    done = CliRunner().invoke(app, [*argv, "--dsn", dsn, "--bootstrap-server", "broker:9092", "-o", "client.id=cli",
                                    "--command-config", str(config), "--timeout", "1500"])
    assert done.exit_code == 0, done.output
    assert counted == Counter(ledger=1, kafka=1), counted
    [(ledger, kafka)] = stand_in_kafka
    assert ledger == LedgerAddress(dsn, create=False)  # a reader's: a mistyped SQLite path is never created
    assert kafka is not None and kafka.bootstrap_servers == "broker:9092" and kafka.timeout_ms == 1500
    # The properties file under the -o items, as Spark-style kafka.* options (kafka/client_config.gather).
    assert dict(kafka.options) == {"kafka.security.protocol": "PLAINTEXT", "kafka.client.id": "cli"}


def test_kafka_options_fall_back_to_the_properties_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFSET_LEDGER_BOOTSTRAP_SERVERS", "env:9092")
    assert KafkaOptions().address().bootstrap_servers == "env:9092"
    named = KafkaOptions(kafka_option=["kafka.bootstrap.servers=props:9092"]).address()
    assert named.bootstrap_servers == "props:9092"
    assert KafkaOptions(bootstrap_servers="arg:9092", timeout=7).address() == KafkaAddress("arg:9092", {}, 7)


def test_import_checkpoint_reaches_kafka_only_when_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its --bootstrap-server has no envvar: the environment's servers do not make an import call a cluster."""
    from offset_ledger.cli.checkpoint import KafkaIdsOptions

    monkeypatch.setenv("OFFSET_LEDGER_BOOTSTRAP_SERVERS", "env:9092")
    assert KafkaIdsOptions().address().bootstrap_servers is None
    assert KafkaIdsOptions(bootstrap_servers="arg:9092").address().bootstrap_servers == "arg:9092"


def test_a_mistyped_sqlite_path_stays_an_error_and_creates_nothing(tmp_path: Path, counted: Counter[str],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "typo.db"
    for argv in (["offsets", "orders-etl"], ["failover", "orders-etl", "--to-bootstrap", "b:9092"],
                 ["policy", "show", "orders-etl"]):
        code, _out, err = run_cli(capsys, *argv, "--dsn", f"sqlite:///{missing}")
        assert code == 2, (argv, err)
        assert err.startswith(f"offset-ledger: error: no ledger database at {missing}"), (argv, err)
        assert not missing.exists(), argv
