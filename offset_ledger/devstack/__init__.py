"""A real local stack for tests, the demo and trying the tool: PostgreSQL, Apache Kafka, Spark's connector.

Nothing here is a look-alike: the broker is the official ``kafka_2.13`` artifact resolved from
Maven Central and run as a single-node KRaft broker (``KAFKA_VERSION``, or the version named by
``OFFSET_LEDGER_KAFKA_VERSION``: 4.x and 3.7+ work); Postgres is a throwaway cluster made with the
installed ``initdb``/``pg_ctl``; the Spark connector is ``spark-sql-kafka-0-10`` for the installed
PySpark: the same version, on PySpark's Scala line (2.12 for 3.5, 2.13 for 4.x). Artifacts are
cached per version (``OFFSET_LEDGER_CACHE``, default ``~/.cache/offset-ledger``) so a second start
takes seconds.

State of a running stack lives in one directory (``OFFSET_LEDGER_STACK_DIR``, default
``.devstack`` under the current directory): pid files, data, logs and ``stack.env``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# The front door: what ``python -m offset_ledger.devstack``, scripts/test, the tests and the
# benchmarks use (each name defined in one submodule; anything else is imported from its submodule).
from offset_ledger.devstack.artifacts import (
    KAFKA_VERSION,
    connector_coordinates,
    consumer_groups_command,
    fetch,
    iceberg_spark_jars,
    kafka_broker_jars,
    kafka_version,
    spark_jars_option,
    spark_kafka_jars,
)
from offset_ledger.devstack.broker import SASL_MECHANISM, SASL_USERNAME, sasl_client_properties, start_kafka
from offset_ledger.devstack.postgres import Postgres
from offset_ledger.devstack.processes import StackError, free_port, pid_alive, say, stack_dir, stop_pid

__all__ = [
    # the stack (here)
    "StackInfo", "up", "down", "status",
    # artifacts
    "KAFKA_VERSION", "connector_coordinates", "consumer_groups_command", "fetch", "iceberg_spark_jars",
    "kafka_broker_jars", "kafka_version", "spark_jars_option", "spark_kafka_jars",
    # the broker's SASL listener
    "SASL_MECHANISM", "SASL_USERNAME", "sasl_client_properties",
    # processes
    "StackError", "free_port",
]


@dataclass(frozen=True)
class StackInfo:
    """Connection facts of a running stack."""

    bootstrap_servers: str
    postgres_dsn: str
    spark_jars: str
    kafka_pid: int | None
    postgres_pid: int | None
    # The same broker behind SASL_PLAINTEXT (PLAIN, SASL_USERNAME/SASL_PASSWORD); None when not started here.
    sasl_bootstrap_servers: str | None = None

    def env(self) -> dict[str, str]:
        out = {
            "OFFSET_LEDGER_TEST_BOOTSTRAP_SERVERS": self.bootstrap_servers,
            "OFFSET_LEDGER_TEST_DSN": self.postgres_dsn,
            "OFFSET_LEDGER_SPARK_JARS": self.spark_jars,
        }
        if self.sasl_bootstrap_servers:
            out["OFFSET_LEDGER_TEST_SASL_BOOTSTRAP_SERVERS"] = self.sasl_bootstrap_servers
        return out


# --------------------------------------------------------------------------- the stack


def _state_file(root: Path) -> Path:
    return root / "stack.json"


def status(root: Path | None = None) -> StackInfo | None:
    """The running stack's facts, or None when nothing of it runs."""
    root = root or stack_dir()
    state = _state_file(root)
    if not state.exists():
        return None
    info = StackInfo(**json.loads(state.read_text()))
    alive = [p for p in (info.kafka_pid, info.postgres_pid) if p]
    if not alive or not all(pid_alive(p) for p in alive):
        return None
    return info


def up(root: Path | None = None, *, with_postgres: bool | None = None) -> StackInfo:
    """Start Kafka and (unless OFFSET_LEDGER_TEST_DSN is given) Postgres; reuse a running stack."""
    root = root or stack_dir()
    running = status(root)
    if running:
        return running
    down(root)
    root.mkdir(parents=True, exist_ok=True)
    external_dsn = os.environ.get("OFFSET_LEDGER_TEST_DSN")
    if with_postgres is None:
        with_postgres = not external_dsn
    jars = ",".join(str(p) for p in spark_kafka_jars())
    started = time.monotonic()
    pg_pid: int | None = None
    if with_postgres:
        say("starting PostgreSQL")
        dsn, pg_pid = Postgres(root / "postgres").start()
    else:
        dsn = external_dsn or ""
    try:
        say(f"starting Apache Kafka {kafka_version()} (KRaft, single node)")
        bootstrap, sasl_bootstrap, kafka_pid = start_kafka(root / "kafka")
    except Exception:
        if pg_pid:
            Postgres(root / "postgres").stop()
        raise
    info = StackInfo(bootstrap, dsn, jars, kafka_pid, pg_pid, sasl_bootstrap)
    _state_file(root).write_text(json.dumps(asdict(info), indent=2))
    (root / "stack.env").write_text("".join(f"export {k}='{v}'\n" for k, v in info.env().items()))
    say(f"stack up in {time.monotonic() - started:.1f}s: kafka={bootstrap} (SASL {sasl_bootstrap}) "
         f"postgres={dsn}")
    return info


def down(root: Path | None = None) -> None:
    """Stop what ``up`` started (by the pids it recorded) and remove the stack's data."""
    root = root or stack_dir()
    if not root.exists():
        return
    pid_file = root / "kafka" / "kafka.pid"
    if pid_file.exists():
        stop_pid(int(pid_file.read_text()))
        pid_file.unlink()
    Postgres(root / "postgres").stop()
    shutil.rmtree(root, ignore_errors=True)
