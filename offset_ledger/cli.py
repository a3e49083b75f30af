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


def _kafka_options(items: Optional[list[str]]) -> dict[str, str]:
    """``--kafka-option KEY=VALUE`` values as Spark-style reader options."""
    from offset_ledger.errors import ConfigError

    options: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--kafka-option must be KEY=VALUE, not {item!r}")
        options[key.strip()] = value
    return options


@app.command("resolve")
def resolve_cmd(
    pipeline: str = typer.Argument(..., help="Pipeline name in the ledger."),
    topic: Optional[list[str]] = typer.Option(None, "--topic", "-t", help="Topic the pipeline subscribes to (repeatable)."),
    pattern: Optional[str] = typer.Option(None, "--pattern", help="Topic regex, like subscribePattern (instead of --topic)."),
    bootstrap_servers: Optional[str] = typer.Option(None, "--bootstrap-servers", envvar="OFFSET_LEDGER_BOOTSTRAP_SERVERS",
                                                    help="Kafka bootstrap servers."),
    first_run: Optional[str] = typer.Option(
        None, "--first-run",
        help="No ledger entries: earliest (default) | latest | timestamp (ISO-8601 or epoch ms) | JSON offsets."),
    allow_first_run: bool = typer.Option(
        False, "--allow-first-run",
        help="Start over with --first-run although the ledger knows the pipeline (another group or other topics)."),
    on_data_loss: str = typer.Option("fail", "--on-data-loss", help="Offsets outside the log: fail | earliest."),
    consumer_group: Optional[str] = typer.Option(None, "--consumer-group",
                                                 help="Default: the pipeline's only group in the ledger."),
    kafka_option: Optional[list[str]] = typer.Option(None, "--kafka-option", "-o",
                                                     help="Spark-style client setting, e.g. kafka.security.protocol=SSL (repeatable)."),
    window: Optional[str] = typer.Option(None, "--window",
                                         help="Windowed pipeline: the window length (10m, '10 minutes'); rewinds for open windows."),
    slide: Optional[str] = typer.Option(None, "--slide", help="Sliding windows: the slide (5m)."),
    watermark_delay: Optional[str] = typer.Option(None, "--watermark-delay",
                                                  help="The withWatermark delay (10s); default: read back from the ledger."),
    event_time_is_kafka_timestamp: bool = typer.Option(
        False, "--event-time-is-kafka-timestamp", help="The event time is the Kafka record timestamp (tighter rewind)."),
    dsn: Optional[str] = DsnOption,
) -> None:
    """Print the startingOffsets JSON a restart would use (stdout) and the findings (stderr); writes nothing."""
    from offset_ledger.errors import ConfigError
    from offset_ledger.kafka import KafkaAdapter
    from offset_ledger.ledger.engine import make_engine
    from offset_ledger.restart import plan_restart

    options = _kafka_options(kafka_option)
    if window is not None or slide is not None or watermark_delay is not None:
        # Bad durations fail before any connection is made.
        from offset_ledger.stateful import WindowSpec, parse_duration_ms

        if window is None:
            raise ConfigError("--slide and --watermark-delay need --window")
        WindowSpec.parse(window, slide)
        if watermark_delay is not None:
            parse_duration_ms(watermark_delay, option="watermark_delay")
    servers = bootstrap_servers or options.get("kafka.bootstrap.servers")
    if not servers:
        raise ConfigError("no Kafka bootstrap servers (--bootstrap-servers or OFFSET_LEDGER_BOOTSTRAP_SERVERS)")
    engine = make_engine(dsn)
    try:
        with KafkaAdapter(servers, options) as adapter:
            plan, ledger, _cluster = plan_restart(
                engine, adapter, pipeline=pipeline, consumer_group=consumer_group, topics=topic or None,
                topic_pattern=pattern, first_run=first_run, on_data_loss=on_data_loss,
                allow_first_run=allow_first_run, window=window, slide=slide, watermark_delay=watermark_delay,
                event_time_is_kafka_timestamp=event_time_is_kafka_timestamp)
    finally:
        engine.dispose()
    typer.echo(plan.starting_offsets_json)
    if plan.event_time_floor is not None:
        typer.echo(f"event-time floor: {plan.event_time_floor.isoformat()} (drop records before it; "
                   "start_from_ledger opens a fresh checkpoint for this plan)", err=True)
    for finding in plan.findings:
        where = f" {finding.topic}/{finding.partition}" if finding.topic is not None else ""
        typer.echo(f"{finding.kind}{where}: {finding.message}", err=True)
    if ledger.pending_reset_ids:
        ids = ", ".join(str(i) for i in ledger.pending_reset_ids)
        typer.echo(f"pending reset(s) {ids}: included above; they take effect through start_from_ledger's "
                   "fresh checkpoint", err=True)


