"""A second Kafka cluster and MirrorMaker 2 for the failover tests: started on demand, stopped by pid.

The backup cluster is another single-node KRaft broker (``broker.start_kafka`` with its own
directory and ports, the same Kafka version). MirrorMaker 2 runs in dedicated mode: Apache Kafka's
own ``org.apache.kafka.connect.mirror.MirrorMaker`` (what ``connect-mirror-maker.sh`` starts), from
``org.apache.kafka:connect-mirror`` resolved through Maven like the broker. Nothing of this is in
every stack: MM2 is a Connect worker with three connectors and costs CPU on a 2-core machine.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from offset_ledger.devstack.artifacts import kafka_mirror_jars
from offset_ledger.devstack.broker import LOG4J2, raise_fd_limit, start_kafka
from offset_ledger.devstack.processes import (
    StackError,
    pid_alive,
    stop_pid,
)

__all__ = ["Broker", "MirrorMaker", "kafka_mirror_jars", "start_broker", "start_mirror_maker"]


@dataclass(frozen=True)
class Broker:
    """A broker this process started: where it listens, its pid and directory."""

    bootstrap_servers: str
    pid: int
    root: Path

    def stop(self, timeout: float = 30.0) -> None:
        stop_pid(self.pid, timeout)


def start_broker(root: Path) -> Broker:
    """Another single-node KRaft broker under ``root`` (own ports, data and log)."""
    bootstrap, _sasl, pid = start_kafka(root)
    return Broker(bootstrap, pid, root)


# Short intervals so a test sees replication, offset syncs and checkpoints within seconds (the
# defaults are 60 s and 10 min). offset.lag.max=0 asks the source task for an offset sync on every
# record it can, which makes the translation as tight as MM2 allows.
FAST_MM2: Mapping[str, str] = {
    "emit.checkpoints.interval.seconds": "1",
    "emit.heartbeats.interval.seconds": "1",
    "sync.group.offsets.enabled": "false",
    "sync.group.offsets.interval.seconds": "1",
    "refresh.topics.interval.seconds": "1",
    "refresh.groups.interval.seconds": "1",
    "offset.lag.max": "0",
    "sync.topic.configs.enabled": "false",
    "sync.topic.acls.enabled": "false",
}


@dataclass(frozen=True)
class MirrorMaker:
    """A dedicated-mode MirrorMaker 2 process this process started."""

    pid: int
    root: Path
    source_alias: str
    target_alias: str

    def stop(self, timeout: float = 30.0) -> None:
        stop_pid(self.pid, timeout)

    def alive(self) -> bool:
        return pid_alive(self.pid)

    def log_tail(self, chars: int = 3000) -> str:
        path = self.root / "mm2.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def start_mirror_maker(root: Path, *, source: str, target: str, source_alias: str = "primary",
                       target_alias: str = "backup", topics: str = ".*", groups: str = ".*",
                       extra: Mapping[str, str] | None = None) -> MirrorMaker:
    """MirrorMaker 2 (dedicated mode) replicating ``source_alias -> target_alias`` only.

    Single-broker clusters: every internal topic gets replication factor 1. The offset-syncs topic
    is kept on the target (``offset-syncs.topic.location=target``), so the backup holds everything
    a failover reads even when the primary is gone.
    """
    if shutil.which("java") is None:
        raise StackError("java is not on PATH; MirrorMaker 2 needs Java 17+")
    jars = kafka_mirror_jars()
    root.mkdir(parents=True, exist_ok=True)
    flow = f"{source_alias}->{target_alias}"
    lines = {
        "clusters": f"{source_alias}, {target_alias}",
        f"{source_alias}.bootstrap.servers": source,
        f"{target_alias}.bootstrap.servers": target,
        f"{flow}.enabled": "true",
        f"{target_alias}->{source_alias}.enabled": "false",
        f"{flow}.topics": topics,
        f"{flow}.groups": groups,
        "replication.factor": "1",
        "checkpoints.topic.replication.factor": "1",
        "heartbeats.topic.replication.factor": "1",
        "offset-syncs.topic.replication.factor": "1",
        "offset-syncs.topic.location": "target",
        "offset.storage.replication.factor": "1",
        "status.storage.replication.factor": "1",
        "config.storage.replication.factor": "1",
        "tasks.max": "1",
        **FAST_MM2,
        **dict(extra or {}),
    }
    props = root / "mm2.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
    # MM2's own decisions (which groups it checkpoints, what it translates) at INFO: the log is the
    # only way to see why a checkpoint did not come.
    (root / "log4j2.xml").write_text(LOG4J2.replace(
        '<Logger name="org.apache.kafka" level="WARN"/>',
        '<Logger name="org.apache.kafka" level="WARN"/>\n    <Logger name="org.apache.kafka.connect.mirror" level="INFO"/>'))
    log = open(root / "mm2.log", "ab")
    proc = subprocess.Popen(
        ["java", "-Xms128m", "-Xmx512m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
         f"-Dlog4j2.configurationFile={root / 'log4j2.xml'}", "-cp", f"{jars}/*",
         # The properties file first: --clusters takes one or more names and would swallow it.
         "org.apache.kafka.connect.mirror.MirrorMaker", str(props), "--clusters", target_alias],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=raise_fd_limit)
    (root / "mm2.pid").write_text(str(proc.pid))
    time.sleep(1.0)
    if proc.poll() is not None:
        tail = (root / "mm2.log").read_text(errors="replace")[-2000:]
        raise StackError(f"MirrorMaker 2 exited during start-up:\n{tail}")
    return MirrorMaker(proc.pid, root, source_alias, target_alias)
