"""The context every operator verb takes: one ledger, one Kafka cluster, the caches the verbs share.

An operator verb is a plain function whose first argument is this context, e.g.
``history(ops, "orders")`` (``operate/reads.py``), ``reset(ops, "orders", request, actor=...)``
(``operate/reset_operations.py``), ``verify_pipeline(ops, "orders")`` (``operate/verifying.py``).
The REST API and the CLI are two faces over those functions. ``Operations`` owns the connections
(the ledger's engine and its read engine, the Kafka adapter made on first use) and nothing else:
no verbs. Database driver errors are translated into ``LedgerUnavailable`` / ``LedgerError`` by
``reading()``, so callers only ever see ``offset_ledger.errors``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.addresses import KafkaAddress
from offset_ledger.errors import (
    ConfigError,
    UnknownConsumerGroup,
)
from offset_ledger.kafka.adapter import KafkaAdapter
from offset_ledger.ledger.engine import engine_for, read_engine, translate_db_error
from offset_ledger.operate.inputs import check_name
from offset_ledger.operate.known import require_pipeline
from offset_ledger.operate.lag_insight import LagInsight
from offset_ledger.operate.loss_status import LossBook
from offset_ledger.operate.retention_insight import RetentionInsight
from offset_ledger.rules.coalesce import Coalescer
from offset_ledger.rules.model import TopicPartition, Watermarks
from offset_ledger.rules.restart_options import PipelineRef

if TYPE_CHECKING:
    from offset_ledger.addresses import LedgerAddress


def resolve_group(conn: Connection, pipeline: str, consumer_group: str | None = None) -> str:
    """The consumer group to use: the one given (it must be in the ledger), else the pipeline's only one."""
    check_name("pipeline", pipeline)
    groups = require_pipeline(conn, pipeline)  # UnknownPipeline naming the pipelines that exist
    if consumer_group is not None:
        check_name("consumer group", consumer_group)
        if consumer_group not in groups:
            raise UnknownConsumerGroup(pipeline, consumer_group, groups)
    # The restart's one rule over groups that exist: the named one, else the only one, else
    # AmbiguousConsumerGroup (guessing would show or reset the wrong positions).
    return PipelineRef(pipeline, consumer_group).resolve(groups).consumer_group


class Operations:
    """The context of the operator verbs over one ledger and one Kafka cluster; thread-safe, reusable."""

    def __init__(
        self, engine: Engine, *, bootstrap_servers: str | None = None,
        kafka_options: Mapping[str, Any] | None = None, kafka: KafkaAdapter | None = None,
        kafka_timeout_ms: int = 10_000, lag_cache_seconds: float = 2.0,
    ) -> None:
        self.engine = engine
        self.reads = read_engine(engine)
        #: concurrent callers of the pipelines list and /metrics share one computation
        self.coalesce = Coalescer()
        # The cluster as one value; kafka_timeout_ms bounds how long a request waits for an unreachable
        # cluster before answering 503.
        self._kafka_address = KafkaAddress(bootstrap_servers, kafka_options or {}, kafka_timeout_ms)
        self._kafka = kafka
        # Lag in the pipelines list and /metrics may be this old; resets and /lag always ask Kafka.
        self.lag_cache_seconds = lag_cache_seconds
        #: (when, topics, watermarks) of the last look (``reads.watermarks_or_none``), under ``marks_lock``
        self.marks_cache: tuple[float, frozenset[str], dict[TopicPartition, Watermarks]] | None = None
        self.marks_lock = threading.Lock()
        # The insight caches are made on first use: a restart (``start_from_ledger``) builds this
        # context too and reads none of them, so it does not import their modules.
        self._insights_lock = threading.Lock()
        self._lag_insight: LagInsight | None = None
        self._retention_insight: RetentionInsight | None = None
        self._losses: LossBook | None = None

    @classmethod
    def open(cls, ledger: LedgerAddress, kafka: KafkaAddress | None = None, *,
             lag_cache_seconds: float = 2.0) -> Operations:
        """The verbs' context over ``ledger`` and ``kafka``: the one place that makes engines and clients.

        Each face resolves its addresses once (``offset_ledger.addresses``) and opens here; nothing
        below a face builds an engine or a Kafka client of its own.
        """
        engine = engine_for(ledger)
        if kafka is None:
            return cls(engine, lag_cache_seconds=lag_cache_seconds)
        return cls(engine, bootstrap_servers=kafka.bootstrap_servers, kafka_options=kafka.options,
                   kafka_timeout_ms=kafka.timeout_ms, lag_cache_seconds=lag_cache_seconds)

    @property
    def kafka(self) -> KafkaAdapter:
        """The Kafka adapter (created lazily; ConfigError when no bootstrap servers are set)."""
        if self._kafka is None:
            if not self._kafka_address.bootstrap_servers:
                raise ConfigError("no Kafka bootstrap servers: pass --bootstrap-servers or set "
                                  "OFFSET_LEDGER_BOOTSTRAP_SERVERS")

            self._kafka = KafkaAdapter.open(self._kafka_address)
        return self._kafka

    def _made_once(self, name: str, make: Callable[[], Any]) -> Any:
        """The cache ``name``, made by ``make`` on first use (under a lock: requests share it)."""
        with self._insights_lock:
            if getattr(self, name) is None:
                setattr(self, name, make())
            return getattr(self, name)

    @property
    def lag_insight(self) -> LagInsight:
        """Time lag and drift per partition, cached between requests (``operate.lag_insight``)."""
        return self._made_once("_lag_insight", LagInsight)

    @property
    def retention_insight(self) -> RetentionInsight:
        """Retention headroom per partition, cached between requests (``operate.retention_insight``)."""
        return self._made_once("_retention_insight", RetentionInsight)

    @property
    def losses(self) -> LossBook:
        """Records lost per partition (issue 41), judged once per finding (``operate.loss_status``)."""
        return self._made_once("_losses", LossBook)

    @property
    def has_kafka(self) -> bool:
        return self._kafka is not None or bool(self._kafka_address.bootstrap_servers)

    def close(self) -> None:
        if self._kafka is not None:
            self._kafka.close()
        self.engine.dispose()
        if self.reads is not self.engine:
            self.reads.dispose()

    @contextmanager
    def reading(self) -> Iterator[Connection]:
        """A connection for reads (autocommit on PostgreSQL, see ``read_engine``); writes use ``engine.begin()``."""
        try:
            with self.reads.connect() as conn:
                yield conn
        except SQLAlchemyError as exc:
            raise translate_db_error(exc, "reading") from exc


__all__ = ["Operations", "resolve_group"]
