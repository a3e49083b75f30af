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

import base64
import importlib.metadata
import importlib.util
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

KAFKA_VERSION = "4.1.1"  # the default broker; OFFSET_LEDGER_KAFKA_VERSION picks another
# The broker's second listener, SASL_PLAINTEXT with PLAIN, accepts this user (tests of secured clusters).
SASL_MECHANISM = "PLAIN"
SASL_USERNAME = "etl"
SASL_PASSWORD = "etl-secret"
_MAVEN_DIR = Path(__file__).resolve().parent / "maven"


class StackError(RuntimeError):
    """A service of the local stack could not be resolved, started or reached."""


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


def sasl_client_properties(username: str = SASL_USERNAME, password: str = SASL_PASSWORD) -> dict[str, str]:
    """Java client properties that log in on the stack's SASL listener (a --command-config file's lines)."""
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": SASL_MECHANISM,
        "sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required '
                            f'username="{username}" password="{password}";',
    }


def cache_dir() -> Path:
    return Path(os.environ.get("OFFSET_LEDGER_CACHE", Path.home() / ".cache" / "offset-ledger"))


def stack_dir() -> Path:
    return Path(os.environ.get("OFFSET_LEDGER_STACK_DIR", Path.cwd() / ".devstack")).resolve()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _log(msg: str) -> None:
    print(f"[devstack] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- Maven artifacts


def _maven_copy(project: str, dest: Path, properties: dict[str, str] | None = None) -> Path:
    """Copy a pom's runtime dependency closure into ``dest`` once; later calls reuse it.

    ``properties`` override the pom's own (``-Dname=value`` wins over ``<properties>``), which is
    how one pom serves every Kafka and Spark version.
    """
    marker = dest / ".complete"
    if marker.exists():
        return dest
    if shutil.which("mvn") is None:
        raise StackError("Maven (mvn) is not on PATH; it resolves the Kafka and Spark artifacts")
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    _log(f"resolving {project} from Maven Central into {dest} (first run only)")
    cmd = [
        "mvn", "-q", "-B", "-gs", str(_MAVEN_DIR / "settings.xml"), "-f", str(_MAVEN_DIR / project / "pom.xml"),
        "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={tmp}",
        *(f"-D{k}={v}" for k, v in (properties or {}).items()),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise StackError(f"mvn failed for {project}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    marker.touch()
    return dest


def kafka_version() -> str:
    """The broker version the stack runs: ``OFFSET_LEDGER_KAFKA_VERSION``, else ``KAFKA_VERSION``."""
    version = os.environ.get("OFFSET_LEDGER_KAFKA_VERSION", "").strip() or KAFKA_VERSION
    parts = version.split(".")
    # 3.7 is the first broker whose single-node KRaft mode needs nothing the config below lacks.
    if len(parts) < 3 or not all(x.isdigit() for x in parts[:2]) or (int(parts[0]), int(parts[1])) < (3, 7):
        raise StackError(f"OFFSET_LEDGER_KAFKA_VERSION={version!r}: need a KRaft broker version, 3.7.0 or later")
    return version


def kafka_broker_jars() -> Path:
    version = kafka_version()
    return _maven_copy("kafka-broker", cache_dir() / f"kafka-broker-{version}", {"kafka.version": version})


def kafka_tools_jars() -> Path:
    """Kafka's command-line tools (kafka-consumer-groups.sh's ConsumerGroupCommand lives here since 4.x)."""
    return _maven_copy("kafka-tools", cache_dir() / f"kafka-tools-{KAFKA_VERSION}")


def consumer_groups_command(bootstrap_servers: str, *args: str, timeout: float = 120) -> str:
    """Run the broker distribution's own ``kafka-consumer-groups.sh`` class; its stdout."""
    jars = kafka_tools_jars()
    proc = subprocess.run(
        ["java", "-Xmx256m", "-cp", f"{jars}/*", "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
         "--bootstrap-server", bootstrap_servers, *args],
        capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise StackError(f"kafka-consumer-groups failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    return proc.stdout


def _pyspark_version_and_jars() -> tuple[str, Path]:
    """The installed PySpark's version and jars directory, without importing PySpark (or a JVM)."""
    try:
        version = importlib.metadata.version("pyspark")
        spec = importlib.util.find_spec("pyspark")
    except importlib.metadata.PackageNotFoundError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise StackError("PySpark is not installed; pip install 'offset-ledger[spark]' "
                         "(the connector is resolved for the installed version)")
    return version, Path(list(spec.submodule_search_locations)[0]) / "jars"


def connector_coordinates(pyspark_version: str) -> tuple[str, str]:
    """(artifactId, version) of Spark's Kafka connector for a PySpark version.

    PySpark 3.5 is built for Scala 2.12 and 4.x for 2.13 only; the connector must equal PySpark's
    own version (a ``.devN``/``rcN`` suffix is not on Maven Central).
    """
    parts = pyspark_version.split(".")
    if len(parts) != 3 or not all(x.isdigit() for x in parts):
        raise StackError(f"no released connector for PySpark {pyspark_version!r} (need a release such as 4.2.0)")
    major, minor = int(parts[0]), int(parts[1])
    if (major, minor) < (3, 5) or major >= 5:
        raise StackError(f"PySpark {pyspark_version} is outside the supported range (3.5 to 4.x)")
    scala = "2.12" if major == 3 else "2.13"
    return f"spark-sql-kafka-0-10_{scala}", pyspark_version


def _artifact_name(jar: str) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients`` (drop the version and suffix)."""
    stem = jar[:-4] if jar.endswith(".jar") else jar
    parts = stem.split("-")
    while parts and parts[-1][:1].isdigit():
        parts.pop()
    return "-".join(parts)


def spark_kafka_jars() -> list[Path]:
    """The connector jars for ``spark.jars``: the closure minus what PySpark already ships.

    Keeping a second scala-library or hadoop client on the classpath next to PySpark's own breaks
    Spark in ways that look unrelated, so anything PySpark has is left out (what ``--packages``
    achieves with its exclusion rules).
    """
    version, pyspark_jars = _pyspark_version_and_jars()
    artifact, connector_version = connector_coordinates(version)
    dest = _maven_copy("spark-kafka", cache_dir() / f"spark-sql-kafka-{connector_version}",
                       {"spark.version": connector_version, "connector.artifact": artifact})
    shipped = {_artifact_name(p.name) for p in pyspark_jars.glob("*.jar")}
    return sorted(p for p in dest.glob("*.jar") if _artifact_name(p.name) not in shipped)


def fetch() -> None:
    """Resolve every Maven artifact the stack needs (idempotent)."""
    kafka_broker_jars()
    kafka_tools_jars()
    jars = spark_kafka_jars()
    _log("spark.jars = " + spark_jars_option(jars))


def spark_jars_option(jars: list[Path] | None = None) -> str:
    """The comma-separated ``spark.jars`` value for the installed PySpark's connector."""
    return ",".join(str(j) for j in (jars if jars is not None else spark_kafka_jars()))


# --------------------------------------------------------------------------- processes


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def _wait_port(port: int, timeout: float, what: str, alive: Callable[[], bool] = lambda: True) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise StackError(f"{what} exited during start-up")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise StackError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:.0f}s")


def _stop_pid(pid: int, timeout: float = 30.0) -> None:
    """SIGTERM the process we started, wait, then SIGKILL: never by name."""
    if not _pid_alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- Postgres


def _pg_bindir() -> Path:
    for candidate in (shutil.which("pg_config"),):
        if candidate:
            out = subprocess.run([candidate, "--bindir"], capture_output=True, text=True)
            path = Path(out.stdout.strip())
            if (path / "initdb").exists():
                return path
    for path in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (path / "initdb").exists():
            return path
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    raise StackError("PostgreSQL server binaries (initdb, pg_ctl) not found; install postgresql")


def _as_pg_user(cmd: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root; the server package ships an unprivileged user.
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", "postgres", "--", *cmd]


class _Postgres:
    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def datadir(self) -> Path:
        return self.root / "pgdata"

    def start(self, port: int | None = None) -> tuple[str, int]:
        """Start (initdb on first use) on ``port``, default a free one; returns (dsn, pid)."""
        bindir = _pg_bindir()
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
            # The postgres user must be able to reach the data directory through its parents.
            for parent in self.root.parents:
                mode = parent.stat().st_mode
                if not mode & 0o001:
                    os.chmod(parent, mode | 0o001)
        if not (self.datadir / "PG_VERSION").exists():
            proc = subprocess.run(
                _as_pg_user([str(bindir / "initdb"), "-D", str(self.datadir), "-U", "postgres",
                             "-A", "trust", "-E", "UTF8", "--no-sync"]),
                capture_output=True, text=True,
            )
            if proc.returncode != 0:
                raise StackError(f"initdb failed: {proc.stderr.strip()[-2000:]}")
        port = port or free_port()
        opts = (f"-p {port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        # -W: we wait ourselves, for a real connection; pg_ctl's own wait reads the pid file and
        # was seen to time out on a busy machine although the server was accepting connections.
        proc = subprocess.run(
            _as_pg_user([str(bindir / "pg_ctl"), "-D", str(self.datadir), "-o", opts,
                         "-l", str(self.root / "postgres.log"), "-W", "start"]),
            capture_output=True, text=True,
        )
        if proc.returncode != 0 or not self._wait_ready(port, timeout=120):
            log = (self.root / "postgres.log")
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise StackError(f"PostgreSQL did not start: {proc.stderr.strip()} {tail}")
        pid = int((self.datadir / "postmaster.pid").read_text().split()[0])
        return f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres", pid

    @staticmethod
    def _wait_ready(port: int, timeout: float) -> bool:
        import psycopg2

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres",
                                 connect_timeout=2).close()
                return True
            except psycopg2.OperationalError:
                time.sleep(0.2)
        return False

    def stop(self) -> None:
        if not (self.datadir / "postmaster.pid").exists():
            return
        subprocess.run(
            _as_pg_user([str(_pg_bindir() / "pg_ctl"), "-D", str(self.datadir), "-m", "fast",
                         "-w", "-t", "60", "stop"]),
            capture_output=True, text=True,
        )


# --------------------------------------------------------------------------- Kafka


# XML, not YAML: log4j2 parses XML with the JDK alone, while YAML needs jackson-dataformat-yaml,
# which Kafka 4.x brings along and 3.x does not.
_LOG4J2 = """\
<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="warn">
  <Appenders>
    <Console name="STDOUT"><PatternLayout pattern="[%d] %p %m (%c)%n"/></Console>
  </Appenders>
  <Loggers>
    <Logger name="kafka" level="WARN"/>
    <Logger name="org.apache.kafka" level="WARN"/>
    <Root level="INFO"><AppenderRef ref="STDOUT"/></Root>
  </Loggers>
</Configuration>
"""


def _raise_fd_limit() -> None:
    """A broker holds several descriptors per partition; lift the soft limit to the hard one."""
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _start_kafka(root: Path) -> tuple[str, str, int]:
    if shutil.which("java") is None:
        raise StackError("java is not on PATH; the Kafka broker needs Java 17+")
    jars = kafka_broker_jars()
    root.mkdir(parents=True, exist_ok=True)
    port, controller_port, sasl_port = free_port(), free_port(), free_port()
    # Broker-side PLAIN users: the JAAS line lists user_<name>="<password>" entries.
    jaas = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
            f'password="admin-secret" user_admin="admin-secret" user_{SASL_USERNAME}="{SASL_PASSWORD}";')
    logs = root / "data"
    props = root / "server.properties"
    props.write_text(
        "\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sasl_port},"
            f"CONTROLLER://127.0.0.1:{controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
            f"sasl.enabled.mechanisms={SASL_MECHANISM}",
            f"listener.name.sasl_plaintext.plain.sasl.jaas.config={jaas}",
            f"log.dirs={logs}",
            "num.partitions=1",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=4",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=false",
            "delete.topic.enable=true",
            # Tests create and delete many small topics; keep the broker light on 2 cores.
            "num.network.threads=2",
            "num.io.threads=4",
            "log.segment.bytes=1048576",
            # Deleted partitions keep their files open for a minute by default; tests and
            # benchmarks that create and delete thousands of partitions would exhaust descriptors.
            "file.delete.delay.ms=1000",
            "",
        ])
    )
    (root / "log4j2.xml").write_text(_LOG4J2)
    java = ["java", "-Xms256m", "-Xmx768m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={root / 'log4j2.xml'}", "-cp", f"{jars}/*"]
    if not (logs / "meta.properties").exists():
        cluster_id = "-"
        while cluster_id.startswith("-"):
            # As Kafka's own Uuid.randomUuid(): an id starting with "-" reads as an option to
            # kafka-storage ("--cluster-id: expected one argument"), one start in 64.
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        fmt = subprocess.run(
            [*java, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props)],
            capture_output=True, text=True,
        )
        if fmt.returncode != 0:
            raise StackError(f"kafka storage format failed: {fmt.stdout[-1500:]}{fmt.stderr[-1500:]}")
    log = open(root / "kafka.log", "ab")
    proc = subprocess.Popen(
        [*java, "kafka.Kafka", str(props)], stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_raise_fd_limit,
    )
    (root / "kafka.pid").write_text(str(proc.pid))
    try:
        _wait_port(port, 90, "Kafka broker", alive=lambda: proc.poll() is None)
        _wait_kafka_ready(f"127.0.0.1:{port}")
    except Exception:
        _stop_pid(proc.pid, 10)
        raise
    return f"127.0.0.1:{port}", f"127.0.0.1:{sasl_port}", proc.pid


def _wait_kafka_ready(bootstrap: str, timeout: float = 60.0) -> None:
    """The port opens before the broker has a controller; wait until metadata answers."""
    from kafka import KafkaAdminClient

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
            try:
                admin.list_topics()
                if admin.describe_cluster().get("brokers"):
                    return
            finally:
                admin.close()
        except Exception as exc:  # noqa: BLE001 - any failure here means "not ready yet"
            last = exc
        time.sleep(0.5)
    raise StackError(f"Kafka broker at {bootstrap} did not become ready: {last}")


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
    if not alive or not all(_pid_alive(p) for p in alive):
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
        _log("starting PostgreSQL")
        dsn, pg_pid = _Postgres(root / "postgres").start()
    else:
        dsn = external_dsn or ""
    try:
        _log(f"starting Apache Kafka {kafka_version()} (KRaft, single node)")
        bootstrap, sasl_bootstrap, kafka_pid = _start_kafka(root / "kafka")
    except Exception:
        if pg_pid:
            _Postgres(root / "postgres").stop()
        raise
    info = StackInfo(bootstrap, dsn, jars, kafka_pid, pg_pid, sasl_bootstrap)
    _state_file(root).write_text(json.dumps(asdict(info), indent=2))
    (root / "stack.env").write_text("".join(f"export {k}='{v}'\n" for k, v in info.env().items()))
    _log(f"stack up in {time.monotonic() - started:.1f}s: kafka={bootstrap} (SASL {sasl_bootstrap}) "
         f"postgres={dsn}")
    return info


def down(root: Path | None = None) -> None:
    """Stop what ``up`` started (by the pids it recorded) and remove the stack's data."""
    root = root or stack_dir()
    if not root.exists():
        return
    pid_file = root / "kafka" / "kafka.pid"
    if pid_file.exists():
        _stop_pid(int(pid_file.read_text()))
        pid_file.unlink()
    _Postgres(root / "postgres").stop()
    shutil.rmtree(root, ignore_errors=True)
