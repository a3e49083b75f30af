"""Where a command's ledger and Kafka cluster are: the option groups (``--dsn``; ``--bootstrap-server``,
``-o``, ``--command-config``, ``--timeout``), each resolved once into a ``LedgerAddress`` /
``KafkaAddress``, and the one way the command line opens them (``Operations.open``).

A group is only what was typed; ``address()`` resolves it (the environment, the properties file),
so a command resolves where it did before, after its own input checks, and exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Optional

import typer

from offset_ledger.addresses import KafkaAddress, LedgerAddress
from offset_ledger.cli.support import check_dsn
from offset_ledger.kafka.adapter import KafkaAdapter
from offset_ledger.kafka.client_config import gather
from offset_ledger.ledger.engine import require_schema
from offset_ledger.operate.operations import Operations

Dsn = Annotated[Optional[str], typer.Option(
    "--dsn", envvar="OFFSET_LEDGER_DSN", metavar="URL", callback=check_dsn,
    help="Ledger database URL (default: the embedded SQLite file).")]
BootstrapServers = Annotated[Optional[str], typer.Option(
    "--bootstrap-server", "--bootstrap-servers", envvar="OFFSET_LEDGER_BOOTSTRAP_SERVERS",
    metavar="HOST:PORT[,...]", help="Kafka bootstrap servers.")]
KafkaOptionItems = Annotated[Optional[list[str]], typer.Option(
    "--kafka-option", "-o", metavar="KEY=VALUE",
    help="Kafka client property, e.g. security.protocol=SASL_SSL (repeatable; a kafka. prefix is accepted, "
         "as Spark's reader takes it).")]
CommandConfig = Annotated[Optional[str], typer.Option(
    "--command-config", metavar="FILE", help="Kafka client properties file, as Kafka's own tools take it.")]
TimeoutMs = Annotated[Optional[int], typer.Option(
    "--timeout", metavar="MS", min=1, help="Kafka request timeout in milliseconds (default 10000).")]


@dataclass(frozen=True)
class LedgerOptions:
    """``--dsn``: the ledger a command reads or writes."""

    dsn: Dsn = None

    def address(self, *, create: bool = False) -> LedgerAddress:
        """The ledger's address, resolved once (``create=False``: a reader's; a missing SQLite file is an error)."""
        return LedgerAddress.resolve(self.dsn, create=create)


def kafka_address(servers: str | None, items: list[str] | None, command_config: str | None,
                   timeout_ms: int | None, *, environment: bool = True) -> KafkaAddress:
    """The command line's Kafka options, checked (a bad item or properties file is exit 2) and resolved
    (``environment=False``: only servers the command line named)."""
    return KafkaAddress.resolve(servers, gather(items, command_config), timeout_ms=timeout_ms,
                                environment=environment)


@dataclass(frozen=True)
class KafkaOptions:
    """How a command reaches Kafka: servers, client properties (items and a file), request timeout."""

    bootstrap_servers: BootstrapServers = None
    kafka_option: KafkaOptionItems = None
    command_config: CommandConfig = None
    timeout: TimeoutMs = None

    def address(self) -> KafkaAddress:
        return kafka_address(self.bootstrap_servers, self.kafka_option, self.command_config, self.timeout)


@dataclass(frozen=True)
class KafkaServerOptions:
    """``verify``'s optional look at Kafka: servers and client properties only."""

    bootstrap_servers: BootstrapServers = None
    kafka_option: KafkaOptionItems = None

    def address(self) -> KafkaAddress | None:
        """None when neither option is given: ``verify`` looks at Kafka only when told to (the
        environment's servers arrive through ``--bootstrap-server``'s envvar)."""
        if not (self.bootstrap_servers or self.kafka_option):
            return None
        return kafka_address(self.bootstrap_servers, self.kafka_option, None, None)


def open_operations(ledger: LedgerAddress, kafka: KafkaAddress | None = None) -> Operations:
    """The verbs' context over an existing ledger: its schema is checked here (a read never creates one)."""
    ops = Operations.open(ledger, kafka)
    try:
        ledger_ready(ops.engine)
    except BaseException:
        ops.close()
        raise
    return ops


def ledger_ready(engine: Any) -> None:
    """A read's ledger must hold the schema (one SELECT): refused at start, never created by a read."""
    require_schema(engine)


def kafka_adapter(kafka: KafkaAddress) -> KafkaAdapter:
    """A Kafka client for a command that reads no ledger (``topic``); ConfigError without servers.

    ``Operations.open`` always opens a ledger, and ``topic`` must work where there is none; every
    other command reaches Kafka through its ``Operations``.
    """
    return KafkaAdapter.open(kafka)


__all__ = ["KafkaOptions", "KafkaServerOptions", "LedgerOptions", "kafka_adapter", "ledger_ready",
           "open_operations"]
