"""``offset-ledger watch``: record a pipeline's batches from its checkpoint's commit log (no listener).

For Scala, Java and SQL jobs, and drivers where a Python listener cannot be added: the same pass a
restart makes to reconcile (``offset_ledger.reconcile``), every ``--interval`` seconds. Same
authority rules and tables as the listener; a job with both records each batch once.
"""

from __future__ import annotations

import signal
import threading
from typing import Optional

import typer

from offset_ledger.cli_support import DsnOption


def watch_cmd(
    checkpoint: str = typer.Argument(..., metavar="CHECKPOINT",
                                     help="The query's checkpoint location (a path, file: or fsspec URI)."),
    pipeline: str = typer.Option(..., "--pipeline", help="The pipeline the batches belong to."),
    consumer_group: Optional[str] = typer.Option(None, "--consumer-group",
                                                 help="Its consumer group (default: the pipeline's name)."),
    interval: float = typer.Option(5.0, "--interval", min=0.1, help="Seconds between two looks at the checkpoint."),
    once: bool = typer.Option(False, "--once", help="One pass, then exit (cron, tests)."),
    dsn: Optional[str] = DsnOption,
) -> None:
    """Record a pipeline's committed batches from its checkpoint, without the Python listener.

    Example: offset-ledger watch s3a://lake/checkpoints/orders/gen-3-1a2b3c4d --pipeline orders
    """
    from offset_ledger.inputs import check_name
    from offset_ledger.ledger.engine import check_connection, ensure_schema, make_engine
    from offset_ledger.reconcile import Reconciliation, watch

    check_name("pipeline", pipeline)
    engine = make_engine(dsn)
    check_connection(engine)
    ensure_schema(engine)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def report(done: Reconciliation) -> None:
        if done.backfilled:
            typer.echo(f"{pipeline}: recorded batch(es) {', '.join(map(str, done.backfilled))} of query "
                       f"{done.query_id} (checkpoint's last commit: {done.checkpoint_batch_id})")
        for finding in done.findings:
            if finding.kind != "backfilled":
                typer.echo(f"{pipeline}: {finding.kind}: {finding.message}", err=True)

    try:
        last = watch(engine, checkpoint, pipeline=pipeline, consumer_group=consumer_group or pipeline,
                     interval_s=interval, stop=stop, once=once, on_pass=report)
    except KeyboardInterrupt:
        return
    finally:
        signal.signal(signal.SIGTERM, previous)
        engine.dispose()
    if once and not last.readable:
        from offset_ledger.errors import EXIT_UNAVAILABLE

        raise typer.Exit(EXIT_UNAVAILABLE)  # the checkpoint could not be read (the line above says why)


def register(app: typer.Typer) -> None:
    """Add ``watch`` to the command line."""
    app.command("watch")(watch_cmd)
