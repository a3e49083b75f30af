"""The simulated drivers of bench_fleet.py: each pipeline is a forked process running the listener's
real writer (or the naive pattern), started together on a go signal, reporting batch -> durable times."""

from __future__ import annotations

import gc
import multiprocessing
import os
import threading
import time
import uuid
from pathlib import Path

import psycopg2
from _progress import progress_json  # noqa: E402 - sibling modules; benchmarks run as scripts
from sqlalchemy.engine import make_url

from offset_ledger.capture.spool import Event
from offset_ledger.capture.writer import EventWriter


#: The ``beat`` method's heartbeat period (seconds): ``bench_fleet.py --beat-every``.
BEAT_EVERY = [10.0]


def _writer_pipeline(dsn: str, pipeline: str, partitions: int, batches: int, spool: str,
                     conn: multiprocessing.connection.Connection, *, beat: bool = False) -> dict:
    """One pipeline's driver: the listener's writer, exactly as OffsetLedgerListener builds and feeds it
    (``beat``: and its driver heartbeat thread, as the listener starts it)."""
    every = BEAT_EVERY[0] if beat else None
    timings = _time_the_recorder()
    writer, open_beats = _listener_writer(dsn, spool, pipeline, every)
    heartbeat = None
    if every is not None:
        from offset_ledger.capture.heartbeat import Heartbeat

        heartbeat = Heartbeat(open_beats, writer.live_runs, every=every)
        heartbeat.start()
    query_id = str(uuid.uuid4())
    # Warm-up, batches 0 and 1: engine, connection, schema check, first positions (0, the general path),
    # then the one-statement path's first call (1): it prepares the statement on the connection and plans
    # it, once per connection (a few ms). A listener pays both once in its life; with a handful of batches
    # per driver in a step, they were a sixth of the step's samples and set its p99.
    warmup = 2
    last_batch = batches + warmup - 1
    events = [progress_json(query_id, b, partitions) for b in range(last_batch + 1)]

    def submit(b: int) -> None:  # = OffsetLedgerListener._accept(PROGRESS, payload)
        writer.submit(Event("progress", events[b], time.time(), pipeline, None, None))

    for b in range(warmup):
        submit(b)
        writer.flush(120)
    settled_at: dict[int, float] = {}
    done = threading.Event()

    def watch() -> None:
        last = writer.settled_batch(query_id) or 0
        while last < last_batch and not done.is_set():
            writer.wait_for(lambda: (writer.settled_batch(query_id) or 0) > last, time.monotonic() + 0.5)
            now = time.perf_counter()
            current = writer.settled_batch(query_id) or 0
            for b in range(last + 1, current + 1):
                settled_at[b] = now
            last = max(last, current)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    go, phase, interval, drain = _ready(conn)
    for calls in timings.values():
        calls.clear()  # the warm-up's calls are not the step's
    handed: dict[int, float] = {}
    max_pending = 0
    for b in range(warmup, last_batch + 1):
        _sleep_until(go + phase + (b - warmup) * interval)
        handed[b] = time.perf_counter()
        submit(b)
        max_pending = max(max_pending, writer.health().pending)
    watcher.join(drain)
    done.set()
    health = writer.health()
    beats = (heartbeat.beats, heartbeat.skipped) if heartbeat is not None else (0, 0)
    if heartbeat is not None:
        heartbeat.stop()
    writer.close(5)
    return {"latencies": [settled_at[b] - handed[b] if b in settled_at else None
                          for b in range(warmup, last_batch + 1)],
            "max_pending": max(max_pending, health.pending), "spilled": health.spilled, "retried": health.retried,
            "failed": health.failed, "last_error": health.last_error, "end": time.time(),
            "beats": beats[0], "beats_skipped": beats[1], "recorder": timings["record"], "fast": timings["fast"]}


def _listener_writer(dsn: str, spool: str, pipeline: str, every: float | None):  # type: ignore[no-untyped-def]
    """(the writer, the heartbeat's ledger factory) as the listener of the tree on ``sys.path`` builds them:
    this tree's address and options values, or the baseline's (f0265ab) DSN and loose arguments."""
    from offset_ledger.ledger import heartbeats

    beat_every_ms = None if every is None else int(every * 1000)
    try:
        from offset_ledger.addresses import LedgerAddress
        from offset_ledger.capture.writer import WriterOptions
    except ImportError:  # the baseline: before LedgerAddress
        from offset_ledger.capture.spool import ledger_id
        from offset_ledger.capture.store import open_recorder
        from offset_ledger.config import settings

        writer = EventWriter(lambda: open_recorder(dsn), spool_dir=Path(spool),
                             ledger=ledger_id(settings().resolved_dsn(dsn)), queue_size=10_000,
                             max_batch_events=500, max_backoff=2.0, health_interval=30.0,
                             health_pipeline=pipeline, beat_every_ms=beat_every_ms)
        return writer, lambda: heartbeats.open_beats(dsn)
    ledger = LedgerAddress.resolve(dsn, pool_size=1)
    writer = EventWriter(ledger, spool_dir=Path(spool), options=WriterOptions(
        queue_size=10_000, max_batch_events=500, max_backoff=2.0, health_interval=30.0,
        health_pipeline=pipeline, beat_every_ms=beat_every_ms))
    return writer, lambda: heartbeats.open_beats(ledger)