# -- operations: pipelines, offsets, history, topic, lag, reset, serve (same functions as the API)

BootstrapOption = typer.Option(None, "--bootstrap-servers", envvar="OFFSET_LEDGER_BOOTSTRAP_SERVERS",
                               help="Kafka bootstrap servers.")
GroupOption = typer.Option(None, "--consumer-group", help="Default: the pipeline's only group (an error when it has several).")
FormatOption = typer.Option("table", "--format", "-f", help="Output: table | json | csv.")


def _ops(dsn: Optional[str], bootstrap_servers: Optional[str] = None):  # type: ignore[no-untyped-def]
    from offset_ledger.operations import Operations

    return Operations.connect(dsn, bootstrap_servers)


def _check_format(fmt: str) -> str:
    from offset_ledger.errors import InvalidInput

    if fmt not in ("table", "json", "csv"):
        raise InvalidInput(f"unknown --format {fmt!r}; use table, json or csv")
    return fmt


def _emit(rows: list[dict], columns: list[str], fmt: str, document: object = None) -> None:
    """Print rows as an aligned table, CSV, or JSON (``document`` when given, else the rows)."""
    import csv
    import json as _json

    if fmt == "json":
        typer.echo(_json.dumps(document if document is not None else rows, indent=2, default=str))
        return
    if fmt == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if row.get(c) is None else row.get(c) for c in columns])
        return
    cells = [[("-" if row.get(c) is None else str(row.get(c))) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    typer.echo("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths)).rstrip())
    for r in cells:
        typer.echo("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())


@app.command("pipelines")
def pipelines_cmd(
    dsn: Optional[str] = DsnOption, bootstrap_servers: Optional[str] = BootstrapOption,
    lag: bool = typer.Option(True, "--lag/--no-lag", help="Ask Kafka for lag (needs bootstrap servers)."),
    fmt: str = FormatOption,
) -> None:
    """List pipelines with state (running/stale/stopped) and why, generation, foreign runs, last batch and lag."""
    fmt = _check_format(fmt)
    ops = _ops(dsn, bootstrap_servers)
    try:
        rows = [p.to_dict() for p in ops.list_pipelines(with_lag=lag and ops.has_kafka)]
    finally:
        ops.close()
    if fmt != "json":
        for row in rows:
            gen = row["generation"]
            row["generation"] = None if gen is None else f"{gen['generation']}({gen['appVersion'] or '-'})"
            # Loud on purpose: a foreign run is a second deployment or an old checkpoint still running.
            row["foreignRuns"] = f"FOREIGN:{','.join(row['foreignRunIds'])}" if row["foreignRunIds"] else None
            row["why"] = "; ".join(f"{r['runId'][:8]} {r['state']}: {r['why']}" for r in row["runs"]) or None
        columns = ["pipeline", "consumerGroup", "state", "status", "generation", "foreignRuns", "partitions",
                   "lastBatchTime", "lastBatchId", "lag", "why"]
    else:
        columns = list(rows[0]) if rows else ["pipeline"]
    _emit(rows, columns, fmt)


@app.command("offsets")
def offsets_cmd(
    pipeline: str = typer.Argument(..., help="Pipeline name in the ledger."),
    consumer_group: Optional[str] = GroupOption, dsn: Optional[str] = DsnOption, fmt: str = FormatOption,
) -> None:
    """Current positions (next offset to read); --format json prints {"topic": {"0": n}}."""
    fmt = _check_format(fmt)
    ops = _ops(dsn)
    try:
        group, rows = ops.positions(pipeline, consumer_group)
    finally:
        ops.close()
    document: dict[str, dict[str, int]] = {}
    for r in rows:
        document.setdefault(r["topic"], {})[str(r["partition"])] = r["next_offset"]
        r["placed_by"] = ("reset" if r["reset_id"] is not None
                          else "generation" if r.get("generation_id") is not None and r["query_id"] is None
                          else "batch")
    _emit(rows, ["topic", "partition", "next_offset", "placed_by", "updated_at", "batch_id", "reset_id"], fmt,
          document)


@app.command("history")
def history_cmd(
    pipeline: str = typer.Argument(..., help="Pipeline name in the ledger."),
    topic: Optional[str] = typer.Option(None, "--topic", help="Only batches that read this topic."),
    since: Optional[str] = typer.Option(None, "--since", help="Inclusive; ISO 8601 or epoch ms."),
    until: Optional[str] = typer.Option(None, "--until", help="Exclusive; ISO 8601 or epoch ms."),
    limit: int = typer.Option(50, "--limit", help="Batches per page (1-1000)."),
    cursor: Optional[str] = typer.Option(None, "--cursor", help="Next-page cursor printed by a previous call."),
    consumer_group: Optional[str] = GroupOption, dsn: Optional[str] = DsnOption, fmt: str = FormatOption,
) -> None:
    """Committed batches, newest first, one row per batch and partition."""
    from offset_ledger.operations import parse_timestamp

    fmt = _check_format(fmt)
    ops = _ops(dsn)
    try:
        page = ops.history(pipeline, consumer_group, topic=topic,
                           since=parse_timestamp(since) if since else None,
                           until=parse_timestamp(until) if until else None, limit=limit, cursor=cursor)
    finally:
        ops.close()
    rows = [{"batchTime": b["batchTime"], "batchId": b["batchId"], "queryId": b["queryId"], **r}
            for b in page.items for r in b["ranges"]]
    _emit(rows, ["batchTime", "batchId", "topic", "partition", "fromOffset", "untilOffset", "queryId"], fmt,
          {"batches": list(page.items), "nextCursor": page.next_cursor})
    if page.next_cursor and fmt == "table":
        typer.echo(f"more: --cursor {page.next_cursor}", err=True)


@app.command("topic")
def topic_cmd(
    topic: str = typer.Argument(..., help="Topic name."),
    bootstrap_servers: Optional[str] = BootstrapOption, fmt: str = FormatOption,
) -> None:
    """Partitions of a topic with log-start (firstOffset) and log-end (lastOffset) offsets."""
    from offset_ledger.errors import ConfigError
    from offset_ledger.kafka import KafkaAdapter
    from offset_ledger.operations import topic_details

    fmt = _check_format(fmt)
    if not bootstrap_servers:
        raise ConfigError("no Kafka bootstrap servers (--bootstrap-servers or OFFSET_LEDGER_BOOTSTRAP_SERVERS)")
    with KafkaAdapter(bootstrap_servers) as adapter:
        details = topic_details(adapter, topic)
    rows = [{"partition": int(p), "firstOffset": v["firstOffset"], "lastOffset": v["lastOffset"]}
            for p, v in details["partitions"].items()]
    _emit(rows, ["partition", "firstOffset", "lastOffset"], fmt, details)


@app.command("lag")
def lag_cmd(
    pipeline: str = typer.Argument(..., help="Pipeline name in the ledger."),
    consumer_group: Optional[str] = GroupOption, dsn: Optional[str] = DsnOption,
    bootstrap_servers: Optional[str] = BootstrapOption, fmt: str = FormatOption,
) -> None:
    """Lag per partition in records and seconds, drift against the Kafka group, and status."""
    fmt = _check_format(fmt)
    ops = _ops(dsn, bootstrap_servers)
    try:
        _group, parts = ops.lag(pipeline, consumer_group)
    finally:
        ops.close()
    rows = [p.to_dict() for p in parts]
    _emit(rows, ["topic", "partition", "nextOffset", "logStartOffset", "logEndOffset", "lag", "lagSeconds",
                 "committedOffset", "drift", "status"], fmt)


@app.command("reset")
def reset_cmd(
    pipeline: str = typer.Argument(..., help="Pipeline name in the ledger."),
    to_earliest: bool = typer.Option(False, "--to-earliest", help="Each partition's log-start offset."),
    to_latest: bool = typer.Option(False, "--to-latest", help="Each partition's log-end offset."),
    to_offsets: Optional[str] = typer.Option(None, "--to-offsets", help='JSON file {"topic": {"0": n}} (- = stdin).'),
    to_datetime: Optional[str] = typer.Option(None, "--to-datetime", help="First offset at or after this time "
                                                                          "(ISO 8601, naive = UTC, or epoch ms)."),
    shift_by: Optional[int] = typer.Option(None, "--shift-by", help="Move each position by N (negative replays)."),
    topic: Optional[list[str]] = typer.Option(None, "--topic", help="Scope: TOPIC or TOPIC:0,1 (repeatable)."),
    execute: bool = typer.Option(False, "--execute", help="Apply the reset (default: dry run, still audited)."),
    reason: Optional[str] = typer.Option(None, "--reason", help="Why (kept in the audit trail)."),
    actor: Optional[str] = typer.Option(None, "--actor", help="Who (default: the OS user)."),
    force: bool = typer.Option(False, "--force", help="Reset even while the pipeline has an active run."),
    out_of_range: str = typer.Option("refuse", "--out-of-range",
                                     help="Targets outside [log-start, log-end]: refuse | clamp."),
    consumer_group: Optional[str] = GroupOption, dsn: Optional[str] = DsnOption,
    bootstrap_servers: Optional[str] = BootstrapOption, fmt: str = FormatOption,
) -> None:
    """Reset a pipeline's positions (dry run unless --execute); the next start_from_ledger applies it."""
    import getpass
    import json as _json
    from pathlib import Path

    from offset_ledger.errors import InvalidInput
    from offset_ledger.operations import parse_timestamp, scope_from_specs, to_epoch_ms
    from offset_ledger.resets import ResetRequest, parse_offsets_body

    fmt = _check_format(fmt)
    chosen = [name for name, on in (("--to-earliest", to_earliest), ("--to-latest", to_latest),
                                    ("--to-offsets", to_offsets is not None),
                                    ("--to-datetime", to_datetime is not None),
                                    ("--shift-by", shift_by is not None)) if on]
    if len(chosen) != 1:
        raise InvalidInput("choose exactly one of --to-earliest, --to-latest, --to-offsets FILE, "
                           "--to-datetime TS, --shift-by N" + (f" (got {', '.join(chosen)})" if chosen else ""))
    if out_of_range not in ("refuse", "clamp"):
        raise InvalidInput(f"unknown --out-of-range {out_of_range!r}; use refuse or clamp")
    scope = scope_from_specs(topic or [])
    if to_offsets is not None:
        try:
            text = sys.stdin.read() if to_offsets == "-" else Path(to_offsets).read_text()
        except OSError as exc:
            raise InvalidInput(f"cannot read --to-offsets {to_offsets!r}: {exc.strerror}") from exc
        try:
            body = _json.loads(text)
        except ValueError as exc:
            raise InvalidInput(f"--to-offsets {to_offsets!r} is not valid JSON: {exc}") from exc
        request = ResetRequest("offsets", scope=scope, offsets=parse_offsets_body(body),
                               out_of_range=out_of_range)  # type: ignore[arg-type]
    elif to_datetime is not None:
        request = ResetRequest("timestamp", scope=scope, timestamp_ms=to_epoch_ms(parse_timestamp(to_datetime)),
                               out_of_range=out_of_range)  # type: ignore[arg-type]
    elif shift_by is not None:
        request = ResetRequest("shift", scope=scope, shift_by=shift_by, out_of_range=out_of_range)  # type: ignore[arg-type]
    else:
        request = ResetRequest("earliest" if to_earliest else "latest", scope=scope,
                               out_of_range=out_of_range)  # type: ignore[arg-type]
    ops = _ops(dsn, bootstrap_servers)
    try:
        outcome = ops.reset(pipeline, request, actor=actor or getpass.getuser() or "cli", reason=reason,
                            dry_run=not execute, force=force, consumer_group=consumer_group)
    finally:
        ops.close()
    doc = outcome.to_dict()
    rows = [{"topic": p["topic"], "partition": p["partition"], "before": p["beforeNextOffset"],
             "target": p["targetNextOffset"], "logStart": p["logStartOffset"], "logEnd": p["logEndOffset"],
             "replay": p["recordsReplayed"], "skip": p["recordsSkipped"],
             "outOfRange": p["outOfRange"] or ("" if not p["clamped"] else "clamped")}
            for p in doc["partitions"]]
    _emit(rows, ["topic", "partition", "before", "target", "logStart", "logEnd", "replay", "skip", "outOfRange"],
          fmt, doc)
    if fmt == "table":
        if outcome.dry_run:
            note = " (executing would be refused: targets out of range)" if outcome.plan.refused else ""
            typer.echo(f"dry run recorded as reset {doc['resetId']}{note}; pass --execute to apply", err=True)
        else:
            typer.echo(f"reset {doc['resetId']} is pending: the next start_from_ledger applies it through a "
                       "fresh checkpoint", err=True)


@app.command("mirror")
def mirror_cmd(
    pipeline: str = typer.Argument(..., help="Pipeline name in the ledger."),
    consumer_group: Optional[str] = GroupOption,
    once: bool = typer.Option(False, "--once", help="Sync once and exit (the default)."),
    follow: bool = typer.Option(False, "--follow", help="Keep syncing every --interval seconds until Ctrl-C."),
    interval: float = typer.Option(5.0, "--interval", help="Seconds between syncs with --follow."),
    kafka_option: Optional[list[str]] = typer.Option(None, "--kafka-option", "-o",
                                                     help="Spark-style client setting (repeatable)."),
    dsn: Optional[str] = DsnOption, bootstrap_servers: Optional[str] = BootstrapOption, fmt: str = FormatOption,
) -> None:
    """Commit the ledger's positions to the Kafka consumer group of the same name (never while it has members)."""
    import time as _time

    from offset_ledger.errors import ConfigError, InvalidInput, KafkaError
    from offset_ledger.kafka import KafkaAdapter
    from offset_ledger.ledger.engine import make_engine
    from offset_ledger.mirror import sync_group
    from offset_ledger.operations import resolve_group

    fmt = _check_format(fmt)
    if once and follow:
        raise InvalidInput("choose one of --once and --follow")
    if not 0.1 <= interval <= 86_400:
        raise InvalidInput(f"--interval must be between 0.1 and 86400 seconds, not {interval}")
    options = _kafka_options(kafka_option)
    servers = bootstrap_servers or options.get("kafka.bootstrap.servers")
    if not servers:
        raise ConfigError("no Kafka bootstrap servers (--bootstrap-servers or OFFSET_LEDGER_BOOTSTRAP_SERVERS)")
    engine = make_engine(dsn)
    try:
        with engine.connect() as conn:
            group = resolve_group(conn, pipeline, consumer_group)
        with KafkaAdapter(servers, options) as adapter:
            while True:
                try:
                    result = sync_group(engine, adapter, pipeline, group)
                except KafkaError as exc:
                    if not follow or not exc.retriable:
                        raise
                    typer.echo(f"not synced yet: {exc.message}", err=True)
                else:
                    if not follow or result.committed:
                        rows = [d.to_dict() for d in result.decisions]
                        _emit(rows, ["topic", "partition", "ledgerOffset", "committedOffset", "action"], fmt,
                              result.to_dict())
                    if not follow:
                        typer.echo(f"consumer group {group!r}: {result.committed} partition(s) committed", err=True)
                        return
                try:
                    _time.sleep(interval)
                except KeyboardInterrupt:
                    typer.echo("stopped", err=True)
                    return
    except KeyboardInterrupt:
        typer.echo("stopped", err=True)
    finally:
        engine.dispose()


@app.command("import-checkpoint")
def import_checkpoint_cmd(
    checkpoint: str = typer.Argument(..., help="The running query's checkpoint location (a path or s3a://, "
                                               "abfss://, gs://, hdfs:// URI)."),
    pipeline: str = typer.Option(..., "--pipeline", help="Pipeline name in the ledger."),
    consumer_group: Optional[str] = typer.Option(None, "--consumer-group", help="Default: the pipeline name."),
    app_version: Optional[str] = typer.Option(None, "--app-version", help="Application version running on it."),
    source: Optional[str] = typer.Option(None, "--source", help="Kafka source index when the query has several, "
                                                                "or 'all' (lowest offset per partition)."),
    checkpoint_root: Optional[str] = typer.Option(None, "--checkpoint-root",
                                                  help="Where later fresh generations go (default: the "
                                                       "checkpoint's parent directory)."),
    execute: bool = typer.Option(False, "--execute", help="Write to the ledger (default: dry run)."),
    force: bool = typer.Option(False, "--force", help="Import although the group already has positions."),
    bootstrap_servers: Optional[str] = typer.Option(None, "--bootstrap-servers",
                                                    help="Also record the topics' Kafka ids (tells a re-created "
                                                         "topic apart later)."),
    dsn: Optional[str] = DsnOption,
    fmt: str = typer.Option("table", "--format", "-f", help="Output: table | json."),
) -> None:
    """Adopt a running pipeline: import its checkpoint's last committed batch as positions (dry run by default)."""
    import json as _json

    from offset_ledger.adopt import import_checkpoint
    from offset_ledger.errors import InvalidInput

    if fmt not in ("table", "json"):
        raise InvalidInput(f"unknown --format {fmt!r}; use table or json")
    result = import_checkpoint(checkpoint, pipeline=pipeline, consumer_group=consumer_group,
                               app_version=app_version, source=source, execute=execute, force=force, dsn=dsn,
                               checkpoint_root=checkpoint_root, bootstrap_servers=bootstrap_servers)
    if fmt == "json":
        typer.echo(_json.dumps(result.to_dict(), indent=2))
    else:
        batch = ("no committed batch: the initial offsets" if result.committed_batch_id is None
                 else f"last committed batch {result.committed_batch_id}")
        typer.echo(f"checkpoint {result.checkpoint_location} (query {result.query_id}): {batch}")
        if result.planned_batch_ids:
            typer.echo(f"  planned, not committed (Spark re-runs them; not positions): batch "
                       f"{', '.join(map(str, result.planned_batch_ids))}")
        for line in result.skipped:
            typer.echo(f"  {line}")
        typer.echo(f"positions of pipeline {result.pipeline!r}, consumer group {result.consumer_group!r}:")
        rows = [{"topic": t, "partition": p, "next_offset": o}
                for t, parts in result.positions.items() for p, o in parts.items()]
        _emit(rows, ["topic", "partition", "next_offset"], "table")
    if result.executed:
        typer.echo(f"imported as checkpoint generation {result.generation} at {result.checkpoint_location}: runs "
                   "on it move these positions from now on", err=True)
    else:
        typer.echo("dry run: nothing written; add --execute to import", err=True)


@app.command("replay")
def replay_cmd(
    pipeline: str = typer.Argument(..., help="Pipeline name in the ledger."),
    batch: Optional[int] = typer.Option(None, "--batch", help="Spark's batch id (in the current generation's query "
                                                               "unless --query-id / --generation)."),
    since: Optional[str] = typer.Option(None, "--from", help="Batches at or after this time (ISO 8601 or epoch ms)."),
    until: Optional[str] = typer.Option(None, "--to", help="Batches before this time (exclusive)."),
    query_id: Optional[str] = typer.Option(None, "--query-id", help="The query whose batch id --batch means."),
    generation: Optional[int] = typer.Option(None, "--generation", help="The checkpoint generation whose query."),
    consumer_group: Optional[str] = GroupOption, dsn: Optional[str] = DsnOption,
    bootstrap_servers: Optional[str] = BootstrapOption,
    fmt: str = typer.Option("options", "--format", "-f",
                            help="options: {startingOffsets, endingOffsets, assign}; json: with batches and warnings."),
) -> None:
    """Print the Kafka range recorded batches read: options for spark.read.format("kafka") with assign."""
    import json as _json

    from offset_ledger.errors import InvalidInput
    from offset_ledger.operations import parse_timestamp
    from offset_ledger.replay import replay_for

    if fmt not in ("options", "json"):
        raise InvalidInput(f"unknown --format {fmt!r}; use options or json")
    start = parse_timestamp(since) if since is not None else None
    end = parse_timestamp(until) if until is not None else None
    ops = _ops(dsn, bootstrap_servers)
    try:
        result = replay_for(ops.engine, ops.kafka if ops.has_kafka else None, pipeline, batch=batch, since=start,
                            until=end, query_id=query_id, generation=generation, consumer_group=consumer_group)
    finally:
        ops.close()
    doc = result.to_dict()
    if fmt == "json":
        typer.echo(_json.dumps(doc, indent=2))
    else:
        typer.echo(_json.dumps({k: doc[k] for k in ("startingOffsets", "endingOffsets", "assign")}))
    for warning in result.warnings:
        typer.echo(f"warning: {warning}", err=True)


@app.command("serve")
def serve_cmd(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (loopback by default)."),
    port: int = typer.Option(9090, "--port", help="Port to listen on."),
    insecure: bool = typer.Option(False, "--insecure",
                                  help="Allow a non-loopback bind without OFFSET_LEDGER_API_TOKEN."),
    dsn: Optional[str] = DsnOption, bootstrap_servers: Optional[str] = BootstrapOption,
    log_level: str = typer.Option("info", "--log-level", help="uvicorn log level."),
) -> None:
    """Run the REST API (legacy /v1 endpoints, /api/v1 resources, /docs, /metrics, /healthz)."""
    import ipaddress

    import uvicorn

    from offset_ledger.api import create_app
    from offset_ledger.config import settings
    from offset_ledger.errors import ConfigError

    from offset_ledger.api.tokens import load_tokens, weak_token_names

    s = settings()
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    tokens = load_tokens(s)
    if not loopback and not tokens and not insecure:
        raise ConfigError(f"refusing to bind {host} without OFFSET_LEDGER_API_TOKEN; set a token or pass --insecure")
    weak = weak_token_names(tokens)
    if weak and not loopback:
        # --insecure does not cover this: a known or short token is no protection off loopback.
        raise ConfigError(f"refusing to bind {host} with a weak API token ({', '.join(weak)}: a known default or "
                          "shorter than 16 characters); make one with: python3 -c 'import secrets; "
                          "print(secrets.token_urlsafe(32))'")
    if not 0 < port < 65536:
        raise ConfigError(f"invalid --port {port}")
    # The bound address is a name clients use; a wildcard bind names no host.
    hosts = [] if host in ("0.0.0.0", "::", "") else [host]
    uvicorn.run(create_app(s, dsn=dsn, bootstrap_servers=bootstrap_servers, tokens=tokens, hosts=hosts),
                host=host, port=port, log_level=log_level)


def _register_commands() -> None:
    """Commands that live in their own modules register on ``app`` when imported."""
    import offset_ledger.cli_watch  # noqa: F401


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: user-facing errors print one line and exit 2; --traceback shows more."""
    _register_commands()
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
    except typer.TyperException as exc:  # usage errors: unknown command, bad option value, ...
        if _state["traceback"]:
            raise
        fmt = getattr(exc, "format_message", None)
        message = fmt() if callable(fmt) else str(exc)
        print(f"offset-ledger: error: {' '.join(message.split())} (see --help)", file=sys.stderr)
        sys.exit(2)
