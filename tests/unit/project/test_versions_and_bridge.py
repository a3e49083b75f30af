"""Version rules without Maven or a JVM: which connector and broker the devstack resolves, and how the listener registers."""

from __future__ import annotations

import pytest

from offset_ledger import devstack


@pytest.mark.parametrize("pyspark, expected", [
    ("3.5.7", ("spark-sql-kafka-0-10_2.12", "3.5.7")),
    ("3.5.0", ("spark-sql-kafka-0-10_2.12", "3.5.0")),
    ("4.0.0", ("spark-sql-kafka-0-10_2.13", "4.0.0")),
    ("4.2.0", ("spark-sql-kafka-0-10_2.13", "4.2.0")),
])
def test_the_connector_follows_pysparks_version_and_scala_line(pyspark: str, expected: tuple[str, str]) -> None:
    assert devstack.connector_coordinates(pyspark) == expected


@pytest.mark.parametrize("pyspark", ["3.4.4", "2.4.8", "5.0.0", "4.2.0.dev0", "4.1", "x.y.z"])
def test_versions_without_a_supported_connector_are_refused(pyspark: str) -> None:
    with pytest.raises(devstack.StackError, match="PySpark"):
        devstack.connector_coordinates(pyspark)


def test_the_broker_version_is_selectable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OFFSET_LEDGER_KAFKA_VERSION", raising=False)
    assert devstack.kafka_version() == devstack.KAFKA_VERSION
    monkeypatch.setenv("OFFSET_LEDGER_KAFKA_VERSION", "3.9.2")
    assert devstack.kafka_version() == "3.9.2"
    for bad in ("3.6.2", "2.8.1", "latest", "4"):
        monkeypatch.setenv("OFFSET_LEDGER_KAFKA_VERSION", bad)
        with pytest.raises(devstack.StackError, match="OFFSET_LEDGER_KAFKA_VERSION"):
            devstack.kafka_version()


def test_a_bad_broker_version_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from offset_ledger.devstack.__main__ import main

    monkeypatch.setenv("OFFSET_LEDGER_KAFKA_VERSION", "2.8.1")
    monkeypatch.setenv("OFFSET_LEDGER_CACHE", "/nonexistent-offset-ledger-cache")
    assert main(["fetch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "OFFSET_LEDGER_KAFKA_VERSION='2.8.1'" in err


def test_the_jars_command_prints_the_spark_jars_value(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    from offset_ledger.devstack.__main__ import main

    jars = [Path("/c/spark-sql-kafka-0-10_2.13-4.2.0.jar"), Path("/c/kafka-clients-3.9.2.jar")]
    from offset_ledger.devstack import artifacts

    monkeypatch.setattr(artifacts, "spark_kafka_jars", lambda: jars)  # where it lives since the split
    assert main(["jars"]) == 0
    assert capsys.readouterr().out == "/c/spark-sql-kafka-0-10_2.13-4.2.0.jar,/c/kafka-clients-3.9.2.jar\n"


def test_the_fast_listener_bridge_needs_a_jvm() -> None:
    # A fresh interpreter: in a full test run this process already has the tests' JVM.
    import subprocess
    import sys

    code = "from offset_ledger.capture.listener import _fast_bridge_wrapper; print(_fast_bridge_wrapper())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None"


def test_the_listener_refuses_to_be_pickled_with_a_clear_message(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # PySpark 3.5's Spark Connect client pickles listeners to run them on the server.
    import pickle

    from pyspark import cloudpickle

    from offset_ledger import OffsetLedgerListener

    listener = OffsetLedgerListener(dsn=f"sqlite:///{tmp_path / 'l.db'}", pipeline="p", spool_dir=tmp_path / "spool")
    try:
        for dumps in (pickle.dumps, cloudpickle.dumps):
            with pytest.raises(TypeError, match="Spark Connect needs PySpark 4.x"):
                dumps(listener)
    finally:
        listener.close(5)
