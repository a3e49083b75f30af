"""The README's quick start runs as written (issue 50, item 2): its setup commands are ones the
devstack takes, ``up --user`` prints the user-level settings (never the tests' variables), and the
example names Spark's connector through ``offset_ledger.spark_packages()``. (The example itself runs
in tests/integration/test_docs_examples.py; ``devstack topic`` against a real broker in
tests/integration/test_devstack_topic.py.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from offset_ledger import devstack
from offset_ledger.devstack import __main__ as cli

README = (Path(__file__).resolve().parents[3] / "README.md").read_text()
QUICK = README[README.index("## Quick start"):README.index("## What it does")]


def test_the_example_reads_no_test_variable() -> None:
    assert "OFFSET_LEDGER_SPARK_JARS" not in QUICK and "OFFSET_LEDGER_TEST_" not in QUICK
    assert 'config("spark.jars.packages", spark_packages())' in QUICK


def test_every_setup_command_is_one_the_devstack_takes(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    info = devstack.StackInfo("127.0.0.1:9092", "postgresql+psycopg2://u@127.0.0.1:5432/ledger", "/jars/a.jar",
                              1, 2)
    monkeypatch.setattr(devstack, "up", lambda *a, **k: info)
    monkeypatch.setattr(devstack, "status", lambda *a, **k: info)
    made: list[tuple[str, object, int]] = []
    monkeypatch.setattr(cli, "make_topic", lambda servers, name, parts, n: made.append((name, parts, n)) or "ok")
    commands = [shlex.split(m) for m in re.findall(r"python -m offset_ledger\.devstack ([^`)\"#\n]+)", QUICK)]
    assert len(commands) >= 3
    for argv in commands:
        assert cli.main(argv) == 0, argv
    out = capsys.readouterr().out
    assert "export OFFSET_LEDGER_BOOTSTRAP_SERVERS='127.0.0.1:9092'" in out
    assert "export OFFSET_LEDGER_DSN='postgresql+psycopg2://u@127.0.0.1:5432/ledger'" in out
    assert "OFFSET_LEDGER_TEST_" not in out and "OFFSET_LEDGER_SPARK_JARS" not in out
    assert made == [("orders", None, 1000), ("orders", None, 500)]
