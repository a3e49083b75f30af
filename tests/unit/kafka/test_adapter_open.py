"""``KafkaAdapter.open(address)``: the one way the package makes a Kafka client (issue 51), and the
addresses each caller hands it. No cluster: making an adapter connects to nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from offset_ledger.addresses import KafkaAddress, LedgerAddress
from offset_ledger.errors import ConfigError
from offset_ledger.kafka.adapter import KafkaAdapter
from offset_ledger.operate.operations import Operations
from offset_ledger.rules.failover import FailoverRequest


def test_open_takes_servers_options_and_timeout_from_the_address() -> None:
    address = KafkaAddress("h1:9092, h2:9092", {"kafka.client.id": "orders-mirror"}, timeout_ms=1234)
    with KafkaAdapter.open(address) as adapter:
        assert adapter.bootstrap_servers == "h1:9092,h2:9092"
        assert adapter._configs["request_timeout_ms"] == 1234
        assert adapter._configs["client_id"] == "orders-mirror"


def test_open_without_servers_says_so() -> None:
    with pytest.raises(ConfigError, match="no Kafka bootstrap servers: pass --bootstrap-server"):
        KafkaAdapter.open(KafkaAddress(None))


def test_an_address_keeps_its_options_when_the_callers_dict_changes() -> None:
    options = {"kafka.client.id": "a"}
    address = KafkaAddress("h:9092", options)
    options["kafka.client.id"] = "b"
    assert address.options == {"kafka.client.id": "a"}
    with pytest.raises(TypeError):
        address.options["kafka.client.id"] = "c"  # type: ignore[index]


def test_a_failover_requests_target_is_its_own_cluster_never_the_environments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFSET_LEDGER_BOOTSTRAP_SERVERS", "source:9092")
    request = FailoverRequest("backup:9092", kafka_options={"kafka.security.protocol": "SSL"})
    assert request.target == KafkaAddress("backup:9092", {"kafka.security.protocol": "SSL"})
    assert request.target.timeout_ms == 10_000  # the adapter's default before: unchanged


def test_operations_makes_its_client_from_its_address(tmp_path: Path) -> None:
    ops = Operations.open(LedgerAddress(f"sqlite:///{tmp_path / 'ledger.db'}"),
                          KafkaAddress("h:9092", {"kafka.client.id": "ops"}, timeout_ms=4321))
    try:
        assert ops.has_kafka
        assert ops.kafka.bootstrap_servers == "h:9092"
        assert ops.kafka._configs["request_timeout_ms"] == 4321
        assert ops.kafka._configs["client_id"] == "ops"
    finally:
        ops.close()
    bare = Operations.open(LedgerAddress(f"sqlite:///{tmp_path / 'ledger.db'}"))
    try:  # the message Operations always gave (--bootstrap-servers), unchanged
        assert not bare.has_kafka
        with pytest.raises(ConfigError, match="pass --bootstrap-servers or set OFFSET_LEDGER_BOOTSTRAP_SERVERS"):
            bare.kafka  # noqa: B018
    finally:
        bare.close()
