"""Where the ledger and the Kafka cluster are: two values, resolved once at each face and handed down.

A face (the Python API's ``start_from_ledger`` and ``Pipeline``, the listener, a sink, the CLI, the
server) turns what its caller gave — arguments, ``--dsn``, ``OFFSET_LEDGER_*`` — into a
``LedgerAddress`` and a ``KafkaAddress`` exactly once; everything below it takes the value, never a
DSN string or a bootstrap-servers fallback of its own. ``Operations.open`` opens both; the engines
are made by ``ledger.engine.engine_for`` and the Kafka clients by ``KafkaAdapter.open``, the one place
each (enforced by tests/unit/project/test_addresses.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from offset_ledger.config import settings
from offset_ledger.errors import ConfigError

@dataclass(frozen=True)
class LedgerAddress:
    """The ledger database: its SQLAlchemy URL, already resolved, and how to connect to it.

    ``create=False`` is a reader's address: a SQLite file that does not exist is a ConfigError instead
    of a new, empty ledger at a mistyped path.
    """

    dsn: str
    pool_size: int = 5
    create: bool = True

    def __repr__(self) -> str:
        # Addresses end up in logs and tracebacks: the password never does.
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            shown = make_url(self.dsn).render_as_string(hide_password=True)
        except ArgumentError:  # not a URL (make_engine says so): its text may hold a password
            shown = "<not a database URL>"
        return f"LedgerAddress(dsn={shown!r}, pool_size={self.pool_size}, create={self.create})"

    @classmethod
    def resolve(cls, dsn: str | None = None, *, pool_size: int = 5, create: bool = True) -> LedgerAddress:
        """The argument, else ``OFFSET_LEDGER_DSN``, else the embedded SQLite file."""
        if not dsn:
            dsn = settings().resolved_dsn(None)
        return cls(dsn, pool_size=pool_size, create=create)


def _frozen(options: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(options or {}))


@dataclass(frozen=True)
class KafkaAddress:
    """A Kafka cluster: bootstrap servers (None: not configured) and Spark-style ``kafka.*`` options.

    ``options`` are what the caller named (``kafka_options``, ``--kafka-option``, ``--command-config``);
    the ``OFFSET_LEDGER_KAFKA_*`` layer is merged under them where a client is built.
    """

    bootstrap_servers: str | None
    options: Mapping[str, Any] = field(default_factory=lambda: _frozen(None))
    timeout_ms: int = 10_000

    def __post_init__(self) -> None:
        # A value handed down to threads and requests: a caller's dict changed later must not change it.
        object.__setattr__(self, "options", _frozen(self.options))

    @classmethod
    def resolve(cls, bootstrap_servers: str | None = None, options: Mapping[str, Any] | None = None,
                *, timeout_ms: int | None = None, environment: bool = True) -> KafkaAddress:
        """The argument, else ``kafka.bootstrap.servers`` in ``options``, else ``OFFSET_LEDGER_BOOTSTRAP_SERVERS``.

        ``environment=False``: only a cluster the caller named (``import_checkpoint`` asks Kafka for
        topic ids only when given one; an environment set for other commands must not make it fail).
        """
        opts = dict(options or {})
        servers = bootstrap_servers or opts.get("kafka.bootstrap.servers")
        if not servers and environment:
            servers = settings().bootstrap_servers
        return cls(str(servers) if servers else None, _frozen(opts), timeout_ms or 10_000)

    def require(self) -> str:
        """The bootstrap servers; ConfigError (exit 2) when none are configured."""
        if not self.bootstrap_servers:
            raise ConfigError("no Kafka bootstrap servers: pass --bootstrap-server (bootstrap_servers= in Python) or set "
                              "OFFSET_LEDGER_BOOTSTRAP_SERVERS")
        return self.bootstrap_servers

    def reader_options(self) -> dict[str, Any]:
        """The options for Spark's Kafka reader: ``options`` with ``kafka.bootstrap.servers`` set."""
        out = dict(self.options)
        if self.bootstrap_servers:
            out["kafka.bootstrap.servers"] = self.bootstrap_servers
        return out
