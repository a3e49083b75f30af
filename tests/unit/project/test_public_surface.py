"""The public surface is small and pinned: changing it is a deliberate act."""

from __future__ import annotations

import offset_ledger


def test_all_is_pinned() -> None:
    assert offset_ledger.__all__ == [
        "OffsetLedgerListener",
        "Pipeline",
        "RestartPlan",
        "__version__",
        "failover",
        "replay_range",
        "spark_packages",
        "start_from_ledger",
    ]


def test_every_public_name_resolves() -> None:
    for name in offset_ledger.__all__:
        assert getattr(offset_ledger, name) is not None


def test_importing_the_package_does_not_import_pyspark() -> None:
    import subprocess
    import sys

    code = "import offset_ledger, sys; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_pipeline_surface_does_not_import_pyspark_either() -> None:
    import subprocess
    import sys

    code = ("import offset_ledger, sys; p = offset_ledger.Pipeline('orders', topics=['orders']); "
            "print('pyspark' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_sinks_are_pinned() -> None:
    import offset_ledger.sinks

    assert offset_ledger.sinks.__all__ == ["DeltaSink", "IcebergSink", "KafkaSink", "PostgresSink", "Sink"]
    for name in offset_ledger.sinks.__all__:
        assert getattr(offset_ledger.sinks, name).__name__ == name


def test_spark_packages_names_the_connector_of_the_installed_pyspark() -> None:
    """The quick start's Spark setting (issue 50, item 2): the connector devstack fetches for the tests."""
    import importlib.metadata

    from offset_ledger.devstack import connector_coordinates

    version = importlib.metadata.version("pyspark")
    artifact, connector = connector_coordinates(version)
    assert offset_ledger.spark_packages() == f"org.apache.spark:{artifact}:{connector}"
    assert offset_ledger.spark_packages().endswith(":" + version)
