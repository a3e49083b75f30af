"""Pure: which Spark Kafka connector goes with a PySpark version (the quick start's
``offset_ledger.spark_packages()`` and devstack's Maven fetch both ask here)."""

from __future__ import annotations

from offset_ledger.errors import ConfigError


def connector_coordinates(pyspark_version: str) -> tuple[str, str]:
    """(artifactId, version) of Spark's Kafka connector for a PySpark version.

    PySpark 3.5 is built for Scala 2.12 and 4.x for 2.13 only; the connector must equal PySpark's
    own version (a ``.devN``/``rcN`` suffix is not on Maven Central). ConfigError otherwise.
    """
    parts = pyspark_version.split(".")
    if len(parts) != 3 or not all(x.isdigit() for x in parts):
        raise ConfigError(f"no released connector for PySpark {pyspark_version!r} (need a release such as 4.2.0)")
    major, minor = int(parts[0]), int(parts[1])
    if (major, minor) < (3, 5) or major >= 5:
        raise ConfigError(f"PySpark {pyspark_version} is outside the supported range (3.5 to 4.x)")
    scala = "2.12" if major == 3 else "2.13"
    return f"spark-sql-kafka-0-10_{scala}", pyspark_version


def package_coordinate(pyspark_version: str) -> str:
    """``org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0``: the ``spark.jars.packages`` value."""
    artifact, version = connector_coordinates(pyspark_version)
    return f"org.apache.spark:{artifact}:{version}"
