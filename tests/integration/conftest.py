"""Real-stack fixtures: one Postgres, one Kafka broker and one SparkSession per test run.

The stack comes from the environment when ``OFFSET_LEDGER_TEST_BOOTSTRAP_SERVERS`` and
``OFFSET_LEDGER_TEST_DSN`` are set (``scripts/test`` starts it with the devstack and exports
them), otherwise these fixtures start it themselves and stop it at the end. A missing service is
an error, never a skip: the suite exists to prove the real parts work together.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url

from offset_ledger import devstack
from tests.integration.kafka_helper import KafkaHelper

pytestmark = pytest.mark.integration

# kafka-python logs an ERROR each time a client's metadata no longer lists a topic another test
# deleted: thousands of lines of noise in every failure report, and never a failure of ours.
logging.getLogger("kafka.cluster").setLevel(logging.CRITICAL)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def stack() -> Iterator[devstack.StackInfo]:
    """Connection facts of the real stack (started here unless the environment names one)."""
    bootstrap = os.environ.get("OFFSET_LEDGER_TEST_BOOTSTRAP_SERVERS")
    dsn = os.environ.get("OFFSET_LEDGER_TEST_DSN")
    if bootstrap and dsn:
        jars = os.environ.get("OFFSET_LEDGER_SPARK_JARS") or ",".join(
            str(p) for p in devstack.spark_kafka_jars())
        yield devstack.StackInfo(bootstrap, dsn, jars, None, None,
                                 os.environ.get("OFFSET_LEDGER_TEST_SASL_BOOTSTRAP_SERVERS"))
        return
    root = Path(tempfile.mkdtemp(prefix="offset-ledger-stack-"))
    try:
        info = devstack.up(root)
    except devstack.StackError as exc:
        devstack.down(root)
        pytest.fail(f"the real stack could not start: {exc}", pytrace=False)
    try:
        yield info
    finally:
        devstack.down(root)


def _unique(name: str, prefix: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")[:30]
    return f"{prefix}_{slug}_{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def fresh_database(stack: devstack.StackInfo, name: str) -> Iterator[str]:
    """The DSN of a new, empty database ``name`` on the stack's Postgres, dropped afterwards."""
    admin_url = make_url(stack.postgres_dsn)
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin_url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def pg_dsn(stack: devstack.StackInfo, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, empty Postgres database for this test, dropped afterwards."""
    with fresh_database(stack, _unique(request.node.name, "t")) as dsn:
        yield dsn


@pytest.fixture
def ledger(pg_dsn: str) -> Iterator[Engine]:
    """An engine on this test's fresh Postgres database, at the newest schema."""
    from offset_ledger.ledger.engine import ensure_schema, make_engine

    engine = make_engine(pg_dsn)
    ensure_schema(engine)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def kafka_session(stack: devstack.StackInfo) -> Iterator[KafkaHelper]:
    helper = KafkaHelper(stack.bootstrap_servers)
    try:
        yield helper
    finally:
        helper.close()


@pytest.fixture
def kafka(kafka_session: KafkaHelper, request: pytest.FixtureRequest) -> Iterator[KafkaHelper]:
    """The shared broker; topics this test creates are deleted afterwards."""
    kafka_session.name_hint = _unique(request.node.name, "t")
    start = len(kafka_session.created)
    yield kafka_session
    kafka_session.delete_topics(kafka_session.created[start:])
    del kafka_session.created[start:]


@pytest.fixture(scope="session")
def spark(stack: devstack.StackInfo):  # type: ignore[no-untyped-def]
    """One SparkSession for the whole run, with Spark's official Kafka connector on spark.jars.

    With ``OFFSET_LEDGER_TEST_SPARK_CONNECT`` set (``scripts/test --matrix``) it is a Spark Connect
    session on a local Connect server (``remote("local[2]")``): the same settings, ``spark.jars``
    included, configure the server's SparkContext.
    """
    if shutil.which("java") is None:
        pytest.fail("java is not on PATH; Spark needs Java 17+", pytrace=False)
    from pyspark.sql import SparkSession

    # Python workers (foreachPartition, UDFs) run this interpreter, with the package and its
    # dependencies, not whatever python3 is first on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    warehouse = tempfile.mkdtemp(prefix="offset-ledger-spark-")
    builder = (SparkSession.builder.remote("local[2]") if os.environ.get("OFFSET_LEDGER_TEST_SPARK_CONNECT")
               else SparkSession.builder.master("local[2]"))
    session = (
        builder
        .appName("offset-ledger-tests")
        .config("spark.jars", stack.spark_jars)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.warehouse.dir", warehouse)
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .config("spark.driver.extraJavaOptions", "-Dderby.system.home=" + warehouse)
        .getOrCreate()
    )
    from pyspark import SparkContext

    SparkContext.getOrCreate().setLogLevel("WARN")  # on Connect: the local server's context
    try:
        yield session
    finally:
        session.stop()
        shutil.rmtree(warehouse, ignore_errors=True)


@pytest.fixture
def tmp_checkpoints(tmp_path: Path) -> Path:
    path = tmp_path / "checkpoints"
    path.mkdir()
    return path
