"""Benchmark: resolve startingOffsets for many partitions end to end (target: 10,000 in under 0.3 s).

Creates ``--topics`` x ``--partitions`` topics on a real broker, a fresh Postgres database with a
ledger position for every partition, then times:

- ``start_from_ledger`` end to end, cold (new engine, new Kafka client, schema check, generation);
- the warm steps separately: the ledger query, the broker round trips (metadata + log-start and
  log-end offsets) and the pure resolver.

Run against the devstack (``source .devstack/stack.env``)::

    .venv/bin/python benchmarks/bench_resolve.py --topics 100 --partitions 100

Topics and the database are deleted afterwards unless ``--keep``.

``--rounds N`` then times N more cold restarts on a new generation (each an upgrade: a new
``app_version``), each in a fresh process; with ``--baseline-tree DIR`` (a checkout of the commit to
compare with, e.g. ``git archive <commit> | tar -x -C DIR``) they alternate between that code and
this one over the same topics and positions (the baseline in its own database, its schema made by its code), and the medians are printed side by side. The exit
status then follows the median of this code's rounds.

Broker safety: every partition keeps file descriptors open on the broker (about two), and a deleted
partition keeps them until ``file.delete.delay.ms`` (60 s by default) has passed. Running this
twice back to back on the devstack broker (fd limit 20,000) once held ~20,000 partitions' files and
the broker halted with "Too many open files". Hence: the run refuses to start when the cluster
already holds more than ``--max-broker-partitions`` partitions in total, and after deleting its
topics it waits ``--cooldown`` seconds so a following run cannot overlap with the pending deletes.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

TARGET_SECONDS = 0.3
# Before the one-look cluster snapshot (kafka-python's consumer calls), this machine, 10,000 partitions.
BASELINE_MS = {"cold": 780.0, "warm": 500.0, "broker": 427.0, "ledger": 61.0, "resolve": 8.0}


class _Phases(logging.Handler):
    """Collects start_from_ledger's own DEBUG split (schema / plan / generation; ledger / cluster / resolve)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "ms" in record.getMessage():
            self.lines.append(record.getMessage())

    def take(self) -> list[str]:
        out, self.lines = self.lines, []
        return out


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _cold_worker(args: argparse.Namespace) -> int:
    """One cold restart on a new generation (a new app_version) and one reusing it, in this fresh process."""
    import json

    from kafka import KafkaAdminClient  # noqa: F401 - the modules main() has imported before its cold figure

    from offset_ledger.kafka.adapter import KafkaAdapter
    from offset_ledger.ledger.engine import ensure_schema, make_engine
    from offset_ledger.operate.restart import start_from_ledger

    # Cold as in main(): a new engine, Kafka client and schema check, in a process whose modules are
    # imported (importing kafka-python and Alembic the first time costs ~300 ms more here).
    engine = make_engine(args.admin_dsn)
    ensure_schema(engine)
    engine.dispose()
    with KafkaAdapter(args.bootstrap_servers) as probe:
        probe.all_topics()
    topics = args.worker_topics.split(",")
    phases = _Phases()
    for name in ("offset_ledger.operate.restart", "offset_ledger.operate.restart_plan"):
        logging.getLogger(name).addHandler(phases)
        logging.getLogger(name).setLevel(logging.DEBUG)
    profile = None
    if os.environ.get("BENCH_PROFILE"):  # a cProfile of the new-generation restart, written there
        import cProfile

        profile = cProfile.Profile()
        profile.enable()
    new, plan = _timed(lambda: start_from_ledger(
        "bench", topics, bootstrap_servers=args.bootstrap_servers, checkpoint_root=args.worker_root,
        dsn=args.admin_dsn, app_version=args.worker_version))
    if profile is not None:
        profile.disable()
        profile.dump_stats(f"{os.environ['BENCH_PROFILE']}.{args.worker_version}")
    assert plan.fresh_checkpoint
    split = phases.take()
    reuse, plan = _timed(lambda: start_from_ledger(
        "bench", topics, bootstrap_servers=args.bootstrap_servers, checkpoint_root=args.worker_root,
        dsn=args.admin_dsn, app_version=args.worker_version))
    assert not plan.fresh_checkpoint
    print(json.dumps({"new": new * 1000, "reuse": reuse * 1000, "split": split}))
    return 0


