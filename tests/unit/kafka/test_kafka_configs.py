"""Spark-style reader options become kafka-python configs; the rest is left out."""

from __future__ import annotations

import pytest

from offset_ledger.errors import ConfigError
from offset_ledger.kafka.adapter import KafkaAdapter, client_configs


def test_spark_style_security_options_are_translated() -> None:
    configs = client_configs("b1:9092, b2:9092", {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                  'username="etl" password="s3cr\\"et";',
        "kafka.ssl.truststore.location": "/etc/ca.pem",
        "kafka.ssl.truststore.type": "PEM",
        "kafka.request.timeout.ms": "5000",
        "kafka.max.poll.records": "500",          # consumer tuning: irrelevant here
        "startingOffsets": "earliest",            # a reader option, not a client setting
        "subscribe": "orders",
    })
    assert configs == {
        "bootstrap_servers": ["b1:9092", "b2:9092"],
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "etl",
        "sasl_plain_password": 's3cr\\"et',
        "ssl_cafile": "/etc/ca.pem",
        "request_timeout_ms": 5000,
    }


def test_jks_stores_are_refused_with_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="PEM"):
        client_configs("b:9092", {"kafka.ssl.truststore.type": "JKS"})


def test_missing_bootstrap_servers_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="bootstrap"):
        client_configs("  ")


def test_constructing_an_adapter_makes_no_network_call() -> None:
    # Port 1 on loopback refuses connections: a lazy adapter must not notice yet.
    adapter = KafkaAdapter("127.0.0.1:1")
    assert adapter.bootstrap_servers == "127.0.0.1:1"
    adapter.close()
