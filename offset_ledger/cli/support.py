"""What every ``offset-ledger`` command shares: the output options (table, CSV, JSON) with
terminal-safe names, the truncation signal of machine formats, and input checks (``--dsn``, ``--limit``).
The ledger and Kafka options are ``cli/connections.py``'s.

Kept apart from ``cli.py`` so that commands living in their own modules (``cli_audit``,
``cli_reset``) use the same options and the same output without importing the command module.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from offset_ledger.cli.table import PROSE, render
from offset_ledger.errors import ConfigError, InvalidInput, OffsetLedgerError
from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.operate.answers import error_answer, iso_utc
from offset_ledger.operate.inputs import check_limit as check
from offset_ledger.operate.known import require_group, require_pipeline

def plain_help() -> None:
    """Usage lines say ``PIPELINE``, not Typer's ``{pipeline}``, and arguments show no ``<str>`` placeholder."""
    from typer import core

    argument = getattr(core, "TyperArgument", None)
    if argument is None or not hasattr(argument, "_usage_display_name"):
        return  # another Typer: its own (click's) rendering is already plain

    def usage(self: Any) -> str:
        name = str(self.display_name_raw).upper()
        return (name if self.required else f"[{name}]") + ("..." if self.nargs != 1 else "")

    argument._usage_display_name = usage
    argument.display_type_rich = lambda self, ctx: None
    option = getattr(core, "TyperOption", None)
    if option is not None and hasattr(option, "display_type_rich"):
        shown = option.display_type_rich

        def metavar(self: Any, ctx: Any) -> str | None:
            # An option without its own metavar is named after itself (--since SINCE), never <str>.
            if self.metavar is None and not self.is_flag and self.opts:
                return max(self.opts, key=len).lstrip("-").replace("-", "_").upper()
            return shown(self, ctx)

        option.display_type_rich = metavar


FORMATS = ("table", "json", "csv")

# What people write for a database URL and what SQLAlchemy wants instead (the scheme, before "://").
_SCHEME_HINTS = {
    "postgres": "postgresql+psycopg2", "postgresql": "postgresql+psycopg2", "pg": "postgresql+psycopg2",
    "psql": "postgresql+psycopg2", "postgresql+psycopg": "postgresql+psycopg2", "sqlite3": "sqlite",
}


def check_dsn(dsn: Optional[str]) -> Optional[str]:
    """``--dsn`` / ``OFFSET_LEDGER_DSN`` checked for the common mistakes before anything connects: a
    ``postgres://`` scheme SQLAlchemy cannot load, and ``sqlite:///tmp/x`` (three slashes: the
    relative path ``tmp/x``) where an absolute path was meant. ConfigError (exit 2) with what to write."""
    if not dsn or "://" not in dsn:
        return dsn
    scheme, rest = dsn.split("://", 1)
    wanted = _SCHEME_HINTS.get(scheme.lower())
    if wanted is not None and not (scheme == "postgresql" and _has_module("psycopg2")):
        raise ConfigError(f"database URL scheme {scheme + '://'!r} is not one SQLAlchemy loads here: write "
                          f"{wanted}://{_redacted(rest)}", dsn=_redacted(dsn))
    if scheme.lower() == "sqlite" and rest.startswith("/") and not rest.startswith("//"):
        relative = rest[1:].split("?", 1)[0]  # sqlite:///a/b names a/b, relative to the current directory
        parts = Path(relative).parts
        if relative and relative != ":memory:" and len(parts) > 1 and not Path(parts[0]).is_dir() \
                and Path("/", parts[0]).is_dir():
            raise ConfigError(f"{dsn!r} names the relative path {relative} (no directory {parts[0]!r} here); an "
                              f"absolute path needs four slashes: sqlite:////{relative}", dsn=dsn)
    return dsn


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _redacted(text: str) -> str:
    """``user:secret@host`` -> ``user:***@host``: an error line must not print a password."""
    return re.sub(r"(?<=:)[^:@/]*(?=@)", "***", text)


ConsumerGroup = Annotated[Optional[str], typer.Option(
    "--consumer-group", metavar="GROUP", help="Default: the pipeline's only group (an error when it has several).")]
Format = Annotated[str, typer.Option("--format", "-f", metavar="table|json|csv", help="Output format.")]
NoTruncate = Annotated[bool, typer.Option(
    "--wide", "--no-truncate",
    help="One line per row, nothing wrapped or cut (by default a table fits the terminal: long text wraps at "
         "words onto more lines).")]


@dataclass(frozen=True)
class OutputOptions:
    """``--format`` and ``--wide``: how a command prints its rows (an option group, ``cli/option_groups``)."""

    fmt: Format = "table"
    no_truncate: NoTruncate = False

    @property
    def truncate(self) -> bool:
        return not self.no_truncate