def _cold_rounds(args: argparse.Namespace, dsn: str, topics: list[str], root: str,
                 baseline_dsn: str | None = None) -> dict[str, list[dict[str, Any]]]:
    import json
    import subprocess

    sides = [("baseline", args.baseline_tree), ("now", None)] if args.baseline_tree else [("now", None)]
    dsn_of = {"baseline": baseline_dsn or dsn, "now": dsn}
    out: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in sides}
    for r in range(args.rounds):
        for label, tree in (sides if r % 2 == 0 else sides[::-1]):  # alternate who goes first
            env = dict(os.environ)
            if tree:
                env["BENCH_CODE_ROOT"] = os.path.abspath(tree)
                env["PYTHONPATH"] = env["BENCH_CODE_ROOT"] + os.pathsep + env.get("PYTHONPATH", "")
            done = subprocess.run(
                [sys.executable, __file__, "--cold-worker", "--admin-dsn", dsn_of[label], "--bootstrap-servers",
                 args.bootstrap_servers, "--worker-topics", ",".join(topics), "--worker-root", root,
                 "--worker-version", f"{label}-{r}"], env=env, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                raise SystemExit(f"cold worker failed ({label}):\n{done.stderr[-3000:]}")
            one = json.loads(done.stdout.strip().splitlines()[-1])
            out[label].append(one)
            print(f"  round {r + 1} {label:>8}: new generation {one['new']:6.1f} ms, reuse {one['reuse']:6.1f} ms  "
                  + " | ".join(one["split"]), file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5, help="warm repetitions (median reported)")
    parser.add_argument("--bootstrap-servers", default=os.environ.get("OFFSET_LEDGER_TEST_BOOTSTRAP_SERVERS"))
    parser.add_argument("--admin-dsn", default=os.environ.get("OFFSET_LEDGER_TEST_DSN"),
                        help="Postgres URL allowed to CREATE DATABASE (default: OFFSET_LEDGER_TEST_DSN)")
    parser.add_argument("--keep", action="store_true", help="keep the topics and database")
    parser.add_argument("--settle", type=float, default=20.0,
                        help="seconds to let the broker finish creating the partitions before timing "
                             "(a restart meets topics that exist since long, not ones created a second ago)")
    parser.add_argument("--max-broker-partitions", type=int, default=12_000,
                        help="refuse to run when existing + new partitions would exceed this")
    parser.add_argument("--cooldown", type=float, default=65.0,
                        help="seconds to wait after deleting the topics (broker's file.delete.delay.ms + margin)")
    parser.add_argument("--rounds", type=int, default=0,
                        help="more cold restarts on a new generation, each in a fresh process (median reported)")
    parser.add_argument("--baseline-tree", help="a checkout of the code to compare with (rounds alternate)")
    for hidden in ("--worker-topics", "--worker-root", "--worker-version"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--cold-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cold_worker:
        return _cold_worker(args)
    if not args.bootstrap_servers or not args.admin_dsn:
        parser.error("needs --bootstrap-servers and --admin-dsn (or source .devstack/stack.env)")

    from _scratch import ScratchDatabase
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from sqlalchemy import insert

    from offset_ledger.errors import KafkaError
    from offset_ledger.kafka.adapter import KafkaAdapter
    from offset_ledger.ledger.engine import ensure_schema, make_engine
    from offset_ledger.ledger import position_store
    from offset_ledger.ledger.position_store import Placed
    from offset_ledger.ledger.tables import positions_legacy
    from offset_ledger.operate.restart import start_from_ledger
    from offset_ledger.operate.restart_plan import read_cluster, read_ledger, select_topics
    from offset_ledger.rules.restart_options import GroupRef, RestartOptions
    from offset_ledger.rules.resolver import resolve

    run = uuid.uuid4().hex[:6]
    topics = [f"bench_resolve_{run}_{i:03d}" for i in range(args.topics)]
    n_partitions = args.topics * args.partitions
    pipeline = "bench"
    admin = KafkaAdminClient(bootstrap_servers=args.bootstrap_servers, request_timeout_ms=120_000)
    with KafkaAdapter(args.bootstrap_servers) as probe:
        existing = sum(len(p) for p in probe.partitions(sorted(probe.all_topics())).values())
    if existing + n_partitions > args.max_broker_partitions:
        admin.close()
        raise SystemExit(f"refusing: the cluster already has {existing:,} partitions; adding {n_partitions:,} "
                         f"exceeds --max-broker-partitions={args.max_broker_partitions:,} (broker file descriptors)")
    scratch = ScratchDatabase(args.admin_dsn, "bench_resolve")
    try:
        t_create, _ = _timed(lambda: [admin.create_topics([NewTopic(t, args.partitions, 1) for t in topics[i:i + 10]])
                                      for i in range(0, len(topics), 10)])
        print(f"setup: created {args.topics} topics x {args.partitions} partitions = {n_partitions:,} "
              f"partitions in {t_create:.1f}s", file=sys.stderr)
        dsn = scratch.dsn
        engine = make_engine(dsn)
        ensure_schema(engine)
        now = datetime.now(timezone.utc)
        with engine.begin() as conn:  # one row per topic since 0024
            position_store.write(conn, pipeline, pipeline, {
                (t, p): Placed(0, now) for t in topics for p in range(args.partitions)})

        # Wait until the broker reports every partition (creation is asynchronous).
        deadline = time.monotonic() + 300
        with KafkaAdapter(args.bootstrap_servers) as adapter:
            while True:
                try:
                    if len(adapter.watermarks(topics)) == n_partitions:
                        break
                except KafkaError:
                    pass  # leaders still loading their new partitions (NOT_LEADER_OR_FOLLOWER)
                if time.monotonic() > deadline:
                    raise SystemExit("the broker did not report every partition within 300 s")
                time.sleep(1)

        print(f"setup: every partition answers; settling {args.settle:.0f}s", file=sys.stderr)
        time.sleep(args.settle)
        root = tempfile.mkdtemp(prefix="bench-resolve-")
        phases = _Phases()
        for name in ("offset_ledger.operate.restart", "offset_ledger.operate.restart_plan"):
            restart_log = logging.getLogger(name)
            restart_log.addHandler(phases)
            restart_log.setLevel(logging.DEBUG)
        cold, plan = _timed(lambda: start_from_ledger(
            pipeline, topics, bootstrap_servers=args.bootstrap_servers, checkpoint_root=root, dsn=dsn,
            app_version="1"))
        assert sum(len(v) for v in plan.starting_offsets.values()) == n_partitions
        cold_split = phases.take()
        reuse, plan = _timed(lambda: start_from_ledger(
            pipeline, topics, bootstrap_servers=args.bootstrap_servers, checkpoint_root=root, dsn=dsn,
            app_version="1"))
        assert not plan.fresh_checkpoint
        reuse_split = phases.take()
        restart_log.removeHandler(phases)

        ledger_s: list[float] = []
        broker_s: list[float] = []
        resolve_s: list[float] = []
        with KafkaAdapter(args.bootstrap_servers) as adapter:
            adapter.all_topics()  # connect once; warm figures exclude the TCP/bootstrap handshake
            for _ in range(args.repeat):
                t, ledger = _timed(lambda: read_ledger(engine, GroupRef(pipeline, pipeline, named=True), topics))
                ledger_s.append(t)
                wanted = RestartOptions(topics=tuple(topics))
                t, cluster = _timed(lambda: read_cluster(adapter, select_topics(adapter, wanted)))
                broker_s.append(t)
                t, warm_plan = _timed(lambda: resolve(pipeline, topics, ledger.positions, cluster.watermarks))
                resolve_s.append(t)
                assert warm_plan.starting_offsets == plan.starting_offsets
        engine.dispose()
        med = {k: statistics.median(v) for k, v in
               (("ledger", ledger_s), ("broker", broker_s), ("resolve", resolve_s))}
        warm_total = sum(med.values())
        b = BASELINE_MS
        print(f"resolve {n_partitions:,} partitions ({args.topics} topics x {args.partitions}), "
              f"local broker and Postgres; target {TARGET_SECONDS * 1000:.0f} ms; baseline = before the one-look snapshot")
        print(f"  {'':48} {'now':>9} {'baseline':>9} {'now/base':>9} {'/target':>8}")

        def row(label: str, ms: float, base: float | None, target: bool = False) -> None:
            ratio = f"{ms / base:8.2f}x" if base else f"{'':9}"
            tgt = f"{ms / (TARGET_SECONDS * 1000):7.2f}x" if target else ""
            base_txt = f"{base:7.0f}ms" if base else f"{'':9}"
            print(f"  {label:48} {ms:7.1f}ms {base_txt} {ratio} {tgt}")

        row("start_from_ledger cold, new generation", cold * 1000, b["cold"], True)
        row("start_from_ledger cold, reuse generation", reuse * 1000, None, True)
        row(f"warm, median of {args.repeat}: ledger query", med["ledger"] * 1000, b["ledger"])
        row("warm: broker (one metadata + ListOffsets)", med["broker"] * 1000, b["broker"])
        row("warm: pure resolver", med["resolve"] * 1000, b["resolve"])
        row("warm: total", warm_total * 1000, b["warm"], True)
        print("  cold split (start_from_ledger's own DEBUG log):")
        for line in cold_split + reuse_split:
            print(f"    {line}")
        if not args.rounds:
            return 0 if cold <= TARGET_SECONDS else 1
        baseline_dsn = None
        if args.baseline_tree:
            # The baseline's own database with the same positions, its schema made by its own code: a
            # schema revision this code added (0008) is unknown there, and the rounds compare code and
            # schema together.
            import subprocess

            base_scratch = ScratchDatabase(args.admin_dsn, "bench_resolve_base")
            baseline_dsn = base_scratch.dsn
            tree = os.path.abspath(args.baseline_tree)
            subprocess.run([sys.executable, "-c", "import sys; from offset_ledger.ledger.engine import ensure_schema, "
                            "make_engine; ensure_schema(make_engine(sys.argv[1]))", baseline_dsn], check=True, cwd=tree,
                           env={**os.environ, "PYTHONPATH": tree + os.pathsep + os.environ.get("PYTHONPATH", "")})
            base_engine = make_engine(baseline_dsn)
            with base_engine.begin() as conn:  # the per-partition table of a baseline before 0024
                conn.execute(insert(positions_legacy), [
                    {"pipeline": pipeline, "consumer_group": pipeline, "topic": t, "partition": p,
                     "next_offset": 0, "updated_at": now} for t in topics for p in range(args.partitions)])
            base_engine.dispose()
        try:
            rounds = _cold_rounds(args, dsn, topics, root, baseline_dsn)
        finally:
            if baseline_dsn and not args.keep:
                base_scratch.drop()
        print(f"  cold restarts on a new generation (an upgrade), {args.rounds} rounds, each in a fresh process; "
              "median [range]:")
        med = {}
        for label, runs in rounds.items():
            med[label] = {k: statistics.median(x[k] for x in runs) for k in ("new", "reuse")}
            print(f"    {label:>8}: new generation {med[label]['new']:6.1f} ms "
                  f"[{min(x['new'] for x in runs):.0f}-{max(x['new'] for x in runs):.0f}], reuse "
                  f"{med[label]['reuse']:6.1f} ms [{min(x['reuse'] for x in runs):.0f}-{max(x['reuse'] for x in runs):.0f}]")
        if "baseline" in med:
            print(f"    now / baseline: new generation {med['now']['new'] / med['baseline']['new']:.2f}x, "
                  f"reuse {med['now']['reuse'] / med['baseline']['reuse']:.2f}x")
        print(f"    now / target: new generation {med['now']['new'] / (TARGET_SECONDS * 1000):.2f}x, "
              f"reuse {med['now']['reuse'] / (TARGET_SECONDS * 1000):.2f}x")
        return 0 if med["now"]["new"] <= TARGET_SECONDS * 1000 else 1
    finally:
        if not args.keep:
            try:
                for i in range(0, len(topics), 20):
                    admin.delete_topics(topics[i:i + 20], timeout_ms=120_000)
            except Exception as exc:  # noqa: BLE001 - best effort cleanup; report and go on
                print(f"cleanup: could not delete every topic: {exc}", file=sys.stderr)
            scratch.drop()
            # Deleted partitions keep their files open until file.delete.delay.ms has passed.
            print(f"cleanup: waiting {args.cooldown:.0f}s for the broker to close the deleted partitions' files",
                  file=sys.stderr)
            time.sleep(args.cooldown)
        admin.close()


if __name__ == "__main__":
    raise SystemExit(main())
