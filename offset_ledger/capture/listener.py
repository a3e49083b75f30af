"""The drop-in StreamingQueryListener: the Spark adapter in front of the durable writer.

Spark delivers listener events on its listener bus; a slow listener makes that bus drop events.
So a callback here does as little as possible: it takes the event's JSON text (one py4j call),
wraps it with the listener's settings and hands it to the writer (``offset_ledger.capture.writer``: a
bounded queue, else the spool of ``offset_ledger.capture.spool``). It never raises.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import functools
import json
import logging
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from offset_ledger.addresses import KafkaAddress, LedgerAddress
from offset_ledger.config import settings
from offset_ledger.errors import install_hint

try:
    from pyspark.sql.streaming import StreamingQueryListener
except ImportError:  # the CLI, API and start_from_ledger run without PySpark; only this module needs it
    raise ModuleNotFoundError(
        f"OffsetLedgerListener needs PySpark 3.5 or 4.x: {install_hint('spark')}, "
        "or run it where your platform's PySpark is installed", name="pyspark") from None

from offset_ledger.capture.event_records import IDLE, PROGRESS, STARTED, TERMINATED
from offset_ledger.capture.heartbeat import Heartbeat
from offset_ledger.capture.spool import Event
from offset_ledger.capture.store import ListenerHealth, Store
from offset_ledger.capture.writer import EventWriter, WriterOptions
from offset_ledger.kafka.adapter import KafkaAdapter, client_configs
from offset_ledger.kafka.mirror import KafkaMirror
from offset_ledger.ledger.engine import engine_for
from offset_ledger.ledger.heartbeats import open_beats
from offset_ledger.ledger.records import RecordOutcome
from offset_ledger.rules.durations import parse_duration

# Re-exported: these names were importable from here before the writer and spool moved out.
__all__ = ["IDLE", "PROGRESS", "STARTED", "TERMINATED", "Event", "EventWriter", "ListenerHealth",
           "OffsetLedgerListener", "Store"]

log = logging.getLogger(__name__)


class OffsetLedgerListener(StreamingQueryListener):
    """Records every committed micro-batch's Kafka offsets in the offset ledger.

    Register it once per SparkSession::

        spark.streams.addListener(OffsetLedgerListener(dsn="postgresql+psycopg2://...", pipeline="orders"))

    ``pipeline`` defaults to each query's name (a query with neither is logged once and skipped). A
    string attributes every query of the session to that one pipeline; a mapping or a callable
    maps each query's name to its pipeline (unmapped names keep their own), so several queries of
    one session reading the same topic keep separate positions. ``consumer_group`` defaults to the
    pipeline, ``dsn`` to ``OFFSET_LEDGER_DSN`` and then the embedded
    SQLite ledger. Callbacks never block on the database and never raise; call :meth:`flush`
    after ``query.processAllAvailable()`` or ``query.stop()`` to wait until the batches Spark
    reported are durable, and :meth:`close` at shutdown.

    ``commit_to_kafka=True`` also mirrors the ledger's positions into the Kafka consumer group of
    the same name (``bootstrap_servers`` default ``OFFSET_LEDGER_BOOTSTRAP_SERVERS``; Spark-style
    ``kafka_options``), after each ledger commit, on a thread of its own: Kafka being down never
    delays the ledger, and a group someone else consumes with is left alone (see
    ``offset_ledger.kafka.mirror``). :meth:`flush_mirror` waits until the group shows the ledger.

    How events arrive (``bridge`` tells which path a classic session took):

    * classic PySpark, ``"json"``: one py4j call per event fetches Spark's own JSON of it. It needs
      ``PythonStreamingQueryListenerWrapper`` in the JVM and events that serialise themselves
      (Spark 3.5+); when either is missing, or ``fast_bridge`` is set to False on the listener
      before ``addListener``, ``"pyspark"``: PySpark's own conversion builds the event objects and
      calls the ``onQuery*`` methods below.
    * Spark Connect (``bridge`` stays None): the client registers itself with the server's
      listener bus and the server streams each event's JSON to the client over gRPC, where PySpark
      calls the ``onQuery*`` methods on a thread of its own. ``flush()`` works the same way
      (``streams.get(id).lastProgress`` is asked over Connect), but the run's checkpoint location
      cannot be looked up from a Connect client, so runs are recorded with an unknown checkpoint.
    """

    #: Use the one-call JSON bridge when the running PySpark offers it (see the class docstring).
    fast_bridge: bool = True
    #: Which path delivers events on a classic session: "json", "pyspark", or None (Spark Connect).
    bridge: str | None = None

    def __init__(
        self,
        dsn: str | None = None,
        pipeline: str | Mapping[str, str] | Callable[[str], str | None] | None = None,
        consumer_group: str | None = None,
        app_version: str | None = None,
        *,
        spool_dir: str | Path | None = None,
        queue_size: int = 10_000,
        max_batch_events: int = 500,
        max_backoff: float = 2.0,
        health_interval: float = 30.0,
        store_factory: Callable[[], Store] | None = None,
        commit_to_kafka: bool = False,
        bootstrap_servers: str | None = None,
        kafka_options: Mapping[str, Any] | None = None,
        heartbeat_every: float | None = None,
    ) -> None:
        super().__init__()

        if spool_dir is None:
            spool_dir = settings().home / "spool"
        self.dsn = dsn
        # Where the ledger is, resolved once: the writer's recorder, its spool's ledger id, the
        # heartbeat and the mirror all take this value (one connection each: pool_size=1).
        ledger = LedgerAddress.resolve(dsn, pool_size=1)
        pipeline_of: Callable[[str], str | None] | None = None
        if isinstance(pipeline, Mapping):
            pipeline_of, pipeline = dict(pipeline).get, None
        elif callable(pipeline):
            pipeline_of, pipeline = pipeline, None
        elif pipeline is not None and not isinstance(pipeline, str):
            raise TypeError("pipeline must be a name, a mapping of query names, or a callable")
        self.pipeline = pipeline
        self.consumer_group = consumer_group
        self.app_version = app_version
        self._handles: dict[str, Any] = {}
        self._callback_seconds: collections.deque[float] = collections.deque(maxlen=1024)
        self._callback_errors = 0
        self._mirror: Any = None
        if commit_to_kafka:
            factories = _mirror_factories(ledger, KafkaAddress.resolve(bootstrap_servers, kafka_options))
            self._mirror = KafkaMirror(*factories, on_error=lambda m: self._writer.note_error(m))
        every = _heartbeat_seconds(heartbeat_every, store_factory is not None)
        options = WriterOptions(queue_size=queue_size, max_batch_events=max_batch_events, max_backoff=max_backoff,
                                health_interval=health_interval, health_pipeline=pipeline,
                                beat_every_ms=None if every is None else int(round(every * 1000)))
        self._writer = EventWriter(
            ledger, spool_dir=Path(spool_dir), options=options, store_factory=store_factory,
            on_query_seen=self._remember_query, pipeline_of=pipeline_of,
            on_recorded=self._mirror_moved if self._mirror is not None else None,
        )
        self._heartbeat: Heartbeat | None = None
        if every is not None:
            self._heartbeat = Heartbeat(functools.partial(open_beats, ledger), self._writer.live_runs, every=every,
                                        still_running=self._still_running,
                                        on_error=lambda m: self._writer.note_error(m))
            self._heartbeat.start()
        ref = weakref.ref(self)
        atexit.register(lambda: (lambda me: me and me.close(timeout=10))(ref()))

    @property
    def listener_id(self) -> str:
        return self._writer.listener_id

    # ------------------------------------------------------------------ Spark callbacks

    def onQueryStarted(self, event: Any) -> None:
        self._accept(STARTED, lambda: json.dumps({
            "id": str(event.id), "runId": str(event.runId), "name": event.name,
            "timestamp": event.timestamp}))

    def onQueryProgress(self, event: Any) -> None:
        self._accept(PROGRESS, lambda: event.progress.json)

    def onQueryIdle(self, event: Any) -> None:
        self._accept(IDLE, lambda: json.dumps({
            "id": str(event.id), "runId": str(event.runId), "timestamp": event.timestamp}))

    def onQueryTerminated(self, event: Any) -> None:
        self._accept(TERMINATED, lambda: json.dumps({
            "id": str(event.id), "runId": str(event.runId), "exception": event.exception,
            "errorClassOnException": getattr(event, "errorClassOnException", None)}))

    def accept_json(self, kind: str, payload: str) -> None:
        """Hand over an event already serialised by Spark (``kind``: started/progress/idle/terminated)."""
        self._accept(kind, lambda: payload)

    def _accept(self, kind: str, payload: Callable[[], str]) -> None:
        started = time.perf_counter()
        try:
            self._writer.submit(Event(kind, payload(), time.time(), self.pipeline, self.consumer_group,
                                      self.app_version))
        except Exception as exc:  # noqa: BLE001 - no exception may reach Spark's listener bus
            self._callback_errors += 1
            self._writer._count_failure(f"{kind} callback failed: {exc!r}")
        self._callback_seconds.append(time.perf_counter() - started)

    @property
    def _jlistener(self) -> Any:
        """What classic PySpark's ``addListener`` registers with the JVM (Spark Connect never asks).

        The fast bridge fetches each event's JSON in one py4j call instead of PySpark's field walk;
        it relies on PySpark internals, so it is only used when the running Spark offers them.
        """
        if not hasattr(self, "_jlistenerobj"):
            wrapper = _fast_bridge_wrapper() if self.fast_bridge else None
            if wrapper is None:
                self._jlistenerobj = StreamingQueryListener._jlistener.fget(self)  # type: ignore[attr-defined]
                self.bridge = "pyspark"
            else:
                self._jlistenerobj = wrapper(_JsonBridge(self))
                self.bridge = "json"
        return self._jlistenerobj

    def __reduce__(self) -> Any:
        # PySpark 3.5's Spark Connect pickles listeners and runs them on the server; this one owns
        # a writer thread and a spool in the client process, so say so instead of a pickling error.
        raise TypeError("OffsetLedgerListener runs in the driver or Spark Connect client process and "
                        "cannot be pickled: Spark Connect needs PySpark 4.x (3.5's Connect runs "
                        "listeners on the server); classic sessions work on 3.5 and 4.x")

    # ------------------------------------------------------------------ durability

    def health(self) -> ListenerHealth:
        """Counters (queued, written, retried, spilled, failed = dead-lettered, skipped, pending), the last
        error, the dead-letter file, and spool files of other ledgers left in the spool directory."""
        health = self._writer.health()
        if self._heartbeat is not None:
            hb = self._heartbeat
            health = dataclasses.replace(health, heartbeat={
                "everySeconds": hb.every, "beats": hb.beats, "skipped": hb.skipped, "lastError": hb.last_error})
        if self._mirror is not None:
            health = dataclasses.replace(health, mirror=self._mirror.stats.to_dict())
        took = sorted(self._callback_seconds)
        if not took:
            return health
        p99 = took[min(len(took) - 1, int(0.99 * len(took)))] * 1000
        return dataclasses.replace(health, callback_p99_ms=round(p99, 3))

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every event received so far, and each seen query's last reported batch, is durable.

        Events reach Python after the batch, so when ``query.stop()`` returns the query's last
        progress events may still be on Spark's listener bus. For each query seen, this waits for
        the batch id of its ``lastProgress`` (and, once stopped, for its termination event).
        Returns False when ``timeout`` passed first.
        """
        deadline = time.monotonic() + timeout
        writer = self._writer
        if not writer.flush(max(0.0, deadline - time.monotonic())):
            return False
        for query_id in sorted(writer.seen_queries()):
            if writer.is_terminated(query_id):
                continue
            handle = self._handle(query_id)
            if handle is None:
                continue  # not a query of this session's manager any more; nothing to compare with
            try:
                last = handle.lastProgress
                target = int(last["batchId"]) if last else None
                active = bool(handle.isActive)
            except Exception:  # noqa: BLE001 - the JVM may be shutting down
                continue
            if target is not None and not writer.wait_for(
                    functools.partial(_batch_settled, writer, query_id, target), deadline):
                return False
            if not active and not writer.wait_for(functools.partial(writer.is_terminated, query_id), deadline):
                return False
        # Events that arrived while we waited (the terminated event, say) are written too.
        return writer.flush(max(0.0, deadline - time.monotonic()))

    def close(self, timeout: float = 30.0) -> bool:
        """Flush, then stop the writer; events it could not write stay in the spool for next time."""
        deadline = time.monotonic() + timeout
        flushed = self.flush(timeout)
        if self._heartbeat is not None:
            # No beat after close: a run still going (its query not stopped) ends 3 periods later.
            self._heartbeat.stop(max(0.5, deadline - time.monotonic()))
        closed = self._writer.close(max(0.5, deadline - time.monotonic()))
        if self._mirror is not None:
            self._mirror.close(max(0.5, deadline - time.monotonic()))
        return flushed and closed

    def flush_mirror(self, timeout: float = 30.0) -> bool:
        """``flush``, then wait until the Kafka consumer groups show the ledger's positions (commit_to_kafka)."""
        deadline = time.monotonic() + timeout
        if not self.flush(timeout):
            return False
        return self._mirror is None or self._mirror.wait_synced(max(0.0, deadline - time.monotonic()))

    def _mirror_moved(self, outcome: RecordOutcome) -> None:
        if outcome.moved:
            self._mirror.notify(outcome.moved)

    # ------------------------------------------------------------------ Spark handles

    def _session(self) -> Any:
        session = self.spark
        if session is not None:
            return session
        from pyspark.sql import SparkSession

        return SparkSession._instantiatedSession or SparkSession.getActiveSession()

    def _remember_query(self, query_id: str) -> str | None:
        """Keep a run's handle while it is active (after stop() the manager forgets it); its checkpoint."""
        handle = self._handle(query_id)
        try:
            return str(handle._jsq.streamingQuery().resolvedCheckpointRoot()) if handle is not None else None
        except Exception:  # noqa: BLE001 - Spark Connect or another Spark: no checkpoint, nothing else lost
            return None

    def _still_running(self, run_id: str, query_id: str) -> bool | None:
        """Whether Spark says run ``run_id`` of ``query_id`` still runs in this session (None: cannot tell).

        Asked by the heartbeat thread, so a run whose termination event the listener bus dropped is not
        kept alive by beats while the driver lives on."""
        handle = self._handle(query_id)
        if handle is None:
            return None  # not a query of this session's manager (or Spark cannot be asked)
        if str(handle.runId) != run_id:
            # The session runs the query under another run id, or runs no run of it: this run is over.
            return False
        return bool(handle.isActive)

    def _lookup(self, query_id: str) -> Any:
        try:
            session = self._session()
            return session.streams.get(query_id) if session is not None else None
        except Exception:  # noqa: BLE001 - no session, JVM gone, ...
            return None

    def _handle(self, query_id: str) -> Any:
        """The query's handle: the active run if there is one, else the last run seen (it keeps lastProgress)."""
        handle = self._handles.get(query_id)
        if handle is not None:
            try:
                if handle.isActive:
                    return handle
            except Exception:  # noqa: BLE001
                pass
        fresh = self._lookup(query_id)  # restarted on the same checkpoint: same id, a new run
        if fresh is not None:
            self._handles[query_id] = fresh
            return fresh
        return handle