# C0 controls, DEL and C1 controls: an ESC sequence in a recorded name could retitle the terminal
# or move the cursor, and a newline would forge a row in a table or CSV.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def safe_text(value: object) -> str:
    """``value`` as text with control characters escaped (``\\n``, ``\\x1b``); times as ISO 8601 UTC."""
    text = _iso(value) if isinstance(value, datetime) else str(value)
    if not _UNSAFE.search(text):
        return text
    return _UNSAFE.sub(lambda m: _NAMED.get(m.group(), f"\\x{ord(m.group()):02x}"), text)


def _iso(value: datetime) -> str:
    # One time format in every command: what the JSON answers already use.
    return iso_utc(value) or ""


def check_format(fmt: str, allowed: Sequence[str] = FORMATS) -> str:
    if fmt not in allowed:
        raise InvalidInput(f"unknown --format {fmt!r}; use {', '.join(allowed[:-1])} or {allowed[-1]}")
    return fmt


def check_limit(limit: int) -> int:
    """``--limit`` in 1..MAX_LIMIT (``operate.inputs``, the API's bound too), refused under the option's
    own name before anything is read."""
    return check(limit, "--limit")


def emit(rows: Iterable[Mapping[str, Any]], columns: Sequence[str], fmt: str, document: object = None, *,
         truncate: bool = True) -> None:
    """Print rows as an aligned table (``cli/table.py``; ``truncate=False``: no cell shortened), CSV, or
    JSON (``document`` when given, else the rows)."""
    import csv
    import json

    rows = list(rows)
    if fmt == "json":
        # JSON escapes control characters itself.
        typer.echo(json.dumps(document if document is not None else rows, indent=2,
                              default=lambda v: _iso(v) if isinstance(v, datetime) else str(v)))
        return
    if fmt == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if row.get(c) is None else safe_text(row.get(c)) for c in columns])
        return

    cells = [[("-" if row.get(c) is None else safe_text(row.get(c))) for c in columns] for row in rows]
    # A column of numbers (a missing value aside) is right-aligned; bool is not a number here.
    numeric = [any(row.get(c) is not None for row in rows)
               and all(row.get(c) is None or (isinstance(row.get(c), (int, float)) and not isinstance(row.get(c), bool))
                       for row in rows) for c in columns]
    typer.echo(render([header(c) for c in columns], cells, numeric, [c in PROSE for c in columns],
                      truncate=truncate))


def json_requested(words: Sequence[str]) -> bool:
    """Whether a command line asks for ``--format json`` (``-f json``, ``--format=json``, ``-fjson``; the
    last one given wins, as the option parser has it). Read from the words, not the parsed options: an
    error can come before (or instead of) the command's own parsing."""
    fmt = None
    for i, word in enumerate(words):
        if word == "--":
            break
        if word in ("-f", "--format") and i + 1 < len(words):
            fmt = words[i + 1]
        elif word.startswith("--format="):
            fmt = word.split("=", 1)[1]
        elif word.startswith("-f") and not word.startswith("--") and len(word) > 2:
            fmt = word[2:]
    return fmt == "json"


def emit_error(exc: OffsetLedgerError) -> None:
    """An error under ``-f json``: its answer on stdout, the API's error body name for name and value
    (``operate.answers.error_answer``), so a script reads what was refused (the partitions out of range,
    the active runs) instead of parsing the one line on stderr, which is printed as well."""
    emit([], [], "json", error_answer(exc))


def header(column: str) -> str:
    """``lastBatchTime`` / ``next_offset`` -> ``LAST_BATCH_TIME`` / ``NEXT_OFFSET``: one header style."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", column).upper()


def more_signal(hint: str) -> None:
    """Tell a reader of any format that the output was cut short (stderr: stdout stays parseable)."""
    typer.echo(f"more: {hint}", err=True)


def require_named(engine: Any, pipeline: str, consumer_group: str | None = None) -> None:
    """UnknownPipeline / UnknownConsumerGroup (naming what exists) unless the ledger knows them."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        with engine.connect() as conn:
            if consumer_group is None:
                require_pipeline(conn, pipeline)
            else:
                require_group(conn, pipeline, consumer_group)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "reading the ledger") from exc


def short_id(run_id: str) -> str:
    """A run id short enough for a table, never cut mid-word: ``1a2b3c4d`` of a uuid,
    ``checkpoint:1a2b3c4d`` of a run the watcher recorded (its prefix says where it came from)."""
    prefix, sep, rest = run_id.rpartition(":")
    return f"{prefix}{sep}{rest[:8]}"
