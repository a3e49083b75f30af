"""Every fenced shell and Python example of README.md and docs/*.md runs against the real stack.

Parsing and the marker rules are in ``tests/docs_blocks.py``. Each runnable block gets a fresh
Postgres ledger prepared by its setup (``orders`` unless a ``<!-- docs-test: setup NAME -->``
marker names another) and the shared topic ``orders`` (2 partitions, 120 records each). The
docs' placeholders are pointed at the test stack, and nothing else is changed:

- ``localhost:9092`` / ``broker:9093`` -> the test broker; ``http://127.0.0.1:9090`` -> an
  ``offset-ledger serve`` this test starts (or the one the block starts, moved to a free port);
- ``postgresql+psycopg2://user@host/ledger`` and ``.../...`` -> the block's ledger (also
  ``OFFSET_LEDGER_DSN``; ``OFFSET_LEDGER_BOOTSTRAP_SERVERS`` is the broker);
- ``/checkpoints/``, ``/data/``, ``/etc/offset-ledger/``, ``/tmp/offset-ledger-example/`` -> a
  temporary directory.

Shell blocks run in bash with the installed ``offset-ledger`` first on PATH and curl set to fail on
HTTP errors (``fail-with-body`` in a ``CURL_HOME/.curlrc``), so an API answer of 4xx/5xx fails
the command. Python blocks run in this process on the session's one SparkSession, with the names
the README example defines (``spark``, ``DSN``, ``BOOTSTRAP``, ``TOPIC``, ``start_from_ledger``,
``OffsetLedgerListener``; ``schema`` for the windowed example); queries they start are run to
the end of the topic and stopped, listeners they add are removed, ``spark.stop()`` is a no-op.
Identical blocks (the README's restart example is also restart.md's) run once.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, insert, select, text
from sqlalchemy.engine import make_url

from offset_ledger import devstack
from tests.docs_blocks import (
    MAX_SKIPPED,
    Block,
    all_blocks,
    commands,
    console_commands,
    label_lines,
    shape_mismatches,
    shown_shape,
    top_level_print_labels,
)
from tests.integration.kafka_helper import KafkaHelper
from tests.ops_seed import seed_pipeline

FIXTURE_CHECKPOINT = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints" / "spark-4.2.0" / "kafka-one"
BIN = Path(sys.executable).parent
RECORDS = 120  # per partition of the topic orders
POSITIONS = {"orders": {0: 100, 1: 100}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Docs:
    """The state one test run shares: the stack, the topic, a work directory, fresh ledgers."""

    def __init__(self, stack: devstack.StackInfo, kafka: KafkaHelper, spark: Any, work: Path) -> None:
        self.stack, self.kafka, self.spark, self.work = stack, kafka, spark, work
        self.admin = create_engine(make_url(stack.postgres_dsn), isolation_level="AUTOCOMMIT")
        self.databases: list[str] = []
        self.topics: list[str] = []
        (work / "curl").mkdir(parents=True)
        (work / "curl" / ".curlrc").write_text("fail-with-body\n")

    # -- ledgers ------------------------------------------------------------------------------

    def fresh_dsn(self) -> str:
        name = f"t_docs_{uuid.uuid4().hex[:10]}"
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        self.databases.append(name)
        return make_url(self.stack.postgres_dsn).set(database=name).render_as_string(hide_password=False)

    def close(self) -> None:
        with self.admin.connect() as conn:
            for name in self.databases:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        self.admin.dispose()
        self.kafka.delete_topics(self.topics)
        with contextlib.suppress(Exception):  # noqa: BLE001 - hygiene only
            self.kafka.admin.delete_consumer_groups(["orders"])

    # -- setups -------------------------------------------------------------------------------

    def setup_empty(self, dsn: str, work: Path) -> None:
        """A database without the schema (``db upgrade``, the listener, ``import-checkpoint`` create it)."""

    def setup_orders(self, dsn: str, work: Path) -> None:
        """Pipeline ``orders`` as recorded: generation 1, then generation 2 whose query ran batches 0-49
        from 2024-05-01T12:00Z, one a minute, ending at offset 100 on both partitions."""
        from offset_ledger.ledger.engine import make_engine, upgrade
        from offset_ledger.ledger.tables import checkpoint_generations

        engine = make_engine(dsn)
        try:
            upgrade(engine)
            ids = seed_pipeline(engine, "orders", POSITIONS, n_batches=50,
                                start=datetime(2024, 5, 1, 12, tzinfo=timezone.utc))
            root = str(work / "checkpoints" / "orders-gens")
            with engine.begin() as conn:
                for gen, query_id in ((1, str(uuid.uuid4())), (2, ids["query_id"])):
                    conn.execute(insert(checkpoint_generations).values(
                        pipeline="orders", consumer_group="orders", generation=gen, checkpoint_root=root,
                        location=f"{root}/gen-{gen}", app_version=f"{gen}.0",
                        reason="first" if gen == 1 else "app_version",
                        created_at=datetime(2024, 5, 1, 11, 50 + gen, tzinfo=timezone.utc),
                        starting_offsets={"orders": {"0": -2, "1": -2}}, resolved_offsets={"orders": {"0": 0, "1": 0}},
                        query_id=query_id))
        finally:
            engine.dispose()

    def setup_mirrored(self, dsn: str, work: Path) -> None:
        """``orders`` as recorded, and its positions committed to the Kafka group ``orders``."""
        from offset_ledger.kafka.adapter import KafkaAdapter
        from offset_ledger.kafka.mirror import sync_group
        from offset_ledger.ledger.engine import make_engine

        self.setup_orders(dsn, work)
        engine = make_engine(dsn)
        try:
            with KafkaAdapter(self.stack.bootstrap_servers) as adapter:
                assert sync_group(engine, adapter, "orders", "orders").committed == 2
        finally:
            engine.dispose()

    def setup_adopt(self, dsn: str, work: Path) -> None:
        """No ledger yet, and a job's checkpoint at /checkpoints/orders: a real Spark 4.2 checkpoint
        (batches 0-3 committed, at offset 20 on both partitions) of the topic ``orders``."""
        dest = work / "checkpoints" / "orders"
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(FIXTURE_CHECKPOINT, dest)
        for f in dest.rglob("*"):
            if f.is_file():
                f.write_text(f.read_text().replace("orders_fa118d", "orders"))

    def setup_clicks(self, dsn: str, work: Path) -> None:
        """An empty ledger and a topic ``clicks`` of JSON click events (``event_time``, ``user``)."""
        if "clicks" not in self.topics:
            self.kafka.create_topic(partitions=2, name="clicks")
            self.topics.append("clicks")
            self.kafka.created.remove("clicks")
            now = datetime.now(timezone.utc).replace(microsecond=0)
            self.kafka.produce("clicks", [json.dumps({"event_time": now.isoformat(), "user": f"u{i % 3}"})
                                          for i in range(20)])

    # -- running ------------------------------------------------------------------------------

    def substitute(self, source: str, dsn: str, work: Path, api: str) -> str:
        for old, new in (("postgresql+psycopg2://user@host/ledger", dsn), ("postgresql+psycopg2://...", dsn),
                         ("localhost:9092", self.stack.bootstrap_servers),
                         ("broker:9093", self.stack.bootstrap_servers),
                         ("http://127.0.0.1:9090", api), ("http://localhost:9090", api),
                         ("/tmp/offset-ledger-example/", f"{work}/example/"),
                         ("/checkpoints/", f"{work}/checkpoints/"), ("/data/", f"{work}/data/"),
                         ("/etc/offset-ledger/", f"{work}/etc/offset-ledger/")):
            source = source.replace(old, new)
        return source

    def environment(self, dsn: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OFFSET_LEDGER_")}
        env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", CURL_HOME=str(self.work / "curl"),
                   OFFSET_LEDGER_DSN=dsn, OFFSET_LEDGER_BOOTSTRAP_SERVERS=self.stack.bootstrap_servers,
                   OFFSET_LEDGER_TEST_BOOTSTRAP_SERVERS=self.stack.bootstrap_servers,
                   OFFSET_LEDGER_SPARK_JARS=self.stack.spark_jars,
                   OFFSET_LEDGER_HOME=str(self.work / "home"))
        return env


def _serve(env: dict[str, str], port: int, cwd: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([str(BIN / "offset-ledger"), "serve", "--port", str(port), "--log-level", "warning"],
                            env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"offset-ledger serve exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return proc
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("offset-ledger serve did not come up within 60 s")


_PRELUDE = r"""
__docs_pids=()
__docs_stop() { for p in "${__docs_pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap __docs_stop EXIT
__docs_wait_up() {
  for _ in $(seq 1 300); do curl -q -s -o /dev/null "http://127.0.0.1:$1/healthz" && return 0; sleep 0.2; done
  return 1
}
"""
_SERVE = re.compile(r"\boffset-ledger serve\b")


_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=\S+$")


def run_shell(docs: Docs, block: Block, dsn: str, work: Path, carried: list[str]) -> list[str]:
    """Run the block's commands in one bash; the failures, described.

    Variables carry over within a block, and plain ``NAME=value`` lines of the file's earlier blocks
    (``API=...``) are set first, as for a reader going down the page.
    """
    port = _free_port()
    api = f"http://127.0.0.1:{port}"
    split = console_commands if block.lang == "console" else commands
    cmds = split(docs.substitute(block.text, dsn, work, api))
    preset = [docs.substitute(line, dsn, work, api) for line in carried]
    carried.extend(c.text for c in split(block.text) if _ASSIGNMENT.match(c.text))
    env = docs.environment(dsn)
    server = None
    serves_itself = any(_SERVE.search(c.text) for c in cmds)
    if not serves_itself and any(api in c.text or "$API" in c.text for c in cmds):
        server = _serve(env, port, work)
    script = [_PRELUDE, *(f"{line}\n" for line in preset)]
    for n, cmd in enumerate(cmds):
        line = cmd.text
        if _SERVE.search(line):  # a server in the foreground: in the background, until the block ends
            line = f'{line} --port {port} --log-level warning >/dev/null 2>&1 & __docs_pids+=($!); __docs_wait_up {port}'
        script.append(f"printf '\\n@@docs-cmd {n}@@\\n'; printf '\\n@@docs-cmd {n}@@\\n' >&2\n{line}\n"
                      f"printf '\\n@@docs-rc {n} %s@@\\n' \"$?\"\n")
    try:
        done = subprocess.run(["bash", "-c", "".join(script)], cwd=work, env=env, capture_output=True,
                              text=True, timeout=300)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
    outs = _segments(done.stdout, rc=True)
    errs = _segments(done.stderr, rc=False)
    failures = []
    for n, cmd in enumerate(cmds):
        out, rc = outs.get(n, ("", None))
        err = errs.get(n, ("", None))[0]
        said = f"\n  $ {cmd.text}\n  stdout: {out[-1500:]!r}\n  stderr: {err[-1500:]!r}"
        if rc != cmd.exit_code:
            failures.append(f"{block.where}: exit {rc}, the doc expects {cmd.exit_code}:{said}")
            continue
        printed_lines = [line.split() for line in out.split("\n")]
        for words in label_lines(cmd.shown_lines):
            if words not in printed_lines:
                failures.append(f"{block.where}: the doc shows the line {' '.join(words)!r}, not printed:{said}")
        if cmd.shown_json is not None:
            try:
                actual = json.loads(out)
            except ValueError:
                failures.append(f"{block.where}: the doc shows JSON, the output is not:{said}")
                continue
            wrong = shape_mismatches(shown_shape(cmd.shown_json), actual)
            if wrong:
                failures.append(f"{block.where}: output differs from the doc's {cmd.shown_json}: {wrong}{said}")
    if block.output_header is not None:
        printed = " ".join(outs.get(len(cmds) - 1, ("", None))[0].split())
        missing = [w for w in block.output_header if w not in printed.split()]
        if missing:
            failures.append(f"{block.where}: the output the doc shows has {missing}, the command printed "
                            f"{printed[:500]!r}")
    return failures


def _segments(stream: str, *, rc: bool) -> dict[int, tuple[str, int | None]]:
    out: dict[int, tuple[str, int | None]] = {}
    for m in re.finditer(r"\n@@docs-cmd (\d+)@@\n(.*?)(?=\n@@docs-(?:cmd|rc) \d+|\Z)", stream, re.S):
        out[int(m.group(1))] = (m.group(2).strip("\n"), None)
    if rc:
        for m in re.finditer(r"\n@@docs-rc (\d+) (\d+)@@", stream):
            n = int(m.group(1))
            out[n] = (out.get(n, ("", None))[0], int(m.group(2)))
    return out


_RUN_TWICE = re.compile(r"^# (\S+\.py) — run with `python \1 (\S+)`, produce more, then `\.\.\. (\S+)`")
_ASSERTED = re.compile(r"^\s*# ([\w.]+) == (\"[^\"]*\")")


def run_python(docs: Docs, block: Block, dsn: str, work: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQueryManager
    from pyspark.sql.types import StringType, StructField, StructType, TimestampType

    from offset_ledger import OffsetLedgerListener, start_from_ledger

    source = docs.substitute(block.text, dsn, work, "http://127.0.0.1:9")
    for key, value in docs.environment(dsn).items():
        if key.startswith("OFFSET_LEDGER_"):
            monkeypatch.setenv(key, value)
    for key in [k for k in os.environ if k.startswith("OFFSET_LEDGER_API")]:
        monkeypatch.delenv(key)
    listeners: list[Any] = []
    add = StreamingQueryManager.addListener

    def add_listener(self: Any, listener: Any) -> None:
        listeners.append((self, listener))
        add(self, listener)

    monkeypatch.setattr(StreamingQueryManager, "addListener", add_listener)
    monkeypatch.setattr(SparkSession, "stop", lambda self: None)  # the session is the whole run's
    spark = docs.spark
    m = _RUN_TWICE.match(source)
    runs = [[f"{m.group(1)}", m.group(2)], [m.group(1), m.group(3)]] if m else [["docs-example"]]
    failures: list[str] = []
    code = compile(source, block.where, "exec")
    printed = ""
    for k, argv in enumerate(runs):
        if k:
            docs.kafka.produce("orders", [f"more-{i}" for i in range(10)])
        namespace: dict[str, Any] = {
            "__name__": "__main__", "spark": spark, "DSN": dsn, "BOOTSTRAP": docs.stack.bootstrap_servers,
            "TOPIC": "orders", "start_from_ledger": start_from_ledger, "OffsetLedgerListener": OffsetLedgerListener,
            "schema": StructType([StructField("event_time", TimestampType()), StructField("user", StringType())]),
        }
        monkeypatch.setattr(sys, "argv", argv)
        buf = io.StringIO()
        try:
            with contextlib.redirect_stdout(buf):
                exec(code, namespace)  # noqa: S102 - the documentation's own example
                for query in spark.streams.active:
                    query.processAllAvailable()  # raises when the example's query failed
        except Exception as exc:  # noqa: BLE001 - reported with the block's place
            failures.append(f"{block.where} (argv {argv[1:]}): {type(exc).__name__}: {exc}\n{buf.getvalue()[-2000:]}")
        finally:
            for query in spark.streams.active:
                query.stop()
            for manager, listener in listeners:
                with contextlib.suppress(Exception):  # noqa: BLE001 - already removed by the example
                    manager.removeListener(listener)
                with contextlib.suppress(Exception):  # noqa: BLE001
                    listener.close()
            listeners.clear()
        printed = buf.getvalue()
        sys.stdout.write(printed)
        for label in top_level_print_labels(source):
            if label not in printed:
                failures.append(f"{block.where} (argv {argv[1:]}): printed no {label!r} line:\n{printed[-2000:]}")
        for line in source.split("\n"):
            if (a := _ASSERTED.match(line)) is not None and k == 0:
                name, *attrs = a.group(1).split(".")
                value: Any = namespace.get(name)
                for attr in attrs:
                    value = getattr(value, attr, None)
                if value != json.loads(a.group(2)):
                    failures.append(f"{block.where}: {a.group(1)} is {value!r}, the doc says {a.group(2)}")
    if m and not failures:
        # The restart example as the README promises it: the upgrade restarts on a fresh
        # checkpoint, and the ledger ends where the topic ends.
        if "(fresh)" not in printed:
            failures.append(f"{block.where}: the {runs[1][1]} run did not start a fresh checkpoint:\n{printed}")
        from offset_ledger.ledger.engine import make_engine
        from offset_ledger.ledger.tables import positions

        engine = make_engine(dsn)
        try:
            with engine.connect() as conn:
                got = {r.partition: r.next_offset for r in conn.execute(
                    select(positions).where(positions.c.pipeline == "orders"))}
        finally:
            engine.dispose()
        if got != docs.kafka.end_offsets("orders"):
            failures.append(f"{block.where}: positions {got} != the topic's ends {docs.kafka.end_offsets('orders')}")
    return failures


@pytest.fixture
def docs(stack: devstack.StackInfo, kafka_session: KafkaHelper, spark: Any, tmp_path: Path) -> Iterator[Docs]:
    d = Docs(stack, kafka_session, spark, tmp_path)
    kafka_session.create_topic(partitions=2, name="orders")
    kafka_session.created.remove("orders")
    d.topics.append("orders")
    for p in (0, 1):
        kafka_session.produce("orders", [f"r{p}-{i}" for i in range(RECORDS)], partition=p)
    try:
        yield d
    finally:
        d.close()


def test_markers_are_well_formed() -> None:
    blocks = all_blocks()
    assert not [(b.where, b.bad_markers) for b in blocks if b.bad_markers]
    skipped = [b for b in blocks if b.skip is not None]
    assert all(b.skip for b in skipped), [b.where for b in skipped if not b.skip]  # a reason each
    assert len(skipped) <= MAX_SKIPPED, [b.where for b in skipped]
    setups = {b.setup for b in blocks if b.kind and b.skip is None}
    assert setups <= {n.removeprefix("setup_") for n in dir(Docs) if n.startswith("setup_")}


@pytest.mark.long  # ~50 s: every block against the real stack; ./scripts/test --long and CI run it
def test_every_doc_example_runs(docs: Docs, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    blocks = [b for b in all_blocks() if b.kind and b.skip is None]
    seen: set[str] = set()
    carried: dict[Path, list[str]] = {}
    failures: list[str] = []
    timings: list[tuple[float, str]] = []
    for block in blocks:
        if block.text in seen:
            continue  # the same example twice (README and restart.md): it ran once
        seen.add(block.text)
        work = docs.work / block.path.stem
        (work / "etc" / "offset-ledger").mkdir(parents=True, exist_ok=True)
        dsn = docs.fresh_dsn()
        setup: Callable[[str, Path], None] = getattr(docs, f"setup_{block.setup}")
        t0 = time.monotonic()
        setup(dsn, work)
        if block.kind == "shell":
            failures += run_shell(docs, block, dsn, work, carried.setdefault(block.path, []))
        else:
            with monkeypatch.context() as mp:
                failures += run_python(docs, block, dsn, work, mp)
        timings.append((time.monotonic() - t0, block.where))
    with capsys.disabled():
        print("\ndocs examples, slowest:", ", ".join(f"{w} {s:.1f}s" for s, w in sorted(timings)[::-1][:5]))
    assert len(seen) >= 15  # the parser still finds the examples
    assert not failures, "\n\n".join(failures)
