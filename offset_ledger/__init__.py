"""offset-ledger: an external, auditable Kafka offset ledger for PySpark Structured Streaming."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from offset_ledger.errors import ConfigError, install_hint
from offset_ledger.rules.spark_connector import package_coordinate

__version__ = "0.1.0"

__all__ = [
    "OffsetLedgerListener",
    "Pipeline",
    "RestartPlan",
    "__version__",
    "failover",
    "replay_range",
    "spark_packages",
    "start_from_ledger",
]

if TYPE_CHECKING:
    from offset_ledger.capture.listener import OffsetLedgerListener
    from offset_ledger.operate.failover import failover
    from offset_ledger.operate.pipeline import Pipeline
    from offset_ledger.operate.replay import replay_range
    from offset_ledger.operate.restart import start_from_ledger
    from offset_ledger.rules.plan import RestartPlan

# Imported on first use so that `import offset_ledger` (and the CLI) does not pay for PySpark.
_LAZY = {
    "OffsetLedgerListener": "offset_ledger.capture.listener",
    "Pipeline": "offset_ledger.operate.pipeline",
    "RestartPlan": "offset_ledger.rules.plan",
    "failover": "offset_ledger.operate.failover",
    "replay_range": "offset_ledger.operate.replay",
    "start_from_ledger": "offset_ledger.operate.restart",
}


def spark_packages() -> str:
    """The ``spark.jars.packages`` value for the installed PySpark: Spark's Kafka connector
    (``org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0`` for PySpark 4.2.0), which Spark fetches from
    Maven Central on first use. Reads PySpark's version without importing it.

    ``SparkSession.builder.config("spark.jars.packages", offset_ledger.spark_packages())``.
    """
    import importlib.metadata

    try:
        version = importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(f"PySpark is not installed; {install_hint('spark')}") from None

    return package_coordinate(version)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'offset_ledger' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