def _time_the_recorder() -> dict[str, list[float]]:
    """Where a batch's time goes, in this driver: each ``Recorder.record`` call (the writer thread's ledger
    work: parameters, the round trip, the commit) and, inside it, each one-statement write
    (``FastBatchPath.record``: building the arrays and the one round trip). Wrapped in the forked child
    only; what is left of batch -> durable is the hand-over between threads (queue, convert, settle)."""
    from offset_ledger.ledger.fast_batch import FastBatchPath
    from offset_ledger.ledger.recorder import Recorder

    out: dict[str, list[float]] = {"record": [], "fast": []}
    for cls, key in ((Recorder, "record"), (FastBatchPath, "fast")):
        inner = cls.record

        def timed(self, *a, _inner=inner, _into=out[key], **kw):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            try:
                return _inner(self, *a, **kw)
            finally:
                _into.append(time.perf_counter() - t0)

        cls.record = timed  # type: ignore[method-assign]
    return out


def _naive_pipeline(dsn: str, pipeline: str, partitions: int, batches: int, spool: str,
                    conn: multiprocessing.connection.Connection) -> dict:
    """The pattern people copy: a new connection per batch, one INSERT per partition row (bench_record's naive)."""
    url = make_url(dsn)
    params = {k: v for k, v in {"host": url.host, "port": url.port, "user": url.username, "password": url.password,
                                "dbname": url.database}.items() if v is not None}
    query_id = str(uuid.uuid4())
    sql = ("INSERT INTO naive_offsets (pipeline, consumer_group, query_id, batch_id, source_index, topic, partition,"
           " from_offset, until_offset, batch_time) VALUES (%s, %s, %s, %s, 0, 'bench', %s, %s, %s, now())")

    def write(b: int) -> None:
        db = psycopg2.connect(**params)
        with db, db.cursor() as cur:
            for p in range(partitions):
                cur.execute(sql, (pipeline, pipeline, query_id, b, p, b * 10, (b + 1) * 10))
        db.close()

    write(0)
    go, phase, interval, drain = _ready(conn)
    latencies: list[float | None] = []
    for b in range(1, batches + 1):
        due = go + phase + (b - 1) * interval
        _sleep_until(due)
        write(b)
        latencies.append(time.time() - due)  # late batches count their wait: the driver was blocked
    return {"latencies": latencies, "max_pending": 0, "spilled": 0, "retried": 0, "failed": 0,
            "last_error": None, "end": time.time()}


_CPU_AT_GO = [0.0]
#: The driver's full collections during the step: [count, longest pause in seconds] (``_count_full_gc``).
_FULL_GC = [0, 0.0]


def _count_full_gc() -> None:
    started = [0.0]

    def seen(phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            _FULL_GC[0] += 1
            _FULL_GC[1] = max(_FULL_GC[1], time.perf_counter() - started[0])

    gc.callbacks.append(seen)


def _ready(conn: multiprocessing.connection.Connection) -> tuple[float, float, float, float]:
    # A driver that has run a while: its start-up's full collection (every object the imports made,
    # 15-25 ms of pause on this machine) is behind it. Without this, each of a short step's freshly
    # forked drivers met that one collection during its few measured batches, and the step's p99 was
    # those pauses (~1 batch in 100). In steady state the writer leaves almost nothing for the
    # collector (one young collection in 2,000 batches measured): full collections are counted and
    # reported per step, so a pause that still lands in the step shows.
    gc.collect()
    _count_full_gc()
    conn.send("ready")
    plan = conn.recv()  # (go wall time, phase, interval, drain)
    cpu = os.times()
    _CPU_AT_GO[0] = cpu.user + cpu.system  # start-up and the warm-up batch are not in the step's CPU
    return plan


def _sleep_until(wall: float) -> None:
    delay = wall - time.time()
    if delay > 0:
        time.sleep(delay)


def _child(method: str, dsn: str, pipeline: str, partitions: int, batches: int, spool: str,
           conn: multiprocessing.connection.Connection) -> None:
    try:
        if method == "naive":
            result = _naive_pipeline(dsn, pipeline, partitions, batches, spool, conn)
        else:  # "writer", or "beat": the writer and the driver heartbeat
            result = _writer_pipeline(dsn, pipeline, partitions, batches, spool, conn, beat=method == "beat")
        cpu = os.times()
        result["cpu"] = cpu.user + cpu.system - _CPU_AT_GO[0]
        result["full_gc"], result["full_gc_max"] = _FULL_GC
        conn.send(result)
    except Exception as exc:  # noqa: BLE001 - reported by the parent
        conn.send({"error": repr(exc)})
    finally:
        conn.close()
        os._exit(0)
