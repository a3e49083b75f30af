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
