"""The local stack's Apache Kafka broker: a single-node KRaft server from the official artifacts, with a plain and a SASL listener."""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from offset_ledger.devstack.artifacts import kafka_broker_jars
from offset_ledger.devstack.processes import StackError, free_port, stop_pid, wait_port

# The broker's second listener, SASL_PLAINTEXT with PLAIN, accepts this user (tests of secured clusters).
SASL_MECHANISM = "PLAIN"


SASL_USERNAME = "etl"


SASL_PASSWORD = "etl-secret"


def sasl_client_properties(username: str = SASL_USERNAME, password: str = SASL_PASSWORD) -> dict[str, str]:
    """Java client properties that log in on the stack's SASL listener (a --command-config file's lines)."""
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": SASL_MECHANISM,
        "sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required '
                            f'username="{username}" password="{password}";',
    }


# XML, not YAML: log4j2 parses XML with the JDK alone, while YAML needs jackson-dataformat-yaml,
# which Kafka 4.x brings along and 3.x does not.
LOG4J2 = """\
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


def raise_fd_limit() -> None:
    """A broker holds several descriptors per partition; lift the soft limit to the hard one."""
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def start_kafka(root: Path) -> tuple[str, str, int]:
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
            # Retention runs every second (default: every 5 minutes), so a test topic with a short
            # retention.ms loses its old segments within seconds (tests of the retention headroom).
            "log.retention.check.interval.ms=1000",
            "",
        ])
    )
    (root / "log4j2.xml").write_text(LOG4J2)
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
        stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=raise_fd_limit,
    )
    (root / "kafka.pid").write_text(str(proc.pid))
    try:
        wait_port(port, 90, "Kafka broker", alive=lambda: proc.poll() is None)
        _wait_kafka_ready(f"127.0.0.1:{port}")
    except Exception:
        stop_pid(proc.pid, 10)
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
