"""``offset-ledger watch``: record a pipeline's batches from its checkpoint's commit log (no listener).

For Scala, Java and SQL jobs, and drivers where a Python listener cannot be added: the same pass a
restart makes to reconcile (``offset_ledger.capture.reconcile``), every ``--interval`` seconds. Same
authority rules and tables as the listener; a job with both records each batch once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Optional

import typer

from offset_ledger.capture.reconcile import Reconciliation, watch
from offset_ledger.cli.connections import LedgerOptions
from offset_ledger.cli.option_groups import grouped
from offset_ledger.cli.positional import pipeline_and_checkpoint
from offset_ledger.errors import EXIT_UNAVAILABLE, ConfigError, InvalidInput
from offset_ledger.ledger.engine import check_connection, ensure_schema
from offset_ledger.operate.inputs import check_name
from offset_ledger.operate.operations import Operations

if TYPE_CHECKING:
    from offset_ledger.addresses import LedgerAddress


@grouped
def watch_cmd(
    pipeline: Optional[str] = typer.Argument(None, metavar="PIPELINE", show_default=False,
                                             help="The pipeline the batches belong to."),
    checkpoint: Optional[str] = typer.Argument(None, metavar="CHECKPOINT", show_default=False,
                                               help="The query's checkpoint location (a path, file: or fsspec URI)."),
    pipeline_option: Optional[str] = typer.Option(None, "--pipeline", hidden=True,
                                                  help="Deprecated: give the pipeline positionally."),
    consumer_group: Optional[str] = typer.Option(None, "--consumer-group",
                                                 help="Its consumer group (default: the pipeline's name)."),
    interval: float = typer.Option(5.0, "--interval", min=0.1, help="Seconds between two looks at the checkpoint."),
    once: bool = typer.Option(False, "--once", help="One pass, then exit (cron, tests)."),
    ledger: LedgerOptions = LedgerOptions(),
) -> None:
    """Record a pipeline's committed batches from its checkpoint, without the Python listener.

    Example: offset-ledger watch orders s3a://lake/checkpoints/orders/gen-3-1a2b3c4d
    """
    pipeline, checkpoint = pipeline_and_checkpoint(pipeline, checkpoint, pipeline_option, "watch")
    check_name("pipeline", pipeline)
    check_checkpoint_exists(checkpoint)  # before the ledger is touched: a typo records nothing, silently
    ops = Operations.open(ledger.address(create=True))  # the watcher writes: it creates its ledger
    engine = ops.engine
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
        ops.close()
    if once and not last.readable:
        raise typer.Exit(EXIT_UNAVAILABLE)  # the checkpoint could not be read (the line above says why)


def parse_watch_specs(items: list[str]) -> list[tuple[str, str]]:
    """``serve --watch PIPELINE=CHECKPOINT`` values as (pipeline, checkpoint); bad ones are usage errors."""
    out = []
    for item in items:
        pipeline, sep, checkpoint = item.partition("=")
        if not sep or not pipeline.strip() or not checkpoint.strip():
            raise ConfigError(f"--watch must be PIPELINE=CHECKPOINT, not {item!r}")
        check_checkpoint_exists(checkpoint.strip())
        out.append((check_name("pipeline", pipeline.strip()), checkpoint.strip()))
    return out


def check_checkpoint_exists(location: str) -> None:
    """A local checkpoint location (a path or ``file:``) must be a directory; remote ones are read as they come."""
    from pathlib import Path
    from urllib.parse import urlparse

    parsed = urlparse(location)
    if parsed.scheme not in ("", "file") and len(parsed.scheme) > 1:  # one letter: a Windows drive
        return
    path = Path(parsed.path if parsed.scheme == "file" else location)
    if not path.is_dir():
        what = "not a directory" if path.exists() else "no such directory"
        raise InvalidInput(f"checkpoint {location}: {what} (the query's checkpointLocation)", checkpoint=location)


def start_watchers(specs: list[tuple[str, str]], ledger: LedgerAddress) -> Callable[[], None]:
    """One watcher thread per (pipeline, checkpoint), every 5 s; returns the function that stops them all."""
    if not specs:
        return lambda: None

    ops = Operations.open(ledger)
    engine = ops.engine
    ensure_schema(engine)
    stop = threading.Event()
    threads = [threading.Thread(target=watch, args=(engine, checkpoint), name=f"offset-ledger-watch-{pipeline}",
                                kwargs={"pipeline": pipeline, "consumer_group": pipeline, "stop": stop},
                                daemon=True)
               for pipeline, checkpoint in specs]
    for t in threads:
        t.start()

    def stop_all() -> None:
        stop.set()
        for t in threads:
            t.join(10)
        ops.close()

    return stop_all


def register(app: typer.Typer) -> None:
    """Add ``watch`` to the command line."""
    app.command("watch")(watch_cmd)
