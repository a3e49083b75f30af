"""What bench_query measures with: percentiles, a run's figures, the driver's CPU, the durable-commit watcher (a Postgres trigger + LISTEN)."""

from __future__ import annotations

import os
import select
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2  # noqa: E402
from sqlalchemy import text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

CHANNEL = "bench_query_durable"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@dataclass
class Run:
    side: str                     # "without" / "bridge" / "with"
    query_id: str
    batch_ids: list[int]          # ids of all data batches (the oracle)
    first_ms: float               # batch 0's triggerExecution (a Kafka consumer per partition is made)
    batch_ms: list[float]         # triggerExecution of data batches 1..N (steady state)
    rows: int                     # input rows of batches 1..N
    span_s: float                 # start of batch 1's trigger to the end of batch N (progress timestamps)
    wall_s: float                 # start() to awaitTermination() returning, the whole run
    checkpoint: Path
    callback_p99_ms: float | None = None
    foreign_cores: float | None = None  # CPU used by other work on the machine during the run
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds of this Python, the JVM, our DB
    durable_s: dict[int, float] = field(default_factory=dict)  # batch id -> commit -> durable seconds
    received_s: dict[int, float] = field(default_factory=dict)  # batch id -> commit -> callback has the JSON
    ended_s: dict[int, float] = field(default_factory=dict)  # batch id -> commit -> trigger end (Spark's figures)
    trigger_end: dict[int, float] = field(default_factory=dict)  # batch id -> wall time its trigger ended

    @property
    def p50(self) -> float:
        return pct(self.batch_ms, 0.5)

    @property
    def rps_span(self) -> float:
        return self.rows / self.span_s

    @property
    def rps_batches(self) -> float:
        return self.rows / (sum(self.batch_ms) / 1000)


class CpuMeter:
    """CPU time other work on the machine takes: every process's, minus this process tree's and our DB's backends.

    Summed over the processes alive at the end of the window from /proc/<pid>/stat (user + system):
    the same accounting for every process (the machine-wide /proc/stat counts ticks and read ~0.3
    cores more than the processes' sum under load on this VM). Processes that start and exit inside
    the window are missed (their reaped time lands in the parent's lifetime totals at once, which
    would be worse). Linux only; elsewhere it reports nothing.
    The broker counts as other work: it serves other clients too, and this query's fetches cost it
    little (~0.02 cores).
    """

    def __init__(self, database: str) -> None:
        self._database = database.encode()
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.available = Path("/proc/self/stat").exists()

    def _scan(self) -> tuple[dict[int, int], dict[str, int]]:
        """(CPU ticks per foreign process, ours split: this Python process / the Spark JVM tree / our DB)."""
        parent: dict[int, int] = {}
        cpu: dict[int, int] = {}
        backend: set[int] = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                rest = stat[stat.rindex(")") + 2:].split()
                pid = int(entry.name)
                parent[pid] = int(rest[1])
                cpu[pid] = int(rest[11]) + int(rest[12])  # utime + stime
                if stat[stat.index("(") + 1:stat.rindex(")")] == "postgres" and \
                        self._database in (entry / "cmdline").read_bytes():
                    backend.add(pid)
            except (OSError, ValueError, IndexError):
                continue
        me, foreign = os.getpid(), {}
        ours = {"python": cpu.get(me, 0), "jvm": 0, "db": sum(cpu[pid] for pid in backend)}
        for pid in cpu:
            walk, hops = pid, 0
            while walk > 1 and walk != me and hops < 64:
                walk, hops = parent.get(walk, 0), hops + 1
            if walk == me and pid != me:
                ours["jvm"] += cpu[pid]
            elif walk != me and pid not in backend:
                foreign[pid] = cpu[pid]
        return foreign, ours

    def snapshot(self) -> tuple[float, dict[int, int], dict[str, int]] | None:
        return (time.monotonic(), *self._scan()) if self.available else None

    def since(self, before: tuple[float, dict[int, int], dict[str, int]] | None) -> tuple[float | None, dict[str, float]]:
        """(CPU cores other work used on average since ``before``; CPU seconds of ours, split)."""
        if before is None:
            return None, {}
        t0, cpu0, ours0 = before
        cpu1, ours1 = self._scan()
        used = sum(max(0, v - cpu0.get(pid, 0)) for pid, v in cpu1.items())
        # Backends that closed inside the window are missed; the listener's closes after it.
        split = {k: (ours1[k] - ours0.get(k, 0)) / self._tick for k in ours1}
        return used / self._tick / (time.monotonic() - t0), split


def libpq_params(dsn: str) -> dict[str, Any]:
    url = make_url(dsn)
    params = {"host": url.host, "port": url.port, "user": url.username, "password": url.password,
              "dbname": url.database}
    return {k: v for k, v in params.items() if v is not None}


class DurableWatcher:
    """Notes when each ``batches`` row becomes visible: pg_notify from an AFTER INSERT trigger, after COMMIT."""

    def __init__(self, dsn: str) -> None:
        self.seen: dict[tuple[str, int], float] = {}
        self._conn = psycopg2.connect(**libpq_params(dsn))
        self._conn.set_isolation_level(psycopg2.extensions.ISOLATION_LEVEL_AUTOCOMMIT)
        with self._conn.cursor() as cur:
            cur.execute(f"LISTEN {CHANNEL}")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-durable-watcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if select.select([self._conn], [], [], 0.2)[0]:
                self._conn.poll()
                now = time.time()
                while self._conn.notifies:
                    note = self._conn.notifies.pop(0)
                    query_id, _, batch_id = note.payload.rpartition(":")
                    self.seen.setdefault((query_id, int(batch_id)), now)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._conn.close()


def install_trigger(engine: Any) -> None:
    with engine.begin() as conn:
        conn.execute(text(
            "CREATE OR REPLACE FUNCTION bench_query_notify() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN PERFORM pg_notify('{CHANNEL}', NEW.query_id || ':' || NEW.batch_id); RETURN NULL; END $$"))
        conn.execute(text("CREATE TRIGGER bench_query_notify AFTER INSERT ON batches "
                          "FOR EACH ROW EXECUTE FUNCTION bench_query_notify()"))


def drop_trigger(engine: Any) -> None:
    with engine.begin() as conn:
        conn.execute(text("DROP TRIGGER IF EXISTS bench_query_notify ON batches"))
