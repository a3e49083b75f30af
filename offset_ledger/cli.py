"""The ``offset-ledger`` command: a thin face over the same functions the REST API uses."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from offset_ledger import __version__
from offset_ledger.errors import OffsetLedgerError

app = typer.Typer(
    name="offset-ledger",
    help="An external, auditable Kafka offset ledger for PySpark Structured Streaming.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
db_app = typer.Typer(help="Ledger database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")

DsnOption = typer.Option(None, "--dsn", envvar="OFFSET_LEDGER_DSN",
                         help="Ledger database URL (default: the embedded SQLite file).")

_state = {"traceback": False}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"offset-ledger {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    traceback: bool = typer.Option(False, "--traceback", help="Show the full traceback on errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    _state["traceback"] = traceback


@db_app.command("upgrade")
def db_upgrade(dsn: Optional[str] = DsnOption, revision: str = typer.Option("head", help="Target revision.")) -> None:
    """Create or upgrade the ledger schema (Alembic migrations)."""
    from offset_ledger.ledger.engine import current_revision, make_engine, upgrade

    engine = make_engine(dsn)
    upgrade(engine, revision)
    typer.echo(f"ledger schema at revision {current_revision(engine)} ({engine.url.render_as_string()})")


@app.command("prune")
def prune_cmd(
    older_than: str = typer.Option(..., "--older-than", help="Age of history to remove: 30d, 12h, 90m."),
    execute: bool = typer.Option(False, "--execute", help="Delete for real (default: dry run, counts only)."),
    pipeline: Optional[str] = typer.Option(None, "--pipeline", help="Only this pipeline's history."),
    chunk_size: int = typer.Option(20_000, "--chunk-size", min=1, help="Rows deleted per transaction."),
    dsn: Optional[str] = DsnOption,
) -> None:
    """Remove old batch history; positions, resets, findings and each partition's latest batch stay."""
    from offset_ledger.ledger.engine import check_connection, make_engine
    from offset_ledger.ledger.prune import parse_duration, prune

    age = parse_duration(older_than)  # bad input fails before any connection is made
    engine = make_engine(dsn)
    check_connection(engine)

    def _progress(table: str, done: int, total: int) -> None:
        typer.echo(f"  {table}: deleted {done:,} of {total:,}", err=True)

    report = prune(engine, age, pipeline=pipeline, execute=execute, chunk_size=chunk_size,
                   progress=_progress)
    verb = "deleted" if report.executed else "would delete"
    scope = f" of pipeline {pipeline!r}" if pipeline else ""
    typer.echo(f"history{scope} older than {older_than} (before {report.cutoff.isoformat(timespec='seconds')}):")
    for name, counts in (("batches", report.batches), ("batch_offsets", report.batch_offsets)):
        typer.echo(f"  {name:<14} {verb} {counts.deleted:>12,}  kept {counts.kept:,} of {counts.older:,} old rows")
    typer.echo("  kept always: every position, reset and finding, and each partition's latest batch")
    if not report.executed:
        typer.echo("dry run: nothing deleted; add --execute to delete")
    else:
        typer.echo(f"done in {report.seconds:.1f}s")


@app.command("resolve")
def resolve_cmd(
    pipeline: str = typer.Argument(..., help="Pipeline name in the ledger."),
    topic: Optional[list[str]] = typer.Option(None, "--topic", "-t", help="Topic the pipeline subscribes to (repeatable)."),
    pattern: Optional[str] = typer.Option(None, "--pattern", help="Topic regex, like subscribePattern (instead of --topic)."),
    bootstrap_servers: Optional[str] = typer.Option(None, "--bootstrap-servers", envvar="OFFSET_LEDGER_BOOTSTRAP_SERVERS",
                                                    help="Kafka bootstrap servers."),
    first_run: str = typer.Option("earliest", "--first-run",
                                  help="No ledger entries: earliest | latest | timestamp (ISO-8601 or epoch ms) | JSON offsets."),
    on_data_loss: str = typer.Option("fail", "--on-data-loss", help="Offsets outside the log: fail | earliest."),
    consumer_group: Optional[str] = typer.Option(None, "--consumer-group", help="Default: the pipeline name."),
    kafka_option: Optional[list[str]] = typer.Option(None, "--kafka-option", "-o",
                                                     help="Spark-style client setting, e.g. kafka.security.protocol=SSL (repeatable)."),
    dsn: Optional[str] = DsnOption,
) -> None:
    """Print the startingOffsets JSON a restart would use (stdout) and the findings (stderr); writes nothing."""
    from offset_ledger.errors import ConfigError
    from offset_ledger.kafka import KafkaAdapter
    from offset_ledger.ledger.engine import make_engine
    from offset_ledger.restart import plan_restart

    options: dict[str, str] = {}
    for item in kafka_option or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--kafka-option must be KEY=VALUE, not {item!r}")
        options[key.strip()] = value
    servers = bootstrap_servers or options.get("kafka.bootstrap.servers")
    if not servers:
        raise ConfigError("no Kafka bootstrap servers (--bootstrap-servers or OFFSET_LEDGER_BOOTSTRAP_SERVERS)")
    engine = make_engine(dsn)
    try:
        with KafkaAdapter(servers, options) as adapter:
            plan, ledger = plan_restart(engine, adapter, pipeline=pipeline, consumer_group=consumer_group,
                                        topics=topic or None, topic_pattern=pattern, first_run=first_run,
                                        on_data_loss=on_data_loss)
    finally:
        engine.dispose()
    typer.echo(plan.starting_offsets_json)
    for finding in plan.findings:
        where = f" {finding.topic}/{finding.partition}" if finding.topic is not None else ""
        typer.echo(f"{finding.kind}{where}: {finding.message}", err=True)
    if ledger.pending_reset_ids:
        ids = ", ".join(str(i) for i in ledger.pending_reset_ids)
        typer.echo(f"pending reset(s) {ids}: included above; they take effect through start_from_ledger's "
                   "fresh checkpoint", err=True)


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: user-facing errors print one line and exit 2; --traceback shows more."""
    try:
        app(args=argv, standalone_mode=False)
    except OffsetLedgerError as exc:
        if _state["traceback"]:
            raise
        print(f"offset-ledger: error: {' '.join(exc.message.split())}", file=sys.stderr)
        sys.exit(2)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:  # click usage errors
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(2)
        raise
