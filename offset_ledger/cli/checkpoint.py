"""Commands over checkpoints and consumer groups: adopt a running job's checkpoint, replay batches, mirror positions into a Kafka consumer group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from offset_ledger.cli.connections import (
    CommandConfig,
    KafkaOptionItems,
    KafkaOptions,
    LedgerOptions,
    TimeoutMs,
    kafka_address,
    open_operations,
)
from offset_ledger.cli.option_groups import grouped
from offset_ledger.cli.positional import pipeline_and_checkpoint
from offset_ledger.cli.support import ConsumerGroup, OutputOptions, check_format, emit
from offset_ledger.errors import InvalidInput, KafkaError
from offset_ledger.kafka.mirror import sync_group
from offset_ledger.ledger.sink_outputs import describe_output
from offset_ledger.operate.action_answers import adopt_answer, replay_answer
from offset_ledger.operate.adopt import import_checkpoint
from offset_ledger.operate.answers import mirror_decision_answer, sync_answer
from offset_ledger.operate.inputs import parse_timestamp
from offset_ledger.operate.operations import resolve_group
from offset_ledger.operate.replay import replay

if TYPE_CHECKING:
    from offset_ledger.addresses import KafkaAddress


@grouped
def mirror_cmd(
    pipeline: str = typer.Argument(..., metavar="PIPELINE", help="Pipeline name in the ledger."),
    consumer_group: ConsumerGroup = None,
    once: bool = typer.Option(False, "--once", help="Sync once and exit (the default)."),
    follow: bool = typer.Option(False, "--follow", help="Keep syncing every --interval seconds until Ctrl-C."),
    interval: float = typer.Option(5.0, "--interval", help="Seconds between syncs with --follow."),
    kafka: KafkaOptions = KafkaOptions(), ledger: LedgerOptions = LedgerOptions(),
    out: OutputOptions = OutputOptions(),
) -> None:
    """Commit the ledger's positions to the Kafka consumer group of the same name (never while it has members).

    Examples:

      offset-ledger mirror orders --command-config client.properties

      offset-ledger mirror orders --follow --interval 30
    """
    import time as _time

    fmt = check_format(out.fmt)
    if once and follow:
        raise InvalidInput("choose one of --once and --follow")
    if not 0.1 <= interval <= 86_400:
        raise InvalidInput(f"--interval must be between 0.1 and 86400 seconds, not {interval}")
    cluster = kafka.address()
    cluster.require()
    ops = open_operations(ledger.address(), cluster)
    engine = ops.engine
    try:
        with engine.connect() as conn:
            group = resolve_group(conn, pipeline, consumer_group)
        adapter = ops.kafka  # one client for every sync; ops.close() closes it
        while True:
            try:
                result = sync_group(engine, adapter, pipeline, group)
            except KafkaError as exc:
                if not follow or not exc.retriable:
                    raise
                typer.echo(f"not synced yet: {exc.message}", err=True)
            else:
                if not follow or result.committed:
                    rows = [mirror_decision_answer(d) for d in result.decisions]
                    emit(rows, ["topic", "partition", "ledgerNextOffset", "committedNextOffset", "action"], fmt,
                          sync_answer(result), truncate=out.truncate)
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
        ops.close()


@dataclass(frozen=True)
class KafkaIdsOptions:
    """``import-checkpoint``'s optional Kafka: only servers named here (no environment) record topic ids."""

    bootstrap_servers: Annotated[Optional[str], typer.Option(
        "--bootstrap-server", "--bootstrap-servers", metavar="HOST:PORT[,...]",
        help="Also record the topics' Kafka ids (tells a re-created topic apart later).")] = None
    kafka_option: KafkaOptionItems = None
    command_config: CommandConfig = None
    timeout: TimeoutMs = None

    def address(self) -> KafkaAddress:
        # The option has no envvar on purpose: OFFSET_LEDGER_BOOTSTRAP_SERVERS does not make an
        # import reach for a cluster it was not asked to.
        return kafka_address(self.bootstrap_servers, self.kafka_option, self.command_config, self.timeout,
                             environment=False)


@dataclass(frozen=True)
class Adoption:
    """How ``import-checkpoint`` records the checkpoint: group, version, which source, later generations' root."""

    consumer_group: Annotated[Optional[str], typer.Option(
        "--consumer-group", help="Default: the pipeline name.")] = None
    app_version: Annotated[Optional[str], typer.Option(
        "--app-version", help="Application version running on it.")] = None
    source: Annotated[Optional[str], typer.Option(
        "--source", help="Kafka source index when the query has several, or 'all' (lowest offset per partition).")] = None
    checkpoint_root: Annotated[Optional[str], typer.Option(
        "--checkpoint-root",
        help="Where later fresh generations go (default: the checkpoint's parent directory).")] = None