class _JsonBridge:
    """Implements Spark's PythonStreamingQueryListener over Py4J, passing each event's JSON text."""

    def __init__(self, listener: OffsetLedgerListener) -> None:
        self._listener = listener

    def onQueryStarted(self, jevent: Any) -> None:
        self._listener._accept(STARTED, lambda: _json_of(jevent))

    def onQueryProgress(self, jevent: Any) -> None:
        self._listener._accept(PROGRESS, lambda: jevent.progress().json())

    def onQueryIdle(self, jevent: Any) -> None:
        self._listener._accept(IDLE, lambda: _json_of(jevent))

    def onQueryTerminated(self, jevent: Any) -> None:
        self._listener._accept(TERMINATED, lambda: _json_of(jevent))

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


def _mirror_factories(ledger: LedgerAddress, kafka: KafkaAddress) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(ledger engine factory, Kafka adapter factory) of the consumer-group mirror; checks settings now."""
    client_configs(kafka.bootstrap_servers or "", kafka.options)  # ConfigError now, at construction, not in the writer thread
    return functools.partial(engine_for, ledger), functools.partial(KafkaAdapter.open, kafka)


def _heartbeat_seconds(given: float | None, custom_store: bool) -> float | None:
    """The heartbeat period: ``heartbeat_every`` (0: none), else ``OFFSET_LEDGER_HEARTBEAT_INTERVAL``;
    none with a custom ``store_factory`` (a test seam with no ledger of its own to beat in)."""
    if given is not None:
        if given < 0:
            raise ValueError("heartbeat_every must be positive, or 0 for no heartbeat")
        return float(given) or None
    if custom_store:
        return None

    return parse_duration(settings().heartbeat_interval, "OFFSET_LEDGER_HEARTBEAT_INTERVAL").total_seconds() or None


def _fast_bridge_wrapper() -> Any:
    """Spark's ``PythonStreamingQueryListenerWrapper`` class when the fast bridge can work, else None.

    It can when the session is classic (a JVM behind py4j), the wrapper class is there, and every
    lifecycle event serialises itself to JSON (``json()`` on the event, Spark 3.5+).
    """
    try:
        from py4j.java_gateway import JavaClass
        from pyspark import SparkContext

        jvm, gateway = SparkContext._jvm, SparkContext._gateway
        if jvm is None or gateway is None:
            return None
        wrapper = jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper
        if not isinstance(wrapper, JavaClass):  # py4j answers an unknown class with a JavaPackage
            return None
        no_args = gateway.new_array(jvm.java.lang.Class, 0)
        for event in ("QueryStartedEvent", "QueryIdleEvent", "QueryTerminatedEvent"):
            # Raises (NoSuchMethodException, ClassNotFoundException) when this Spark lacks it.
            jvm.java.lang.Class.forName(f"org.apache.spark.sql.streaming.StreamingQueryListener${event}") \
                .getMethod("json", no_args)
        return wrapper
    except Exception:  # noqa: BLE001 - anything missing means: use PySpark's own path
        log.debug("offset-ledger: the fast listener bridge is not available", exc_info=True)
        return None


def _batch_settled(writer: EventWriter, query_id: str, batch_id: int) -> bool:
    settled = writer.settled_batch(query_id)
    return settled is not None and settled >= batch_id


def _json_of(jevent: Any) -> str:
    """A lifecycle event's JSON: Spark 3.5+ events serialise themselves (used by Spark Connect)."""
    return str(jevent.json())
