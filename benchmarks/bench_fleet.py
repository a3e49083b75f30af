"""One ledger for a whole platform: P pipelines, each its own process, recording into ONE Postgres (issue 27).

    source .devstack/stack.env   # or pass --dsn
    .venv/bin/python benchmarks/bench_fleet.py [--dsn DSN] [--pipelines 10,25,50,100,200] [--partitions 100]
        [--interval 5] [--duration 30] [--methods writer,naive] [--prefill 0]

Each simulated pipeline is a separate OS process (forked from this one after the imports, so a
step starts in seconds; PySpark is never imported) running the listener's real writer
(``offset_ledger.capture.writer.EventWriter``, built with the arguments ``OffsetLedgerListener``
gives it, fed ``Event``s of Spark progress JSON from ``_progress.progress_json`` exactly as
``OffsetLedgerListener.accept_json`` does). Every ``--interval`` seconds it hands over one
batch of ``--partitions`` partitions; the pipelines are phase-shifted evenly across the interval
(drivers are not synchronised). The baseline, ``naive``, does the same with a new connection per
batch and one INSERT per partition row (bench_record.py's ``naive``).

Per batch, batch -> durable = from the moment the event is handed to the writer (naive: the
batch's scheduled time) until the writer has settled it: its writer thread marks a batch settled
after the ledger transaction holding it COMMITted (``settled_batch``; a watcher thread in the
pipeline process waits on the writer's condition, no polling). The devstack runs Postgres with
``synchronous_commit=off`` and ``fsync=off``: "durable" here is "committed and visible", the WAL
flush is not in the figure.

Per step: p50/p99/max batch -> durable, ledger rows/s, Postgres CPU (utime+stime of the
postmaster and its children from /proc, exited backends included via the postmaster's cutime),
the simulators' CPU (their own os.times()), WAL bytes per batch (pg_current_wal_lsn() before and
after), batch_offsets table+index bytes per million rows, the writers' health (max queue depth
= pending, spilled, retried, failed), and the top wait events sampled from pg_stat_activity.
A method stops ramping at the first step whose p99 passes --ceiling (1 s): its ceiling is the
step before. The simulated drivers run on the same cores as Postgres: on a 2-core machine their
CPU is taken from Postgres' share, so the figures are a lower bound of what the server can take.

``--prefill N,M``: before the fleet, fill batch_offsets with N rows of history (generate_series,
100 older pipelines x 100 partitions, time-ordered, uuid query ids) in a fresh database per size,
to see when the inserts slow down with the table's size.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import psycopg2
from _fleet_sim import _child
from _scratch import ScratchDatabase  # noqa: E402
from sqlalchemy import text
from sqlalchemy.engine import make_url

from offset_ledger.ledger.engine import make_engine, upgrade

TICK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------- pipelines


# ---------------------------------------------------------------------------------------- server side


class OwnServer:
    """``--own-server``: a throwaway PostgreSQL cluster of the installed server (``initdb``, ``pg_ctl``) with
    ``max_connections`` large enough for the step (one connection per driver; the shared stack allows 200,
    which stops the issue's P=200 step at 195) and the stack's other settings (fsync, full_page_writes and
    synchronous_commit off), plus ``pg_stat_statements`` for the server's time per statement. Stopped and
    removed by ``stop()``; started and stopped by this process only."""

    def __init__(self, max_connections: int) -> None:
        import shutil
        import socket
        import subprocess

        self._subprocess = subprocess
        self._shutil = shutil
        self.dir = tempfile.mkdtemp(prefix="bench_fleet_pg_")
        self.data = os.path.join(self.dir, "data")
        as_postgres: list[str] = []
        if os.geteuid() == 0:  # initdb refuses root: run the cluster as the server's own user
            shutil.chown(self.dir, "postgres")
            as_postgres = ["runuser", "-u", "postgres", "--"]
        self._as = as_postgres
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        subprocess.run([*as_postgres, "initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8",
                        "--locale=C.UTF-8"], check=True, capture_output=True)
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections={max_connections}"
                " -c fsync=off -c full_page_writes=off -c synchronous_commit=off -c shared_buffers=128MB"
                " -c shared_preload_libraries=pg_stat_statements")
        subprocess.run([*as_postgres, "pg_ctl", "-D", self.data, "-o", opts, "-w", "-l",
                        os.path.join(self.dir, "log"), "start"], check=True, capture_output=True)
        self.dsn = f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        self._subprocess.run([*self._as, "pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop"], capture_output=True)
        self._shutil.rmtree(self.dir, ignore_errors=True)


def _postgres_ticks(postmaster: int) -> int:
    """CPU ticks of the postmaster (with its reaped children) and its live children."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry), int(fields[1])
        if pid == postmaster:
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        elif ppid == postmaster:
            total += int(fields[11]) + int(fields[12])
    return total


def _postmaster(raw: psycopg2.extensions.connection) -> int:
    with raw.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        backend = cur.fetchone()[0]
    with open(f"/proc/{backend}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _server_state(raw: psycopg2.extensions.connection) -> tuple[int, int, int]:
    with raw.cursor() as cur:
        # Both methods' tables: only one of them writes in a step.
        cur.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint,"
                    " pg_total_relation_size('offset_ranges') + pg_total_relation_size('naive_offsets'),"
                    " (SELECT coalesce(sum(cardinality(partitions)), 0) FROM offset_ranges)"
                    " + (SELECT count(*) FROM naive_offsets)")
        wal, size, rows = cur.fetchone()
    return int(wal), int(size), int(rows)


def _sample_waits(dsn_params: dict, stop: threading.Event, counts: Counter) -> None:
    db = psycopg2.connect(**dsn_params)
    db.autocommit = True
    with db.cursor() as cur:
        while not stop.wait(0.25):
            cur.execute("SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU'), state FROM pg_stat_activity"
                        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                        " AND state NOT IN ('idle')")
            for wait, state in cur.fetchall():
                counts[wait if state == "active" else f"{state}/{wait}"] += 1
    db.close()


def _statements(raw: psycopg2.extensions.connection, reset: bool = False) -> list[tuple[str, int, float, float]] | None:
    """The server's time per statement over the step (pg_stat_statements, loaded by ``--own-server``): the
    statements that took most, as (text, calls, mean ms, total ms); None where the extension is missing."""
    with raw.cursor() as cur:
        try:
            if reset:
                cur.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                cur.execute("SELECT pg_stat_statements_reset()")
                return []
            cur.execute("SELECT regexp_replace(left(query, 70), '\\s+', ' ', 'g'), calls, mean_exec_time,"
                        " total_exec_time FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database"
                        " WHERE datname = current_database()) ORDER BY total_exec_time DESC LIMIT 6")
            return [(q, int(c), float(m), float(t)) for q, c, m, t in cur.fetchall()]
        except psycopg2.Error:
            return None


# ---------------------------------------------------------------------------------------- one step


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run_step(method: str, dsn: str, pipelines: int, partitions: int, interval: float, duration: float,
             spool: str) -> dict:
    batches = max(2, int(duration // interval))
    url = make_url(dsn)
    params = {k: v for k, v in {"host": url.host, "port": url.port, "user": url.username, "password": url.password,
                                "dbname": url.database}.items() if v is not None}
    ctx = multiprocessing.get_context("fork")
    started = time.perf_counter()
    children, pipes = [], []
    for i in range(pipelines):
        parent_end, child_end = ctx.Pipe()
        name = f"{method}_{pipelines}_{i:03d}_{uuid.uuid4().hex[:4]}"
        proc = ctx.Process(target=_child, args=(method, dsn, name, partitions, batches, spool, child_end), daemon=True)
        proc.start()
        child_end.close()
        children.append(proc)
        pipes.append(parent_end)
    for pipe in pipes:
        if not pipe.poll(300):
            raise RuntimeError("a pipeline did not get ready in 300 s")
        msg = pipe.recv()
        if msg != "ready":
            raise RuntimeError(f"pipeline failed at start: {msg}")
    setup = time.perf_counter() - started
    raw = psycopg2.connect(**params)
    raw.autocommit = True
    postmaster = _postmaster(raw)
    stats = _statements(raw, reset=True)  # pg_stat_statements where the server has it (--own-server)
    wal0, _, rows0 = _server_state(raw)
    ticks0, t0 = _postgres_ticks(postmaster), time.perf_counter()
    waits: Counter = Counter()
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_waits, args=(params, stop, waits), daemon=True)
    sampler.start()
    go = time.time() + 0.5
    drain = max(20.0, 4 * interval)
    for i, pipe in enumerate(pipes):
        pipe.send((go, i * interval / pipelines, interval, drain))
    results = []
    for pipe in pipes:
        if not pipe.poll(batches * interval + drain + 60):
            raise RuntimeError("a pipeline did not finish")
        results.append(pipe.recv())
    stop.set()
    ticks1, t1 = _postgres_ticks(postmaster), time.perf_counter()
    wal1, size, rows1 = _server_state(raw)
    statements = _statements(raw) if stats is not None else []
    raw.close()
    sampler.join(5)
    for proc in children:
        proc.join(10)
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError(f"{len(errors)} pipelines failed: {errors[:3]}")
    latencies = [x for r in results for x in r["latencies"]]
    settled = [x for x in latencies if x is not None]
    unsettled = len(latencies) - len(settled)
    ordered = settled + [float("inf")] * unsettled
    window = max(r["end"] for r in results) - go
    cpu_sim = sum(r["cpu"] for r in results)
    return {
        "method": method, "pipelines": pipelines, "partitions": partitions, "interval": interval,
        "batches": len(latencies), "unsettled": unsettled, "setup_s": setup,
        "p50": pct(ordered, 0.5), "p99": pct(ordered, 0.99), "max": max(ordered),
        "offered_rows_s": pipelines * partitions / interval,
        "rows_s": (rows1 - rows0) / window, "rows": rows1,
        "pg_cores": (ticks1 - ticks0) / TICK / (t1 - t0),
        # the pipeline processes' CPU from the go signal to their end (start-up excluded)
        "sim_cores": cpu_sim / (t1 - t0),
        "wal_per_batch": (wal1 - wal0) / max(1, len(settled)),
        "mb_per_million": size / max(1, rows1) * 1e6 / 2**20,
        "max_pending": max(r["max_pending"] for r in results),
        "spilled": sum(r["spilled"] for r in results), "retried": sum(r["retried"] for r in results),
        "failed": sum(r["failed"] for r in results),
        "beats": sum(r.get("beats", 0) for r in results), "beats_skipped": sum(r.get("beats_skipped", 0) for r in results),
        "last_error": next((r["last_error"] for r in results if r["last_error"]), None),
        "waits": waits.most_common(6),
        # where the writer's time goes (writer and beat only): its ledger calls and their one-statement writes
        "record_p50": pct([x for r in results for x in r.get("recorder", [])], 0.5),
        "record_p99": pct([x for r in results for x in r.get("recorder", [])], 0.99),
        "fast_p50": pct([x for r in results for x in r.get("fast", [])], 0.5),
        "fast_p99": pct([x for r in results for x in r.get("fast", [])], 0.99),
        "record_calls": sum(len(r.get("recorder", [])) for r in results),
        "fast_calls": sum(len(r.get("fast", [])) for r in results),
        "statements": statements,
        "full_gc": sum(r.get("full_gc", 0) for r in results),
        "full_gc_max": max((r.get("full_gc_max", 0.0) for r in results), default=0.0),
    }


# ---------------------------------------------------------------------------------------- prefill


#: The naive pattern's own table: one row per partition with its text keys (the per-row layout people copy).
NAIVE_TABLE = """
    CREATE TABLE naive_offsets (id bigserial PRIMARY KEY, pipeline text NOT NULL, consumer_group text NOT NULL,
        query_id text NOT NULL, batch_id bigint NOT NULL, source_index int NOT NULL, topic text NOT NULL,
        "partition" int NOT NULL, from_offset bigint, until_offset bigint NOT NULL, batch_time timestamptz NOT NULL,
        UNIQUE (query_id, batch_id, source_index, topic, "partition"))
"""


def prefill(dsn: str, rows: int) -> float:
    """``rows`` batch_offsets rows of history: 100 pipelines x 100 partitions, time-ordered, uuid query ids."""
    started = time.perf_counter()
    engine = make_engine(dsn, pool_size=1)
    batches = max(1, rows // 10_000)
    with engine.begin() as conn:
        # The compact layout the recorder writes: the batch row, then one offset_ranges row with arrays.
        conn.execute(text("""
            INSERT INTO batches (pipeline, consumer_group, query_id, run_id, batch_id, batch_time, recorded_at,
                                 input_rows)
            SELECT 'old_' || q, 'old_' || q, md5('q' || q)::uuid::text, 'r' || q, b,
                   now() - interval '30 days' + b * interval '1 second', now(), 1000
            FROM generate_series(0, :nb) b, generate_series(0, 99) q ORDER BY b, q
        """), {"nb": batches - 1})
        conn.execute(text("""
            INSERT INTO offset_ranges (batch_pk, source_index, topic, partitions, from_offsets, until_offsets)
            SELECT id, 0, 'bench', ARRAY(SELECT generate_series(0, 99)), array_fill(batch_id * 10, ARRAY[100]),
                   array_fill((batch_id + 1) * 10, ARRAY[100])
            FROM batches WHERE pipeline LIKE 'old\\_%' ORDER BY id
        """))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE offset_ranges"))
    engine.dispose()
    return time.perf_counter() - started


# ---------------------------------------------------------------------------------------- report


def fmt_ms(seconds: float) -> str:
    return "inf" if seconds == float("inf") else f"{seconds * 1000:.1f}"


def print_steps(steps: list[dict]) -> None:
    print(f"{'method':>6} {'P':>4} {'K':>4} {'batches':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
          f" {'rows/s':>7} {'offered':>7} {'pg cores':>8} {'sim cores':>9} {'WAL B/batch':>11}"
          f" {'MB/1M rows':>10} {'max pend':>8} {'spilled':>7} {'setup s':>7}  top waits (samples)")
    for s in steps:
        waits = ", ".join(f"{w} {n}" for w, n in s["waits"][:4])
        print(f"{s['method']:>6} {s['pipelines']:>4} {s['partitions']:>4} {s['batches']:>7} {fmt_ms(s['p50']):>8}"
              f" {fmt_ms(s['p99']):>8} {fmt_ms(s['max']):>8} {s['rows_s']:>7.0f} {s['offered_rows_s']:>7.0f}"
              f" {s['pg_cores']:>8.2f} {s['sim_cores']:>9.2f} {s['wal_per_batch']:>11.0f}"
              f" {s['mb_per_million']:>10.0f} {s['max_pending']:>8} {s['spilled']:>7} {s['setup_s']:>7.1f}  {waits}")
        if s.get("record_calls"):
            print(f"       writer's ledger calls: {s['record_calls']}, p50 / p99 {fmt_ms(s['record_p50'])} /"
                  f" {fmt_ms(s['record_p99'])} ms; one-statement writes {s['fast_calls']}, p50 / p99"
                  f" {fmt_ms(s['fast_p50'])} / {fmt_ms(s['fast_p99'])} ms (the rest of batch -> durable: threads,"
                  " queue, CPU waits)")
        print(f"       the drivers' full garbage collections during the step: {s.get('full_gc', 0)}"
              f" (longest pause {fmt_ms(s.get('full_gc_max', 0.0))} ms; each driver ran one after its warm-up)")
        for q, calls, mean, total in s.get("statements") or []:
            print(f"       server: {calls:>6} x {mean:6.3f} ms = {total / 1000:6.2f} s  {q}")
        if s["unsettled"] or s["failed"] or s["retried"] or s["last_error"]:
            print(f"       unsettled {s['unsettled']}, retried {s['retried']}, failed {s['failed']},"
                  f" last error: {s['last_error']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("OFFSET_LEDGER_TEST_DSN"),
                        help="Postgres server (default: OFFSET_LEDGER_TEST_DSN); a fresh database is made on it")
    parser.add_argument("--pipelines", default="10,25,50,100,200", help="the ramp of P, comma separated")
    parser.add_argument("--partitions", type=int, default=100, help="K: partitions per batch")
    parser.add_argument("--interval", type=float, default=5.0, help="T: seconds between a pipeline's batches")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of batches per step")
    parser.add_argument("--methods", default="writer,naive")
    parser.add_argument("--ceiling", type=float, default=1.0, help="stop ramping a method when its p99 passes this (s)")
    parser.add_argument("--prefill", default="0", help="batch_offsets rows of history before the fleet, comma "
                                                       "separated: one fresh database per size")
    parser.add_argument("--beat-every", type=float, default=10.0,
                        help="the 'beat' method's driver heartbeat period in seconds (methods: writer, beat = the "
                             "writer with the listener's heartbeat thread, naive)")
    parser.add_argument("--json", help="also write the steps to this file")
    parser.add_argument("--own-server", action="store_true",
                        help="run on a throwaway PostgreSQL cluster of this machine's server (initdb) with "
                             "max_connections for the largest step and pg_stat_statements, instead of --dsn's")
    args = parser.parse_args(argv)
    own = None
    if args.own_server:
        per = 2 if "beat" in args.methods else 1
        own = OwnServer(per * max(int(p) for p in args.pipelines.split(",")) + 20)
        args.dsn = own.dsn
        print(f"bench_fleet: own PostgreSQL cluster on port {own.port} (max_connections "
              f"{per * max(int(p) for p in args.pipelines.split(',')) + 20}, fsync / full_page_writes / "
              "synchronous_commit off as the devstack's, pg_stat_statements)", flush=True)
    try:
        return _main(args)
    finally:
        if own is not None:
            own.stop()


def _main(args: argparse.Namespace) -> int:
    if not args.dsn:
        print("bench_fleet: give --dsn or set OFFSET_LEDGER_TEST_DSN (source .devstack/stack.env)", file=sys.stderr)
        return 2
    ramp = [int(p) for p in args.pipelines.split(",")]
    import _fleet_sim

    _fleet_sim.BEAT_EVERY[0] = args.beat_every
    methods = args.methods.split(",")
    print(f"bench_fleet: {os.cpu_count()} cores shared by Postgres and the simulated drivers (they compete for "
          f"CPU: 'sim cores' is what the drivers took from Postgres' share); K={args.partitions}, "
          f"T={args.interval:g} s, {args.duration:g} s of batches per step", flush=True)
    steps: list[dict] = []
    for fill in (int(x) for x in args.prefill.split(",")):
        scratch = ScratchDatabase(args.dsn, "bench_fleet")
        try:
            engine = make_engine(scratch.dsn, pool_size=1)
            upgrade(engine)
            with engine.connect() as conn:
                max_conn = int(conn.execute(text("SHOW max_connections")).scalar_one())
                conn.execute(text(NAIVE_TABLE))
                conn.commit()
            engine.dispose()
            if fill:
                took = prefill(scratch.dsn, fill)
                print(f"prefilled {fill:,} batch_offsets rows in {took:.0f} s", flush=True)
            stopped: dict[str, int] = {}
            with tempfile.TemporaryDirectory() as spool:
                for p in ramp:
                    per = 2 if "beat" in methods else 1  # the heartbeat's own connection
                    if per * p + 5 > max_conn:
                        print(f"P={p}: skipped, needs {per * p} + 5 connections and the server allows max_connections="
                              f"{max_conn} (one connection per driver; more drivers need a larger max_connections "
                              "or a pooler)", flush=True)
                        continue
                    for method in methods:
                        if method in stopped:
                            continue
                        step = run_step(method, scratch.dsn, p, args.partitions, args.interval, args.duration, spool)
                        step["prefill"] = fill
                        steps.append(step)
                        print_steps([step])
                        sys.stdout.flush()
                        if step["p99"] > args.ceiling:
                            stopped[method] = p
        finally:
            scratch.drop()
        if args.json:
            Path(args.json).write_text(json.dumps(steps, indent=1, default=str))

    print("\nall steps\n")
    print_steps(steps)
    print("\nside by side (p99 batch -> durable; naive = baseline)\n")
    print(f"{'prefill':>9} {'P':>4} {'writer p99':>10} {'naive p99':>10} {'naive/writer':>12} {'writer pg cores':>15}"
          f" {'naive pg cores':>14} {'WAL/batch w':>11} {'WAL/batch n':>11}")
    by = {(s["prefill"], s["pipelines"], s["method"]): s for s in steps}
    for fill, p in sorted({(s["prefill"], s["pipelines"]) for s in steps}):
        w, n = by.get((fill, p, "writer")), by.get((fill, p, "naive"))
        ratio = f"{n['p99'] / w['p99']:.1f}x" if w and n and w["p99"] > 0 else ""
        print(f"{fill:>9} {p:>4} {fmt_ms(w['p99']) if w else '':>10} {fmt_ms(n['p99']) if n else '':>10} {ratio:>12}"
              f" {w['pg_cores'] if w else float('nan'):>15.2f} {n['pg_cores'] if n else float('nan'):>14.2f}"
              f" {w['wal_per_batch'] if w else float('nan'):>11.0f} {n['wal_per_batch'] if n else float('nan'):>11.0f}")
    beaten = [(w, b) for (fill, p, m), b in by.items() if m == "beat"
              for w in [by.get((fill, p, "writer"))] if w is not None]
    if beaten:
        print(f"\nthe driver heartbeat (every {args.beat_every:g} s) beside the writer alone, same P\n")
        print(f"{'P':>4} {'writer p50/p99 ms':>18} {'+beat p50/p99 ms':>17} {'p99 ratio':>9} {'pg cores w/+b':>14}"
              f" {'WAL/batch w/+b':>15} {'beats':>7} {'skipped':>7}")
        for w, b in sorted(beaten, key=lambda x: x[0]["pipelines"]):
            print(f"{w['pipelines']:>4} {fmt_ms(w['p50']) + '/' + fmt_ms(w['p99']):>18}"
                  f" {fmt_ms(b['p50']) + '/' + fmt_ms(b['p99']):>17} {b['p99'] / w['p99']:>8.2f}x"
                  f" {w['pg_cores']:>6.2f}/{b['pg_cores']:<7.2f} {w['wal_per_batch']:>7.0f}/{b['wal_per_batch']:<7.0f}"
                  f" {b['beats']:>7} {b['beats_skipped']:>7}")
    print()
    for fill in sorted({s["prefill"] for s in steps}):
        for method in methods:
            mine = [s for s in steps if s["method"] == method and s["prefill"] == fill]
            if not mine:
                continue
            ok = [s["pipelines"] for s in mine if s["p99"] <= args.ceiling]
            over = [s["pipelines"] for s in mine if s["p99"] > args.ceiling]
            rate = args.partitions / args.interval
            if over and ok:
                ceiling = (f"ceiling {max(ok)} pipelines ({max(ok) * rate:,.0f} rows/s): p99 passed"
                           f" {args.ceiling:g} s at P={over[0]} ({over[0] * rate:,.0f} rows/s offered)")
            elif over:
                ceiling = f"p99 passed {args.ceiling:g} s at the first step, P={over[0]} ({over[0] * rate:,.0f} rows/s)"
            else:
                ceiling = f"no ceiling reached: p99 <= {args.ceiling:g} s up to P={max(ok)} ({max(ok) * rate:,.0f} rows/s)"
            print(f"prefill {fill:,}: {method}: {ceiling}")
    # The target: 200 pipelines x 100 partitions, one batch each per 5 s, p99 < 100 ms.
    target = [s for s in steps if s["method"] == "writer" and s["pipelines"] >= 200 and s["prefill"] == 0]
    missed = False
    if target:
        s = target[0]
        at_target_load = args.partitions == 100 and args.interval == 5
        missed = at_target_load and s["p99"] >= 0.1
        print(f"target 200 x 100 every 5 s: writer p99 {fmt_ms(s['p99'])} ms at {s['pipelines']} x {args.partitions}"
              f" every {args.interval:g} s ({'MISSED' if missed else 'met' if at_target_load else 'not this load'}:"
              " < 100 ms)")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