@grouped
def import_checkpoint_cmd(
    pipeline: Optional[str] = typer.Argument(None, metavar="PIPELINE", show_default=False,
                                             help="Pipeline name in the ledger."),
    checkpoint: Optional[str] = typer.Argument(None, metavar="CHECKPOINT", show_default=False,
                                               help="The running query's checkpoint location (a path or s3a://, "
                                                    "abfss://, gs://, hdfs:// URI)."),
    pipeline_option: Optional[str] = typer.Option(None, "--pipeline", hidden=True,
                                                  help="Deprecated: give the pipeline positionally."),
    adoption: Adoption = Adoption(),
    execute: bool = typer.Option(False, "--execute", help="Write to the ledger (default: dry run)."),
    force: bool = typer.Option(False, "--force", help="Import although the group already has positions."),
    kafka: KafkaIdsOptions = KafkaIdsOptions(), ledger: LedgerOptions = LedgerOptions(),
    out: OutputOptions = OutputOptions(),
) -> None:
    """Adopt a running pipeline: import its checkpoint's last committed batch as positions (dry run by default).

    Examples:

      offset-ledger import-checkpoint orders /checkpoints/orders

      offset-ledger import-checkpoint orders /checkpoints/orders --app-version 1.0 --execute
    """
    import json as _json

    pipeline, checkpoint = pipeline_and_checkpoint(pipeline, checkpoint, pipeline_option)
    fmt = check_format(out.fmt)
    cluster = kafka.address()
    result = import_checkpoint(checkpoint, pipeline=pipeline, consumer_group=adoption.consumer_group,
                               app_version=adoption.app_version, source=adoption.source, execute=execute,
                               force=force, dsn=ledger.address(create=execute).dsn,
                               checkpoint_root=adoption.checkpoint_root, bootstrap_servers=cluster.bootstrap_servers,
                               kafka_options=cluster.options, kafka_timeout_ms=cluster.timeout_ms)
    rows = [{"topic": t, "partition": p, "nextOffset": o}
            for t, parts in result.positions.items() for p, o in parts.items()]
    if fmt == "json":
        typer.echo(_json.dumps(adopt_answer(result), indent=2))
    elif fmt == "csv":
        emit(rows, ["topic", "partition", "nextOffset"], "csv")
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
        emit(rows, ["topic", "partition", "nextOffset"], "table", truncate=out.truncate)
    if result.executed:
        typer.echo(f"imported as checkpoint generation {result.generation} at {result.checkpoint_location}: runs "
                   "on it move these positions from now on", err=True)
    else:
        typer.echo("dry run: nothing written; add --execute to import", err=True)


@grouped
def replay_cmd(
    pipeline: str = typer.Argument(..., metavar="PIPELINE", help="Pipeline name in the ledger."),
    batch: Optional[int] = typer.Option(None, "--batch", help="Spark's batch id (in the current generation's query "
                                                               "unless --query-id / --generation)."),
    since: Optional[str] = typer.Option(None, "--since", "--from", help="Batches at or after this time (ISO 8601 or epoch ms)."),
    until: Optional[str] = typer.Option(None, "--until", "--to", help="Batches before this time (exclusive)."),
    query_id: Optional[str] = typer.Option(None, "--query-id", help="The query whose batch id --batch means."),
    generation: Optional[int] = typer.Option(None, "--generation", help="The checkpoint generation whose query."),
    consumer_group: ConsumerGroup = None, ledger: LedgerOptions = LedgerOptions(),
    kafka: KafkaOptions = KafkaOptions(),
    fmt: str = typer.Option("options", "--format", "-f",
                            help="options: {startingOffsets, endingOffsets, assign}; json: with batches and warnings."),
) -> None:
    """Print the Kafka range recorded batches read: options for spark.read.format("kafka") with assign."""
    import json as _json

    if fmt not in ("options", "json"):
        raise InvalidInput(f"unknown --format {fmt!r}; use options or json")
    start = parse_timestamp(since) if since is not None else None
    end = parse_timestamp(until) if until is not None else None
    ops = open_operations(ledger.address(), kafka.address())
    try:
        result = replay(ops, pipeline, batch=batch, since=start, until=end, query_id=query_id,
                        generation=generation, consumer_group=consumer_group)
    finally:
        ops.close()
    # The API's answer for a batch (GET .../batches/{batch}/range) names the pipeline and the batch too.
    doc = {"pipeline": pipeline, **({"batchId": batch} if batch is not None else {}), **replay_answer(result)}
    if fmt == "json":
        typer.echo(_json.dumps(doc, indent=2))
    else:
        typer.echo(_json.dumps({k: doc[k] for k in ("startingOffsets", "endingOffsets", "assign")}))
    for warning in result.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if result.outputs:
        for out in result.outputs:  # what the replayed batches wrote: re-writing them duplicates it
            typer.echo(f"batch {out['batch_id']} of query {out['query_id']}: {describe_output(dict(out))}", err=True)


def register(app: typer.Typer) -> None:
    """Add ``mirror``, ``import-checkpoint``, ``replay`` to the command line."""
    app.command("mirror")(mirror_cmd)
    app.command("import-checkpoint")(import_checkpoint_cmd)
    app.command("replay")(replay_cmd)
