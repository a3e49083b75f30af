"""kafka-python's exceptions onto the project's tree (``offset_ledger.errors``), for every Kafka adapter."""

from __future__ import annotations

from typing import Any

from offset_ledger.errors import KafkaAuthenticationFailed, KafkaError, KafkaUnavailable


def translate_error(exc: Exception, bootstrap: Any) -> Exception:
    """Map kafka-python errors onto our tree."""
    from kafka import errors as kerr

    # kafka-python 2.x raises NoBrokersAvailable, 3.x a KafkaTimeoutError from bootstrap.
    unreachable = tuple(getattr(kerr, n) for n in ("NoBrokersAvailable", "KafkaTimeoutError",
                                                    "KafkaConnectionError") if hasattr(kerr, n))
    if isinstance(exc, unreachable):
        # A broker that wants SASL or TLS looks exactly like one that is down to kafka-python: it
        # retries until the bootstrap timeout. Say what to check for both.
        return KafkaUnavailable(f"cannot reach Kafka brokers {bootstrap}: {exc} (is the cluster up, and do "
                                f"security.protocol and the SASL/SSL settings match its listener? "
                                f"--command-config, --kafka-option, OFFSET_LEDGER_KAFKA_*)",
                                bootstrap_servers=str(bootstrap))
    if isinstance(exc, (kerr.SaslAuthenticationFailedError, kerr.AuthorizationError)):
        return KafkaAuthenticationFailed(f"Kafka refused the credentials or access: {exc}",
                                         bootstrap_servers=str(bootstrap))
    return KafkaError(f"Kafka request failed: {exc}", bootstrap_servers=str(bootstrap))


def is_connection_error(exc: Exception) -> bool:
    from kafka import errors as kerr

    kinds = tuple(getattr(kerr, n) for n in ("NoBrokersAvailable", "KafkaTimeoutError", "KafkaConnectionError",
                                              "NodeNotReadyError", "RequestTimedOutError") if hasattr(kerr, n))
    return isinstance(exc, kinds)
