"""The demo's stage: the local stack, the topic, Spark, the REST API, the producer, and undoing all of
it by pid on exit, Ctrl-C or SIGTERM. The story told on this stage is ``offset_ledger.cli.demo``.

``DemoStack`` is the base of ``offset_ledger.cli.demo.Demo``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from offset_ledger import devstack

PIPELINE = "demo_orders"
TOPIC = "demo_orders"
FIRST_PARTITIONS = 2
ALL_PARTITIONS = 4


@dataclass
class Options:
    """Command-line choices."""

    keep_serving: bool = False
    postgres: bool = False
    rate: int = 200          # records per second while version 1 runs
    v1_seconds: float = 20.0
    more_records: int = 2000  # produced after the partitions were added
    serve_seconds: float = 3.0
    workdir: Path | None = None
    #: Leave the ledger, Kafka and the API running at the end (``make demo-down`` stops them), in
    #: ``workdir`` or ``./.demo``; False: stop everything and delete the work dir (``--clean``).
    leave_up: bool = True
    down: bool = False  # stop a demo left up instead of running one


#: Where a demo left up keeps its state (relative to the checkout: scripts/demo runs from there).
DEMO_DIR = Path(".demo")
#: What a demo left up wrote for ``demo --down`` (and for people): the ledger, the API, the pids.
STATE_FILE = "demo.json"


@dataclass
class Producer:
    """A background producer writing unique values ``order-0000001, ...`` round-robin over partitions."""

    bootstrap_servers: str
    topic: str
    rate: int
    produced: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _client(self):  # type: ignore[no-untyped-def]
        from kafka import KafkaProducer

        return KafkaProducer(bootstrap_servers=self.bootstrap_servers, acks="all", linger_ms=5)

    def _send(self, producer, count: int) -> None:  # type: ignore[no-untyped-def]
        partitions = sorted(producer.partitions_for(self.topic) or [0])
        for _ in range(count):
            self.produced += 1
            producer.send(self.topic, value=f"order-{self.produced:07d}".encode(),
                          partition=partitions[self.produced % len(partitions)])

    def start(self) -> None:
        """Produce ``rate`` records per second until stop()."""
        def run() -> None:
            producer = self._client()
            try:
                while not self._stop.is_set():
                    tick = time.monotonic()
                    self._send(producer, max(1, self.rate // 10))
                    producer.flush()
                    self._stop.wait(max(0.0, 0.1 - (time.monotonic() - tick)))
            finally:
                producer.close()

        self._thread = threading.Thread(target=run, name="demo-producer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None

    def burst(self, count: int) -> None:
        """Produce ``count`` records now over every current partition (fresh metadata)."""
        producer = self._client()
        try:
            self._send(producer, count)
            producer.flush()
        finally:
            producer.close()


def _free_port(preferred: int) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])


class Signals:
    """Ctrl-C and SIGTERM unwind like KeyboardInterrupt so ``finally`` stops what the demo started.

    While a child process is being launched (the broker, Spark's JVM) the interrupt is held back
    until the launch returns: interrupted half-way, the child would run on with no one to stop it.
    """

    def __init__(self) -> None:
        self._deferring = 0
        self._pending: int | None = None

    def _handle(self, signum: int, _frame: Any) -> None:
        if self._deferring:
            self._pending = signum
            return
        raise KeyboardInterrupt(f"signal {signum}")

    @contextmanager
    def installed(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def hold(self) -> None:
        """From now on signals are noted and dropped: cleanup is under way and must finish."""
        self._deferring += 1

    @contextmanager
    def deferred(self) -> Iterator[None]:
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
        if not self._deferring and self._pending is not None:
            signum, self._pending = self._pending, None
            raise KeyboardInterrupt(f"signal {signum}")


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the API server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"the API server did not answer {url} within {timeout:.0f}s")


def _stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class DemoStack:
    """The stage of one demo run: what it started, and ``cleanup``, what to undo, newest first."""

    def __init__(self, options: Options, console: Console, signals: Signals | None = None) -> None:
        self.o = options
        self.signals = signals or Signals()
        self.console = console
        self.cleanup: list[tuple[str, Callable[[], None]]] = []
        #: cleanups skipped when the demo ends well with ``leave_up``: what the operator explores
        self.left_up: set[str] = set()
        if options.leave_up and options.workdir is None:
            options.workdir = DEMO_DIR.resolve()
        self.root = Path(options.workdir or tempfile.mkdtemp(prefix="offset-ledger-demo-")).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.dsn = ""
        self.bootstrap = ""
        self.spark: Any = None

    def say(self, text: str) -> None:
        self.console.print(text)

    def step(self, title: str) -> None:
        self.console.rule(f"[bold cyan]{title}")

    def on_exit(self, what: str, fn: Callable[[], None], *, left_up: bool = False) -> None:
        """Undo ``what`` on exit; ``left_up``: not when the demo ends well and leaves things up."""
        self.cleanup.append((what, fn))
        if left_up and self.o.leave_up:
            self.left_up.add(what)

    def close(self, *, leave_up: bool = False) -> None:
        self.signals.hold()
        for what, fn in reversed(self.cleanup):
            if leave_up and what in self.left_up:
                continue
            try:
                self.console.print(f"[dim]cleanup: {what}")
                fn()
            except BaseException as exc:  # noqa: BLE001 - keep cleaning up whatever happens
                self.console.print(f"[yellow]cleanup of {what} failed: {exc}")
        self.cleanup.clear()

    def start_stack(self) -> None:
        self.step("1. Local stack")
        stack_root = self.root / "stack"
        self.on_exit(f"local stack in {stack_root}", lambda: devstack.down(stack_root), left_up=True)
        with self.signals.deferred(), self.console.status("starting Apache Kafka (KRaft)"
                                 + (" and PostgreSQL" if self.o.postgres else "") + " ..."):
            info = devstack.up(stack_root, with_postgres=self.o.postgres)
        self.bootstrap = info.bootstrap_servers
        self.spark_jars = info.spark_jars
        if self.o.postgres:
            self.dsn = info.postgres_dsn
            ledger = f"PostgreSQL (pid {info.postgres_pid}) {self.dsn}"
        else:
            self.dsn = f"sqlite:///{self.root / 'ledger.db'}"
            ledger = f"the embedded default, a SQLite file: {self.root / 'ledger.db'} (--postgres for PostgreSQL)"
        table = Table(show_header=False, box=None)
        table.add_row("Kafka", f"Apache Kafka {devstack.KAFKA_VERSION}, KRaft, pid {info.kafka_pid}, {self.bootstrap}")
        table.add_row("Ledger", ledger)
        table.add_row("Work dir", str(self.root))
        self.console.print(table)

    def create_topic(self) -> None:
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=30000)
        self.on_exit("Kafka admin client", admin.close)
        admin.create_topics([NewTopic(TOPIC, num_partitions=FIRST_PARTITIONS, replication_factor=1)])
        self.admin = admin
        self._wait_partitions(FIRST_PARTITIONS)
        self.say(f"created topic [bold]{TOPIC}[/] with {FIRST_PARTITIONS} partitions")

    def _wait_partitions(self, count: int) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            described = self.admin.describe_topics([TOPIC])
            if described and len(described[0].get("partitions", [])) >= count:
                return
            time.sleep(0.2)
        raise RuntimeError(f"topic {TOPIC} did not reach {count} partitions")

    def start_spark(self) -> None:
        from pyspark.sql import SparkSession

        with self.signals.deferred(), \
                self.console.status("starting Spark (local[2]) with the official Kafka connector ..."):
            self.spark = (
                SparkSession.builder.master("local[2]").appName("offset-ledger-demo")
                .config("spark.jars", self.spark_jars)
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.sql.shuffle.partitions", "2")
                .config("spark.sql.warehouse.dir", str(self.root / "warehouse"))
                .config("spark.driver.extraJavaOptions",
                        f"-Dderby.system.home={self.root} -Dlog4j2.configurationFile={self._log4j2()}")
                .getOrCreate()
            )
            self.on_exit("Spark session", self.spark.stop)
            self.spark.sparkContext.setLogLevel("ERROR")
        import pyspark

        self.say(f"Spark {pyspark.__version__} local[2], connector jars from Maven Central")

    def _log4j2(self) -> Path:
        """Spark's log configuration for the demo: errors only, minus the stop-time chatter.

        Stopping a streaming query interrupts its running batch; Spark then logs the aborted write
        at ERROR with a stack trace although nothing failed (the batch is not committed and the
        restart reads it again). Real failures still surface through ``query.exception()``.
        """
        path = self.root / "log4j2.properties"
        quiet = ["org.apache.spark.sql.execution.datasources.FileFormatWriter",
                 "org.apache.spark.util.Utils", "org.apache.spark.TaskContextImpl",
                 "org.apache.hadoop.util.NativeCodeLoader"]
        lines = [
            "rootLogger.level = error", "rootLogger.appenderRef.stderr.ref = console",
            "appender.console.type = Console", "appender.console.name = console",
            "appender.console.target = SYSTEM_ERR", "appender.console.layout.type = PatternLayout",
            "appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n",
        ]
        for i, name in enumerate(quiet):
            lines += [f"logger.q{i}.name = {name}", f"logger.q{i}.level = off"]
        path.write_text("\n".join(lines) + "\n")
        return path

    def serve(self) -> None:
        self.step("6. The REST API over the same ledger")
        port = _free_port(9090)
        env = {**os.environ, "OFFSET_LEDGER_DSN": self.dsn, "OFFSET_LEDGER_BOOTSTRAP_SERVERS": self.bootstrap}
        env.pop("OFFSET_LEDGER_API_TOKEN", None)  # loopback only, no token: easy to try
        cmd = [sys.executable, "-c", "from offset_ledger.cli.main import main; main()",
               "serve", "--port", str(port), "--log-level", "warning"]
        log = open(self.root / "serve.log", "ab")  # noqa: SIM115 - the server's, for as long as it runs
        with self.signals.deferred():
            # Its own session: left up, it outlives the demo (and a Ctrl-C in this terminal).
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    start_new_session=self.o.leave_up)
            self.on_exit(f"API server (pid {proc.pid})", lambda: _stop_process(proc), left_up=True)
        log.close()
        base = f"http://127.0.0.1:{port}"
        _wait_http(f"{base}/healthz", proc)
        self.server = {"pid": proc.pid, "cmdline": cmd, "url": base}
        self.say(f"offset-ledger serve: {base} (pid {proc.pid})")
        self.say(f"[bold]web console: {base}/")
        self.say("try:")
        for line in (
            f"curl -s '{base}/v1/getCurrentOffsets/?pipelineName={PIPELINE}'",
            f"curl -s '{base}/v1/getTopicDetails/?topicName={TOPIC}'",
            f"curl -s '{base}/api/v1/pipelines'",
            f"curl -s '{base}/api/v1/pipelines/{PIPELINE}/history?limit=5'",
            f"curl -s '{base}/api/v1/pipelines/{PIPELINE}/lag'",
            f"curl -s '{base}/metrics'",
            f"open {base}/pipelines/{PIPELINE}",
            f"open {base}/docs",
        ):
            self.console.print(f"  [green]{line}", soft_wrap=True, highlight=False)
        url = f"{base}/v1/getCurrentOffsets/?pipelineName={PIPELINE}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read().decode()
        self.say(f"GET {url}\n  -> {response.status} {body}")
        if self.o.leave_up:
            return
        if self.o.keep_serving:
            self.say("[bold]serving until Ctrl-C ...")
            try:
                while proc.poll() is None:
                    time.sleep(0.5)
            except KeyboardInterrupt:  # the expected way to end --keep-serving
                self.say("stopping the API")
        else:
            time.sleep(self.o.serve_seconds)

    def leave(self, ok: bool) -> None:
        """What a demo left up tells the operator: where it is, three commands to explore it, how to stop it."""
        import json

        cli = Path(sys.executable).with_name("offset-ledger")
        state = {"dsn": self.dsn, "bootstrapServers": self.bootstrap, "console": self.server["url"] + "/",
                 "serverPid": self.server["pid"], "serverCmdline": self.server["cmdline"],
                 "stack": str(self.root / "stack"), "workdir": str(self.root), "ok": ok}
        (self.root / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
        self.step("7. Left up for you to explore")
        self.say(f"the ledger ({self.dsn}), Kafka ({self.bootstrap}) and the API ({self.server['url']}, no token "
                 "needed: it listens on loopback only) are still running. Try:")
        for line in explore_commands(str(cli) if cli.exists() else "offset-ledger", self.dsn, self.bootstrap,
                                     self.server["url"]):
            self.console.print(f"  [green]{line}", soft_wrap=True, highlight=False)
        self.say("stop everything and delete the work dir: [bold]make demo-down[/] "
                 f"(or {sys.executable} -m offset_ledger.cli.demo --down)")


def explore_commands(cli: str, dsn: str, bootstrap: str, url: str) -> list[str]:
    """The three commands a demo left up prints: the pipelines, the upgrade's history, the console."""
    return [
        f"{cli} pipelines --dsn {dsn} --bootstrap-server {bootstrap}",
        f"{cli} verify {PIPELINE} --dsn {dsn} --bootstrap-server {bootstrap}",
        f"open {url}/pipelines/{PIPELINE}    # the web console (curl {url}/api/v1/pipelines)",
    ]


def down(workdir: Path | None = None) -> str:
    """Stop a demo left up (its API server, by the pid and command line it recorded, and its stack)
    and delete its work dir; what was done, for people."""
    import json
    import shutil

    root = (workdir or DEMO_DIR).resolve()
    state_file = root / STATE_FILE
    if not state_file.is_file():
        return f"no demo left up in {root}"
    state = json.loads(state_file.read_text())
    pid = int(state["serverPid"])
    if _cmdline(pid) == state["serverCmdline"]:  # never a pid reused by someone else's process
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while _cmdline(pid) == state["serverCmdline"] and time.monotonic() < deadline:
            time.sleep(0.1)
    devstack.down(Path(state["stack"]))
    shutil.rmtree(root, ignore_errors=True)
    return f"stopped the demo's API (pid {pid}) and stack, deleted {root}"


def _cmdline(pid: int) -> list[str] | None:
    """The command line of process ``pid`` (Linux /proc), None when it is gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode() for part in raw.split(b"\0")[:-1]] or None
