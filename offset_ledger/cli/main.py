"""The ``offset-ledger`` command: a thin face over the same functions the REST API uses."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, Optional

import typer

from offset_ledger import __version__
from offset_ledger.cli.connections import KafkaOptions, LedgerOptions, kafka_adapter, open_operations
from offset_ledger.cli.option_groups import grouped
from offset_ledger.cli.sink_columns import output_columns
from offset_ledger.cli.support import (
    ConsumerGroup,
    OutputOptions,
    check_format,
    check_limit,
    emit,
    emit_error,
    json_requested,
    more_signal,
    plain_help,
)
from offset_ledger.errors import EXIT_INTERNAL, EXIT_USAGE, InvalidInput, OffsetLedgerError, exit_code, install_hint
from offset_ledger.operate import reads
from offset_ledger.operate.answers import position_answer
from offset_ledger.operate.inputs import MAX_LIMIT, parse_timestamp
from offset_ledger.operate.reads import describe_topic
from offset_ledger.rules.retention import human_duration

plain_help()

# Plain click help: Rich markup would eat "[log-start, log-end]" and print "<bool>" placeholders;
# the help follows the terminal's width instead of stopping at 80 columns.
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 160}

_app = typer.Typer(
    name="offset-ledger",
    help="An external, auditable Kafka offset ledger for PySpark Structured Streaming. "
         "Exit codes: 0 ok, 1 internal, 2 usage or bad input, 3 refused, 4 data loss, 5 unreachable, "
         "6 verify found unexplained gaps, overlaps or losses, or unknown starts (docs/cli.md).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
    rich_markup_mode=None,
    context_settings=CONTEXT,
)

_state = {"traceback": False}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"offset-ledger {__version__}")
        raise typer.Exit()


@_app.callback()
def _main(
    traceback: bool = typer.Option(False, "--traceback", help="Show the full traceback on errors."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log what happens on stderr; tracebacks on errors."),
    quiet: bool = typer.Option(False, "--quiet", "-q",
                               help="Only the answer on stdout and errors on stderr (no notes, no 'more:' hints)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    if quiet and verbose:
        raise InvalidInput("choose one of --quiet and --verbose")
    _state["traceback"] = traceback or verbose
    if verbose:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if quiet:  # notes go nowhere; main() prints an error on the real stderr all the same
        import io

        sys.stderr = io.StringIO()


# -- operations: pipelines, offsets, history, topic, lag, reset, serve (same functions as the API)

@_app.command("pipelines")
@grouped
def pipelines_cmd(
    ledger: LedgerOptions = LedgerOptions(), kafka: KafkaOptions = KafkaOptions(),
    lag: bool = typer.Option(True, "--lag/--no-lag", help="Ask Kafka for lag (needs bootstrap servers)."),
    out: OutputOptions = OutputOptions(),
) -> None:
    """List pipelines with state (running/uncertain/stale/stopped) and why, generation, foreign runs, last
    batch, lag and findings."""
    fmt = check_format(out.fmt)

    ops = open_operations(ledger.address(), kafka.address())
    try:
        rows = reads.pipeline_answers(ops, with_lag=lag and ops.has_kafka)
    finally:
        ops.close()
    if fmt != "json":
        for row in rows:
            gen = row["generation"]
            row["generation"] = None if gen is None else f"{gen['generation']}({gen['appVersion'] or '-'})"
            # Loud on purpose: a foreign run is a second deployment or an old checkpoint still running.
            row["foreignRuns"] = f"FOREIGN:{','.join(row['foreignRunIds'])}" if row["foreignRunIds"] else None
            row["headroom"] = _headroom_cell(row, fmt)
        # stateReason: the same answer and evidence as the API, the console and the 409, under its name
        columns = ["pipeline", "consumerGroup", "state", "status", "generation", "foreignRuns", "partitions",
                   "lastBatchTime", "lastBatchId", "lag", "headroom", "findings", "stateReason"]
    else:
        columns = list(rows[0]) if rows else ["pipeline"]
    emit(rows, columns, fmt, truncate=out.truncate)


@_app.command("offsets")
@grouped
def offsets_cmd(
    pipeline: str = typer.Argument(..., metavar="PIPELINE", help="Pipeline name in the ledger."),
    consumer_group: ConsumerGroup = None, ledger: LedgerOptions = LedgerOptions(),
    out: OutputOptions = OutputOptions(),
) -> None:
    """Current positions (next offset to read); --format json prints {"topic": {"0": n}}."""
    fmt = check_format(out.fmt)

    ops = open_operations(ledger.address())
    try:
        group, rows = reads.positions(ops, pipeline, consumer_group)
    finally:
        ops.close()

    document: dict[str, dict[str, int]] = {}
    for r in rows:
        document.setdefault(r["topic"], {})[str(r["partition"])] = r["next_offset"]
    # The API's positions items (one function for both faces); the table's headers are their UPPER_SNAKE.
    answers = [position_answer(r) for r in rows]
    emit(answers, ["topic", "partition", "nextOffset", "placedBy", "updatedAt", "batchId", "resetId"], fmt, document,
          truncate=out.truncate)


@_app.command("history")
@grouped
def history_cmd(
    pipeline: str = typer.Argument(..., metavar="PIPELINE", help="Pipeline name in the ledger."),
    topic: Optional[str] = typer.Option(None, "--topic", help="Only batches that read this topic."),
    since: Optional[str] = typer.Option(None, "--since", help="Inclusive; ISO 8601 or epoch ms."),
    until: Optional[str] = typer.Option(None, "--until", help="Exclusive; ISO 8601 or epoch ms."),
    limit: int = typer.Option(50, "--limit", help="Batches per page (1-1000)."),
    cursor: Optional[str] = typer.Option(None, "--cursor", help="Next-page cursor printed by a previous call."),
    every: bool = typer.Option(False, "--all", help="Every batch in the range, page after page (ignores --limit)."),
    consumer_group: ConsumerGroup = None, ledger: LedgerOptions = LedgerOptions(),
    out: OutputOptions = OutputOptions(),
) -> None:
    """Committed batches, newest first, one row per batch and partition.

    A cut-short answer says so in every format: "more: --cursor C" on stderr (and nextCursor in JSON).

    Example: offset-ledger history orders --since 2024-05-01T00:00:00Z --all --format csv > batches.csv
    """
    fmt = check_format(out.fmt)
    if not every:
        check_limit(limit)

    ops = open_operations(ledger.address())
    items: list = []
    try:
        while True:
            page = reads.history(ops, pipeline, consumer_group, topic=topic,
                               # "is not None": an empty --since is a mistake to name, not "no bound".
                               since=parse_timestamp(since) if since is not None else None,
                               until=parse_timestamp(until) if until is not None else None,
                               limit=MAX_LIMIT if every else limit, cursor=cursor)
            items.extend(page.items)
            cursor = page.next_cursor
            if not every or not cursor:
                break
    finally:
        ops.close()
    rows = [{"batchTime": b["batchTime"], "batchId": b["batchId"], "queryId": b["queryId"], **r}
            for b in items for r in b["ranges"]]
    columns = ["batchTime", "batchId", "topic", "partition", "fromOffset", "untilOffset", "queryId"]
    if any(b.get("outputs") for b in items):  # a transactional sink wrote them: what, where, which version
        rows, columns = output_columns(items, columns)
    emit(rows, columns, fmt, {"pipeline": pipeline, "batches": items, "nextCursor": page.next_cursor},
          truncate=out.truncate)
    if page.next_cursor:
        more_signal(f"--cursor {page.next_cursor} (or --all)")


@_app.command("topic")
@grouped
def topic_cmd(
    topic: str = typer.Argument(..., metavar="TOPIC", help="Topic name."),
    kafka: KafkaOptions = KafkaOptions(), out: OutputOptions = OutputOptions(),
) -> None:
    """Partitions of a topic with their log-start and log-end offsets (logEndOffset: the next offset to be written)."""
    fmt = check_format(out.fmt)
    with kafka_adapter(kafka.address()) as adapter:
        details = describe_topic(adapter, topic)
    rows = [{"partition": int(p), **v} for p, v in details["partitions"].items()]
    emit(rows, ["partition", "logStartOffset", "logEndOffset"], fmt, details, truncate=out.truncate)


@_app.command("lag")
@grouped
def lag_cmd(
    pipeline: str = typer.Argument(..., metavar="PIPELINE", help="Pipeline name in the ledger."),
    consumer_group: ConsumerGroup = None, ledger: LedgerOptions = LedgerOptions(),
    kafka: KafkaOptions = KafkaOptions(), out: OutputOptions = OutputOptions(),
) -> None:
    """Lag per partition in records and seconds, drift against the Kafka group, and status.

    Example: offset-ledger lag orders -o security.protocol=SASL_SSL -o sasl.mechanism=SCRAM-SHA-512 --format json
    """
    fmt = check_format(out.fmt)

    ops = open_operations(ledger.address(), kafka.address())
    try:
        _group, parts = reads.lag(ops, pipeline, consumer_group)
    finally:
        ops.close()
    rows = [p.to_dict() for p in parts]
    columns = ["topic", "partition", "nextOffset", "logStartOffset", "logEndOffset", "lag", "lagSeconds",
               "committedNextOffset", "drift", "status"]
    if fmt == "table":
        for row in rows:
            row["headroom"] = _headroom_cell(row, fmt)
        columns.append("headroom")
    else:
        columns += ["headroomSeconds", "headroomStatus", "headroomBasis"]
    emit(rows, columns, fmt, truncate=out.truncate)


def _headroom_cell(row: dict, fmt: str) -> Optional[str]:
    """Retention headroom for a table: ``WARN:14m02s``, ``ERR:lost``, ``OK:caught-up``, ``compacted``;
    CSV: the seconds (``headroomStatus`` and ``headroomBasis`` are their own columns in ``lag``)."""
    seconds, status, basis = row.get("headroomSeconds"), row.get("headroomStatus"), row.get("headroomBasis")
    if fmt == "csv":
        return None if seconds is None else str(seconds)
    if basis is None or basis == "unknown":
        return None
    if status is None:
        return basis
    if basis == "lost":
        return "ERR:lost"
    return f"{status}:{basis if seconds is None else human_duration(seconds)}"


_SERVER_MODULES = frozenset({"fastapi", "starlette", "uvicorn", "jinja2"})


# The commands that live in their own modules (main.py stays the face's root), in the order the
# help lists them: command or group name -> module.
_MODULES = {"serve": "serve", "db": "upkeep", "prune": "upkeep", "findings": "audit", "resets": "audit",
            "alerts": "alerts", "mirror": "checkpoint", "import-checkpoint": "checkpoint", "replay": "checkpoint",
            "failover": "failover", "policy": "policy", "reset": "reset", "resolve": "restart", "plan": "restart",
            "verify": "verify", "watch": "watch"}
_registered = False


def _register(target: typer.Typer, modules: Iterable[str]) -> None:
    import importlib

    for name in dict.fromkeys(modules):
        module = importlib.import_module(f"offset_ledger.cli.{name}")
        if name == "upkeep":
            module.register(target, CONTEXT)
        else:
            module.register(target)


def _whole() -> typer.Typer:
    """The app with every command (help, completion, tests): the command modules are imported once, here."""
    global _registered
    if not _registered:
        _registered = True
        _register(_app, _MODULES.values())
    return _app


def __getattr__(name: str) -> Any:
    # ``app`` is the whole command line; a start that runs one command imports only that command's
    # module (``_app_for``), since every module costs a start its imports and option groups.
    if name == "app":
        return _whole()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _app_for(argv: Optional[list[str]]) -> typer.Typer:
    """The app with only the command ``argv`` names (its global options are flags, so the first word
    that is not an option is the command), importing only the module that command lives in. Typer
    builds the click command of every registered command on each call, about a tenth of a read
    command's start; help, completion and a missing or unknown command get the whole app, so what
    they print is unchanged."""
    import copy

    words = sys.argv[1:] if argv is None else argv
    name = next((w for w in words if not w.startswith("-")), None)
    source = _app
    if name in _MODULES and not _registered:
        source = copy.copy(_app)  # shares the callback and settings; the lists below are its own
        source.registered_commands, source.registered_groups = [], []
        _register(source, [_MODULES[name]])
    commands = [c for c in source.registered_commands if c.name == name]
    groups = [g for g in source.registered_groups if g.name == name]
    if not commands and not groups:
        return _whole()
    only = copy.copy(_app)
    only.registered_commands, only.registered_groups = commands, groups
    return only


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: an error prints one line and exits with its code (offset_ledger.errors.exit_code);
    --traceback shows more."""
    try:
        from typer._click.exceptions import (
            NoArgsIsHelpError,  # Typer >= 0.20 carries its own click
        )
    except ImportError:  # pragma: no cover - older Typer on click
        from click.exceptions import NoArgsIsHelpError  # type: ignore[no-redef]

    real_stderr = sys.stderr
    try:
        try:
            _app_for(argv)(args=argv, prog_name="offset-ledger", standalone_mode=False)
        finally:
            sys.stderr = real_stderr  # --quiet silenced the notes, never the error below
    except OffsetLedgerError as exc:
        if _state["traceback"]:
            raise
        if not exc.after_answer and json_requested(sys.argv[1:] if argv is None else argv):
            emit_error(exc)
        print(f"offset-ledger: error: {' '.join(exc.message.split())}", file=sys.stderr)
        sys.exit(exit_code(exc))
    except (typer.Abort, KeyboardInterrupt):
        print("aborted", file=sys.stderr)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except NoArgsIsHelpError as exc:
        # A bare "offset-ledger" or "offset-ledger db": the help is the answer, not an error.
        print(exc.format_message())
        sys.exit(0)
    except typer.TyperException as exc:  # usage errors: unknown command, bad option value, ...
        if _state["traceback"]:
            raise
        print(f"offset-ledger: error: {' '.join(exc.format_message().split())} (see --help)", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except ModuleNotFoundError as exc:
        if _state["traceback"] or (exc.name or "").split(".")[0] not in _SERVER_MODULES:
            raise
        # A listener-only install (no [server] extra) asked for the REST API or the console.
        print(f"offset-ledger: error: {exc.name} is not installed: the REST API and console need "
              f"{install_hint('server')}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except Exception as exc:  # noqa: BLE001 - a bug: one line and code 1, the traceback on request
        if _state["traceback"]:
            raise
        detail = " ".join(str(exc).split())[:300]
        print(f"offset-ledger: internal error: {type(exc).__name__}: {detail} (rerun with --traceback)",
              file=sys.stderr)
        sys.exit(EXIT_INTERNAL)
