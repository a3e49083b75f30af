"""The whole product in one command: ``python -m offset_ledger.cli.demo`` (``make demo``, ``scripts/demo``).

It starts a real local stack in a temporary directory (Apache Kafka in KRaft mode; the ledger is
the embedded SQLite default unless ``--postgres``), produces a steady stream, runs a real PySpark
Structured Streaming pipeline with ``OffsetLedgerListener``, stops it, adds partitions and produces
more, restarts it as "version 2" from the ledger on a fresh checkpoint with ``start_from_ledger``,
proves that nothing was lost or read twice, and serves the REST API. Everything it started is
stopped, by pid, on exit, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from offset_ledger.addresses import KafkaAddress, LedgerAddress
from offset_ledger.cli.demo_stack import (
    ALL_PARTITIONS,
    DEMO_DIR,
    STATE_FILE,
    FIRST_PARTITIONS,
    PIPELINE,
    TOPIC,
    DemoStack,
    Options,
    Producer,
    Signals,
    down,
)
from offset_ledger.kafka.adapter import KafkaAdapter
from offset_ledger.ledger.demo_reads import batch_count, batches_by_app_version
from offset_ledger.ledger.queries import current_positions
from offset_ledger.operate.operations import Operations

log = logging.getLogger(__name__)

_MIN_V1_BATCHES = 3


class Demo(DemoStack):
    """One run of the demo: the story, told on ``DemoStack``'s stage."""

    def _stop_between_batches(self, query, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
        """Stop when no trigger is running, so no batch is cut off half-way (it would be re-read anyway)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and query.isActive and query.status.get("isTriggerActive"):
            time.sleep(0.05)
        query.stop()

    def _plan(self, app_version: str):  # type: ignore[no-untyped-def]
        from offset_ledger import start_from_ledger

        return start_from_ledger(
            PIPELINE, [TOPIC], bootstrap_servers=self.bootstrap,
            checkpoint_root=str(self.root / "checkpoints"), app_version=app_version,
            first_run="earliest", on_data_loss="fail", dsn=self.dsn)

    def _listener(self, app_version: str):  # type: ignore[no-untyped-def]
        from offset_ledger import OffsetLedgerListener

        listener = OffsetLedgerListener(dsn=self.dsn, pipeline=PIPELINE, app_version=app_version,
                                        spool_dir=self.root / "spool")
        self.spark.streams.addListener(listener)

        def remove() -> None:
            try:
                listener.close()
            finally:
                self.spark.streams.removeListener(listener)

        self.on_exit(f"listener of version {app_version}", remove)
        return listener

    def _start_query(self, plan, version: str, available_now: bool):  # type: ignore[no-untyped-def]
        reader = (
            self.spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("subscribe", TOPIC)
            .option("startingOffsets", plan.starting_offsets_json)
            .option("maxOffsetsPerTrigger", 600)  # several batches, each recorded
        )
        writer = (
            reader.load().selectExpr("CAST(value AS STRING) AS value", "partition", "offset")
            .writeStream.format("parquet").queryName(f"{PIPELINE}_v{version[0]}")
            .option("path", str(self.root / "output" / f"v{version[0]}"))
            .option("checkpointLocation", plan.checkpoint_location)
        )
        writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="2 seconds")
        query = writer.start()
        self.on_exit(f"query {query.name}", lambda: query.stop() if query.isActive else None)
        return query

    def _ledger(self):  # type: ignore[no-untyped-def]
        """The demo's ledger, opened where every command opens one (it exists: the listener made it)."""
        return Operations.open(LedgerAddress.resolve(self.dsn))

    def _positions(self) -> dict[int, int]:
        ops = self._ledger()
        engine = ops.engine
        try:
            with engine.connect() as conn:
                return {p.partition: p.next_offset for p in current_positions(conn, PIPELINE)}
        finally:
            ops.close()

    def _batches(self) -> int:
        ops = self._ledger()
        engine = ops.engine
        try:
            with engine.connect() as conn:
                return batch_count(conn, PIPELINE)
        except Exception:  # noqa: BLE001 - before the first batch the schema may not exist yet
            return 0
        finally:
            ops.close()

    def run_version_1(self) -> dict[int, int]:
        self.step("2. Version 1: a PySpark pipeline recording its offsets in the ledger")
        self.producer = Producer(self.bootstrap, TOPIC, self.o.rate)
        self.on_exit("producer", self.producer.stop)
        self.producer.start()
        self.say(f"producing a steady stream, about {self.o.rate} records/s")
        plan = self._plan("1.0")
        self.say(f"start_from_ledger (first run): startingOffsets={plan.starting_offsets_json}, "
                 f"checkpoint {plan.checkpoint_location}")
        listener = self._listener("1.0")
        query = self._start_query(plan, "1.0", available_now=False)
        # Run for the requested time, and at least until a few batches are in the ledger (Spark's
        # first batch can take a while on a busy machine).
        started = time.monotonic()
        deadline, give_up = started + self.o.v1_seconds, started + max(300.0, self.o.v1_seconds)
        with self.console.status("") as status:
            while True:
                recorded = self._batches()
                now = time.monotonic()
                if now >= deadline and recorded >= _MIN_V1_BATCHES:
                    break
                if now >= give_up:
                    raise RuntimeError(f"version 1 recorded only {recorded} batches in {now - started:.0f}s")
                status.update(f"version 1 running: produced {self.producer.produced:,}, "
                              f"batches in the ledger {recorded}, {max(0.0, deadline - now):.0f}s left")
                if query.exception() is not None:
                    raise RuntimeError(f"version 1 failed: {query.exception()}")
                time.sleep(1)
        self.producer.stop()
        self._stop_between_batches(query)
        if not listener.flush(60):
            raise RuntimeError(f"the listener did not make version 1's batches durable: {listener.health()}")
        positions = self._positions()
        self.say(f"stopped version 1 mid-stream after {self._batches()} batches; "
                 f"produced {self.producer.produced:,} so far")
        self.say(f"ledger positions (next offset to read): {json.dumps(positions)}")
        return positions

    def grow_topic(self) -> None:
        from kafka.admin import NewPartitions

        self.step("3. The topic grows while the pipeline is down")
        self.admin.create_partitions({TOPIC: NewPartitions(total_count=ALL_PARTITIONS)})
        self._wait_partitions(ALL_PARTITIONS)
        before = self.producer.produced
        self.producer.burst(self.o.more_records)
        self.say(f"added partitions: {FIRST_PARTITIONS} -> {ALL_PARTITIONS}; produced "
                 f"{self.producer.produced - before:,} more records (total {self.producer.produced:,})")

    def run_version_2(self, v1_positions: dict[int, int]) -> None:
        self.step("4. Version 2: restart from the ledger on a fresh checkpoint")
        plan = self._plan("2.0")
        self.say(f"start_from_ledger(app_version='2.0'): fresh checkpoint={plan.fresh_checkpoint} "
                 f"at {plan.checkpoint_location}")
        self.say(f"startingOffsets = [bold]{plan.starting_offsets_json}[/]")
        for finding in plan.findings:
            self.say(f"  finding: {finding.kind}: {finding.message}")
        for part, next_offset in v1_positions.items():
            assert plan.starting_offsets[TOPIC][str(part)] == next_offset, "restart must resume at the ledger"
        listener = self._listener("2.0")
        with self.console.status("version 2 catching up (availableNow) ..."):
            query = self._start_query(plan, "2.0", available_now=True)
            query.awaitTermination(600)
            if query.exception() is not None:
                raise RuntimeError(f"version 2 failed: {query.exception()}")
            if not listener.flush(60):
                raise RuntimeError(f"the listener did not make version 2's batches durable: {listener.health()}")
        self.say(f"version 2 read everything and stopped; ledger positions: {json.dumps(self._positions())}")

    def verify(self) -> bool:
        self.step("5. Nothing lost, nothing read twice")
        out = self.root / "output"
        frames = {v: self.spark.read.parquet(str(out / v)) for v in ("v1", "v2")}
        read = {v: df.count() for v, df in frames.items()}
        both = frames["v1"].unionByName(frames["v2"])
        total = read["v1"] + read["v2"]
        distinct = both.select("value").distinct().count()
        produced = self.producer.produced
        expected = {f"order-{i:07d}" for i in range(1, produced + 1)}
        seen = {r.value for r in both.select("value").distinct().collect()}
        missing, unexpected = len(expected - seen), len(seen - expected)
        per_partition = {r.partition: r["count"] for r in both.groupBy("partition").count().collect()}
        end_offsets = self._end_offsets()
        table = Table(title="records", show_lines=False)
        for col in ("produced", "v1 read", "v2 read", "total", "distinct", "dupes", "missing"):
            table.add_column(col, justify="right")
        table.add_row(*(f"{n:,}" for n in (produced, read["v1"], read["v2"], total, distinct,
                                            total - distinct, missing)))
        self.console.print(table)
        self.say("per partition read / log-end offset: " + ", ".join(
            f"{p}: {per_partition.get(p, 0)}/{end_offsets[p]}" for p in sorted(end_offsets)))
        ok = (total == distinct == produced and missing == 0 and unexpected == 0
              and all(per_partition.get(p, 0) == end for p, end in end_offsets.items())
              and self._positions() == end_offsets)
        self.say("[bold green]OK: every produced record was read exactly once across the upgrade"
                 if ok else "[bold red]MISMATCH: see the table above")
        self._ledger_summary()
        return ok

    def _ledger_summary(self) -> None:
        """The same story told by the ledger, with the audit view of docs/audit.md."""
        ops = self._ledger()
        try:
            with ops.engine.connect() as conn:
                rows = batches_by_app_version(conn, PIPELINE)
        finally:
            ops.close()
        table = Table(title="the ledger (SQL over the v_batch_history audit view)")
        for col in ("app version", "batches", "first batch", "last batch"):
            table.add_column(col)
        for row in rows:
            table.add_row(str(row.app_version), str(row.batches), str(row.first_batch)[:19],
                          str(row.last_batch)[:19])
        self.console.print(table)

    def _end_offsets(self) -> dict[int, int]:
        with KafkaAdapter.open(KafkaAddress(self.bootstrap)) as adapter:
            marks = adapter.watermarks([TOPIC])
        return {tp.partition: wm.log_end_offset for tp, wm in marks.items()}


    def run(self) -> bool:
        self.start_stack()
        self.create_topic()
        self.start_spark()
        v1_positions = self.run_version_1()
        self.grow_topic()
        self.run_version_2(v1_positions)
        ok = self.verify()
        self.serve()
        return ok


def parse_args(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m offset_ledger.cli.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--keep-serving", action="store_true", help="keep the API up until Ctrl-C")
    parser.add_argument("--postgres", action="store_true",
                        help="start PostgreSQL for the ledger instead of the embedded SQLite file")
    parser.add_argument("--rate", type=int, default=200, help="records per second while version 1 runs")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long version 1 runs")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="keep state here (default: ./.demo, or with --clean a temp dir, removed)")
    parser.add_argument("--clean", action="store_true",
                        help="stop everything and delete the work dir at the end (default: leave the ledger, "
                             "Kafka and the API up to explore; make demo-down stops them)")
    parser.add_argument("--down", action="store_true", help="stop a demo left up and delete its work dir")
    args = parser.parse_args(argv)
    return Options(keep_serving=args.keep_serving, postgres=args.postgres, rate=args.rate,
                   v1_seconds=args.seconds, workdir=args.workdir,
                   leave_up=not (args.clean or args.keep_serving), down=args.down)


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    console = Console()
    if options.down:
        console.print(down(options.workdir))
        return 0
    if options.leave_up and (options.workdir or DEMO_DIR).resolve().joinpath(STATE_FILE).is_file():
        console.print(down(options.workdir))  # the previous demo left up: this run replaces it
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.ERROR)  # kafka-python's event-loop timing chatter
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # everything here is on loopback
    # The demo's own ledger and cluster, whatever the shell exports.
    for var in ("OFFSET_LEDGER_DSN", "OFFSET_LEDGER_TEST_DSN"):
        os.environ.pop(var, None)
    signals = Signals()
    demo = Demo(options, console, signals)
    if options.workdir is None or options.leave_up:
        demo.on_exit(f"work dir {demo.root}", lambda: shutil.rmtree(demo.root, ignore_errors=True), left_up=True)
    started = time.monotonic()
    console.rule("[bold]offset-ledger demo")
    ok = False
    with signals.installed():
        try:
            ok = demo.run()
        except KeyboardInterrupt:
            console.print("[yellow]interrupted: stopping everything the demo started")
            demo.close()
            return 130
        except Exception as exc:  # noqa: BLE001 - one readable line, then clean up
            console.print(f"[bold red]demo failed: {type(exc).__name__}: {exc}")
            if os.environ.get("OFFSET_LEDGER_DEMO_TRACEBACK"):
                console.print_exception()
            demo.close()
            return 1
        demo.close(leave_up=options.leave_up)  # Spark, the producer, the listeners; not what is left up
        if options.leave_up:
            demo.leave(ok)
    console.rule(f"[bold]{'done' if ok else 'FAILED'} in {time.monotonic() - started:.0f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
