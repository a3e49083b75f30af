"""The command line as scripts see it: exit codes, truncation signals, terminal-safe output, help,
and the KCG reset vocabulary, on the embedded SQLite ledger with an in-memory Kafka stand-in."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert

from offset_ledger import errors
from offset_ledger.cli import reset as cli_reset
from offset_ledger.cli.main import main
from offset_ledger.cli.support import emit, safe_text
from offset_ledger.kafka.snapshot import ClusterSnapshot
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.queries import current_positions
from offset_ledger.ledger.tables import findings
from offset_ledger.operate.operations import Operations
from offset_ledger.rules.model import TopicPartition, Watermarks
from tests.ops_seed import seed_pipeline


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def dsn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    for name in [k for k in os.environ if k.startswith("OFFSET_LEDGER_")]:
        monkeypatch.delenv(name)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = make_engine(url)
    upgrade(engine)
    seed_pipeline(engine, "etl", {"orders": {0: 12, 1: 17}}, n_batches=3)
    engine.dispose()
    return url


class FakeKafka:
    """A cluster of one topic, ``orders``, partitions 0-1 holding offsets [5, 30)."""

    def snapshot(self, topics: list[str]) -> ClusterSnapshot:
        marks = {TopicPartition(t, p): Watermarks(5, 30) for t in topics if t == "orders" for p in (0, 1)}
        return ClusterSnapshot({t: [0, 1] for t in topics if t == "orders"}, {}, marks)

    def watermarks(self, topics: list[str]) -> dict[TopicPartition, Watermarks]:
        return self.snapshot(topics).watermarks

    def offsets_for_time(self, tps: list[TopicPartition], timestamp_ms: int) -> dict[TopicPartition, int | None]:
        return {tp: 20 for tp in tps}

    def close(self) -> None:
        pass


@pytest.fixture
def fake_kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    def operations(ledger: Any, kafka: Any = None) -> Operations:
        return Operations(make_engine(ledger.dsn, create=False), kafka=FakeKafka())  # type: ignore[arg-type]

    monkeypatch.setattr(cli_reset, "open_operations", operations)


def positions(dsn: str) -> dict[int, int]:
    engine = make_engine(dsn)
    try:
        with engine.connect() as conn:
            return {p.partition: p.next_offset for p in current_positions(conn, "etl")}
    finally:
        engine.dispose()


# -- exit codes ------------------------------------------------------------------------------


@pytest.mark.parametrize("exc, code", [
    (errors.InvalidInput("x"), 2), (errors.ConfigError("x"), 2), (errors.UnknownPipeline("p"), 2),
    (errors.AmbiguousConsumerGroup("p", ["a", "b"]), 2),
    (errors.ActiveRunConflict("p", ["r"]), 3), (errors.OffsetOutOfRange([]), 3), (errors.MirrorRefused("g", 1), 3),
    (errors.AdoptionRefused("p", "g", {}), 3), (errors.FirstRunRefused("p", "g", ["t"], {}), 3),
    (errors.DataLossError("lost", []), 4),
    (errors.LedgerUnavailable("x"), 5), (errors.KafkaUnavailable("x"), 5), (errors.KafkaAuthenticationFailed("x"), 5),
    (errors.LedgerWithoutSchema("x"), 2), (errors.LedgerError("x"), 1), (errors.KafkaError("x"), 1), (RuntimeError("bug"), 1),
])
def test_exit_code_per_error(exc: BaseException, code: int) -> None:
    assert errors.exit_code(exc) == code


def test_each_exit_code_from_the_command_line(dsn: str, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli(["offsets", "etl", "--dsn", dsn], capsys)[0] == 0
    code, _, err = cli(["offsets", "etl", "--dsn", dsn, "--format", "xml"], capsys)
    assert code == 2 and err.count("\n") == 1
    code, _, err = cli(["offsets", "etl", "--dsn", "postgresql+psycopg2://nobody@127.0.0.1:1/none"], capsys)
    assert code == 5 and "ledger database" in err and err.count("\n") == 1

    from offset_ledger.operate import reads

    for raised, expected in ((errors.ActiveRunConflict("etl", ["r1"]), 3), (errors.DataLossError("lost", []), 4),
                             (ZeroDivisionError("boom"), 1)):
        def fail(*_a: Any, raised: BaseException = raised, **_k: Any) -> Any:
            raise raised

        monkeypatch.setattr(reads, "positions", fail)
        code, _, err = cli(["offsets", "etl", "--dsn", dsn], capsys)
        assert code == expected and err.count("\n") == 1 and "Traceback" not in err
    assert "internal error: ZeroDivisionError: boom (rerun with --traceback)" in err


def test_reads_never_create_a_ledger_at_a_mistyped_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()  # a file that is no ledger: usage (2), with what to run
    code, _, err = cli(["offsets", "etl", "--dsn", f"sqlite:///{empty}"], capsys)
    assert code == 2 and "offset-ledger db upgrade" in err
    typo = tmp_path / "typo" / "ledgr.db"
    for argv in (["pipelines"], ["offsets", "etl"], ["history", "etl"], ["findings", "etl"], ["resets", "etl"]):
        code, _, err = cli([*argv, "--dsn", f"sqlite:///{typo}"], capsys)
        assert code == 2 and "no ledger database at" in err, argv
    assert not typo.parent.exists()


# -- truncation, findings, resets --------------------------------------------------------------


def test_findings_resets_and_the_pipelines_column(dsn: str, capsys: pytest.CaptureFixture[str],
                                                 fake_kafka: None) -> None:
    engine = make_engine(dsn)
    now = datetime.now(timezone.utc)
    with engine.begin() as conn:
        conn.execute(insert(findings), [
            {"pipeline": "etl", "consumer_group": "etl", "kind": kind, "topic": "orders", "partition": 0,
             "message": f"finding {i}", "created_at": now} for i, kind in enumerate(["gap", "regression", "gap"])])
    engine.dispose()

    code, out, _ = cli(["pipelines", "--dsn", dsn, "--no-lag", "-f", "json"], capsys)
    assert code == 0 and json.loads(out)[0]["findings"] == 3
    code, out, err = cli(["findings", "etl", "--dsn", dsn, "--limit", "2", "-f", "csv"], capsys)
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["message"] for r in rows] == ["finding 2", "finding 1"]
    assert err.startswith("more: --before ")  # a cut-short CSV says so
    code, out, err = cli(["findings", "etl", "--dsn", dsn, "--before", err.split()[2], "-f", "json"], capsys)
    assert [f["message"] for f in json.loads(out)["findings"]] == ["finding 0"] and err == ""
    code, out, err = cli(["findings", "etl", "--dsn", dsn, "--kind", "gap", "--all", "-f", "json"], capsys)
    assert len(json.loads(out)["findings"]) == 2 and err == ""

    for _ in range(3):
        assert cli(["reset", "etl", "--to-earliest", "--dsn", dsn, "--reason", "look"], capsys)[0] == 0
    code, out, err = cli(["resets", "etl", "--dsn", dsn, "--limit", "2", "-f", "csv"], capsys)
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 2 and {r["status"] for r in rows} == {"dry_run"} and rows[0]["reason"] == "look"
    assert err.startswith("more: --limit")


# -- reset: KCG vocabulary -------------------------------------------------------------------


def test_kcg_modes_export_and_from_file(dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        fake_kafka: None) -> None:
    code, out, _ = cli(["reset", "etl", "--to-current", "--export", "--dsn", dsn], capsys)
    assert code == 0 and out == "orders,0,12\norders,1,17\n"
    saved = tmp_path / "saved.csv"
    saved.write_text(out)

    code, out, _ = cli(["reset", "etl", "--shift-by", "-50", "--dsn", dsn, "-f", "csv"], capsys)
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["targetNextOffset"], r["outOfRange"], r["clamped"]) for r in rows] == [
        ("5", "below_log_start", "True")] * 2
    code, out, _ = cli(["reset", "etl", "--shift-by", "-50", "--out-of-range", "refuse", "--dsn", dsn, "-f", "csv"],
                       capsys)
    rows = list(csv.DictReader(io.StringIO(out)))  # no negative target shown: the request is marked refused
    assert code == 0 and [(r["targetNextOffset"], r["requestedNextOffset"], r["outOfRange"], r["clamped"])
                          for r in rows] == [("", "-38", "below_log_start", "False"), ("", "-33", "below_log_start", "False")]
    code, _, err = cli(["reset", "etl", "--shift-by", "-50", "--out-of-range", "refuse", "--execute", "--reason", "test", "--dsn", dsn],
                       capsys)
    assert code == 3 and "outside the log" in err

    assert cli(["reset", "etl", "--to-offset", "9", "--execute", "--reason", "test", "--dsn", dsn], capsys)[0] == 0
    assert positions(dsn) == {0: 9, 1: 9}
    assert cli(["reset", "etl", "--by-duration", "PT10M", "--execute", "--reason", "test", "--dsn", dsn], capsys)[0] == 0
    assert positions(dsn) == {0: 20, 1: 20}
    code, _, err = cli(["reset", "etl", "--from-file", str(saved), "--execute", "--reason", "test", "--dsn", dsn], capsys)
    assert code == 0, err
    assert positions(dsn) == {0: 12, 1: 17}

    for argv in (["--to-earliest", "--to-latest"], [], ["--to-latest", "--dry-run", "--execute"],
                 ["--to-latest", "--all-topics", "--topic", "orders"], ["--by-duration", "-5m"],
                 ["--from-file", str(tmp_path / "missing.csv")], ["--to-offset", "-7"],
                 ["--to-latest", "--command-config", str(tmp_path / "missing.properties")]):
        code, _, err = cli(["reset", "etl", *argv, "--dsn", dsn], capsys)
        assert code == 2 and err.count("\n") == 1, (argv, err)
    assert positions(dsn) == {0: 12, 1: 17}


# -- output safety and help ------------------------------------------------------------------


def test_recorded_names_cannot_drive_the_terminal_or_forge_rows(capsys: pytest.CaptureFixture[str]) -> None:
    evil = "etl\x1b]0;pwned\x07\nforged,row"
    assert safe_text(evil) == "etl\\x1b]0;pwned\\x07\\nforged,row"
    for fmt in ("table", "csv"):
        emit([{"pipeline": evil, "lag": 1}], ["pipeline", "lag"], fmt)
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\x07" not in out and out.count("\n") == 2, fmt
    emit([{"pipeline": evil}], ["pipeline"], "json")
    assert json.loads(capsys.readouterr().out) == [{"pipeline": evil}]  # JSON escapes by itself


def test_help_is_plain_wide_and_has_no_placeholders() -> None:
    env = dict(os.environ, COLUMNS="150")
    cmd = [sys.executable, "-c", "from offset_ledger.cli.main import main; main()"]
    bare = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert bare.returncode == 0 and "Commands:" in bare.stdout and bare.stderr == ""
    reset = subprocess.run([*cmd, "reset", "-h"], env=env, capture_output=True, text=True, timeout=60)
    assert reset.returncode == 0
    text = reset.stdout
    assert "[log-start, log-end]" in text and "Examples:" in text
    assert "Usage: offset-ledger reset [OPTIONS] PIPELINE" in text
    for placeholder in ("<bool>", "<str>", "<int>", "<list", "{PIPELINE}", "{pipeline}"):
        assert placeholder not in text, placeholder
    assert "--from-file FILE" in text and "--topic TOPIC[:P,...]" in text
    assert max(len(line) for line in text.splitlines()) > 100  # the terminal's width, not 80 columns


def test_docs_name_only_commands_and_options_that_exist() -> None:
    """Every ``offset-ledger CMD --option`` in docs/cli.md's shell examples is in that command's help."""
    import re

    docs = (Path(__file__).resolve().parents[3] / "docs" / "cli.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", docs, flags=re.S)
    lines = [line.split("#")[0].split(">")[0] for block in blocks for line in block.splitlines()
             if line.startswith("offset-ledger ")]
    assert len(lines) >= 6
    env = dict(os.environ, COLUMNS="200")
    for line in lines:
        words = line.split()
        command = words[1]
        shown = subprocess.run([sys.executable, "-c", "from offset_ledger.cli.main import main; main()", command, "-h"],
                               env=env, capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, line
        for option in (w for w in words[2:] if w.startswith("-")):
            assert re.search(rf"(^|[\s,]){re.escape(option)}([\s,/]|$)", shown.stdout, flags=re.M), (line, option)
