"""The stack's artifacts from Maven Central: the Kafka broker and tools, Spark's Kafka connector for the installed PySpark."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

from offset_ledger.devstack.processes import StackError, cache_dir, say
from offset_ledger.errors import ConfigError, install_hint
from offset_ledger.rules.spark_connector import connector_coordinates as coordinates

KAFKA_VERSION = "4.1.1"  # the default broker; OFFSET_LEDGER_KAFKA_VERSION picks another


_MAVEN_DIR = Path(__file__).resolve().parent / "maven"


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
    say(f"resolving {project} from Maven Central into {dest} (first run only)")
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


def kafka_mirror_jars() -> Path:
    """MirrorMaker 2 and its Connect runtime (the broker's Kafka version), resolved once and cached."""
    version = kafka_version()
    return _maven_copy("kafka-mirror", cache_dir() / f"kafka-mirror-{version}", {"kafka.version": version})


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
        raise StackError(f"PySpark is not installed; {install_hint('spark')} "
                         "(the connector is resolved for the installed version)")
    return version, Path(list(spec.submodule_search_locations)[0]) / "jars"


def connector_coordinates(pyspark_version: str) -> tuple[str, str]:
    """(artifactId, version) of Spark's Kafka connector for a PySpark version (``rules.spark_connector``,
    the rule ``offset_ledger.spark_packages()`` uses too); StackError when there is none."""
    try:
        return coordinates(pyspark_version)
    except ConfigError as exc:
        raise StackError(exc.message) from None


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


#: Apache Iceberg's Spark runtime for the Iceberg sink's long test: the newest release Maven Central
#: serves here for a Spark line the compatibility matrix has (iceberg-spark-runtime-4.1_2.13 1.12.0;
#: Iceberg builds no runtime for Spark 4.2 yet).
ICEBERG_VERSION = "1.12.0"
ICEBERG_SPARK = "4.1"


def iceberg_spark_jars(spark_line: str = ICEBERG_SPARK, version: str = ICEBERG_VERSION) -> list[Path]:
    """Iceberg's shaded Spark runtime jar for ``spark.jars`` (resolved once and cached)."""
    artifact = f"iceberg-spark-runtime-{spark_line}_2.13"
    dest = _maven_copy("iceberg-spark", cache_dir() / f"{artifact}-{version}",
                       {"iceberg.version": version, "iceberg.artifact": artifact})
    return sorted(dest.glob("*.jar"))


def fetch() -> None:
    """Resolve every Maven artifact the stack needs (idempotent)."""
    kafka_broker_jars()
    kafka_tools_jars()
    # Only the long failover tests start MirrorMaker 2, but resolving it mid-test (a Connect
    # runtime's closure, once per Kafka version) would eat the test's time budget.
    kafka_mirror_jars()
    jars = spark_kafka_jars()
    say("spark.jars = " + spark_jars_option(jars))


def spark_jars_option(jars: list[Path] | None = None) -> str:
    """The comma-separated ``spark.jars`` value for the installed PySpark's connector."""
    return ",".join(str(j) for j in (jars if jars is not None else spark_kafka_jars()))
