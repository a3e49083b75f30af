"""``offset-ledger resolve``: the plan a restart would use, printed, nothing written."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Optional

import typer

from offset_ledger.cli.connections import KafkaOptions, LedgerOptions, open_operations
from offset_ledger.cli.option_groups import grouped
from offset_ledger.cli.reset import cost_line
from offset_ledger.cli.support import ConsumerGroup, OutputOptions, check_format, emit, require_named, safe_text
from offset_ledger.errors import ConfigError
from offset_ledger.operate.action_answers import restart_preview_answer
from offset_ledger.operate.move_cost import plan_cost
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.restart import policies_in_effect
from offset_ledger.operate.restart_plan import plan_restart, resolve_ref
from offset_ledger.operate.restart_preview import preview_restart
from offset_ledger.rules.durations import parse_duration
from offset_ledger.rules.policies import Policies
from offset_ledger.rules.restart_options import PipelineRef, RestartOptions
from offset_ledger.rules.stateful import WindowSpec


@dataclass(frozen=True)
class Windowing:
    """A windowed pipeline's shape, for the rewind that reopens its open windows (``rules/stateful``)."""

    window: Annotated[Optional[str], typer.Option(
        "--window", help="Windowed pipeline: the window length (10m, '10 minutes'); rewinds for open windows.")] = None
    slide: Annotated[Optional[str], typer.Option("--slide", help="Sliding windows: the slide (5m).")] = None
    watermark_delay: Annotated[Optional[str], typer.Option(
        "--watermark-delay", help="The withWatermark delay (10s); default: read back from the ledger.")] = None
    event_time_is_kafka_timestamp: Annotated[bool, typer.Option(
        "--event-time-is-kafka-timestamp",
        help="The event time is the Kafka record timestamp (tighter rewind).")] = False


@grouped
def resolve_cmd(
    pipeline: str = typer.Argument(..., metavar="PIPELINE", help="Pipeline name in the ledger."),
    topic: Optional[list[str]] = typer.Option(None, "--topic", "-t", help="Topic the pipeline subscribes to (repeatable)."),
    pattern: Optional[str] = typer.Option(None, "--pattern", help="Topic regex, like subscribePattern (instead of --topic)."),
    kafka: KafkaOptions = KafkaOptions(),
    first_run: Optional[str] = typer.Option(
        None, "--first-run",
        help="No ledger entries: earliest (default) | latest | timestamp (ISO-8601 or epoch ms) | JSON offsets."),
    allow_first_run: bool = typer.Option(
        False, "--allow-first-run",
        help="Start over with --first-run although the ledger knows the pipeline (another group or other topics)."),
    on_data_loss: Optional[str] = typer.Option(
        None, "--on-data-loss", metavar="fail|earliest",
        help="Offsets outside the log: fail | earliest (default: the stored policy, else fail)."),
    consumer_group: Optional[str] = typer.Option(None, "--consumer-group",
                                                 help="Default: the pipeline's only group in the ledger."),
    windowing: Windowing = Windowing(),
    ledger: LedgerOptions = LedgerOptions(),
) -> None:
    """Print the startingOffsets JSON a restart would use (stdout) and the findings (stderr); writes nothing.

    A pipeline the ledger does not know is refused (did you mean ...?) unless --first-run says
    where it starts. offset-ledger plan previews the whole restart (checkpoint, why, cost).

    Examples:

      offset-ledger resolve orders --topic orders --bootstrap-server broker:9093 --command-config client.properties

      offset-ledger resolve orders --pattern 'orders-.*' --on-data-loss earliest
    """
    window, slide, watermark_delay = windowing.window, windowing.slide, windowing.watermark_delay
    address = kafka.address()
    if window is not None or slide is not None or watermark_delay is not None:
        # Bad durations fail before any connection is made.
        for option, value in (("--window", window), ("--slide", slide), ("--watermark-delay", watermark_delay)):
            if value is not None:
                parse_duration(value, option)  # each value's grammar first, then how they combine
        if window is None:
            raise ConfigError("--slide and --watermark-delay need --window")
        WindowSpec.parse(window, slide)
    address.require()
    ops = Operations.open(ledger.address(), address)
    try:
        if first_run is None:
            # A typo must not answer exit 0 with a replay-everything plan: a first run is asked for.
            require_named(ops.engine, pipeline)

        options = RestartOptions(topics=tuple(topic) if topic else None, topic_pattern=pattern,
                                 allow_first_run=allow_first_run)
        given = Policies(first_run=first_run, on_data_loss=on_data_loss,  # type: ignore[arg-type]
                         window=window, slide=slide, watermark_delay=watermark_delay,
                         event_time_is_kafka_timestamp=windowing.event_time_is_kafka_timestamp or None)
        use, _ = policies_in_effect(ops, pipeline, given)  # as start_from_ledger applies them
        group = resolve_ref(ops.engine, PipelineRef(pipeline, consumer_group))
        # A window only when asked here: a stored one applies on start_from_ledger's upgrades.
        plan, recorded, cluster = plan_restart(ops, group, options, use,
                                               use.window_spec() if window is not None else None)
        cost = plan_cost(ops.kafka, plan.starting_offsets, recorded.positions, cluster.watermarks)
    finally:
        ops.close()
    typer.echo(plan.starting_offsets_json)
    if cost.records_reread or cost.records_skipped:  # on a fresh checkpoint; resuming one moves nothing
        typer.echo(cost_line(cost) + " (when started on a fresh checkpoint)", err=True)
    if plan.event_time_floor is not None:
        typer.echo(f"event-time floor: {plan.event_time_floor.isoformat()} (drop records before it; "
                   "start_from_ledger opens a fresh checkpoint for this plan)", err=True)
    for finding in plan.findings:
        where = f" {finding.topic}/{finding.partition}" if finding.topic is not None else ""
        typer.echo(safe_text(f"{finding.kind}{where}: {finding.message}"), err=True)
    if recorded.pending_reset_ids:
        ids = ", ".join(str(i) for i in recorded.pending_reset_ids)
        typer.echo(f"pending reset(s) {ids}: included above; they take effect through start_from_ledger's "
                   "fresh checkpoint", err=True)




@dataclass(frozen=True)
class PlannedCheckpoint:
    """The checkpoint side of a restart to preview: its root, the version about to start, fresh or not."""

    checkpoint_root: Annotated[str, typer.Option(
        "--checkpoint-root", metavar="ROOT", help="Where its checkpoint generations live (as start_from_ledger's).")]
    app_version: Annotated[Optional[str], typer.Option(
        "--app-version", metavar="V", help="The version about to start (as start_from_ledger's app_version).")] = None
    new_checkpoint: Annotated[bool, typer.Option(
        "--new-checkpoint", help="As start_from_ledger(new_checkpoint=True).")] = False


@dataclass(frozen=True)
class Subscription:
    """What the pipeline reads: topics by name, or a pattern (as Spark's subscribe / subscribePattern)."""

    topic: Annotated[Optional[list[str]], typer.Option(
        "--topic", "-t", help="Topic it subscribes to (repeatable).")] = None
    pattern: Annotated[Optional[str], typer.Option("--pattern", help="Topic regex, like subscribePattern.")] = None


@grouped
def plan_cmd(
    pipeline: str = typer.Argument(..., metavar="PIPELINE", help="Pipeline name in the ledger."),
    *, checkpoint: PlannedCheckpoint, subscription: Subscription = Subscription(),
    first_run: Optional[str] = typer.Option(
        None, "--first-run", help="A pipeline the ledger does not know yet starts here: earliest | latest | "
                                  "timestamp | JSON offsets (without it an unknown name is refused)."),
    allow_first_run: bool = typer.Option(False, "--allow-first-run",
                                         help="Start a known pipeline over with --first-run."),
    on_data_loss: Optional[str] = typer.Option(None, "--on-data-loss", metavar="fail|earliest",
                                               help="Offsets outside the log (default: the stored policy, else fail)."),
    consumer_group: ConsumerGroup = None, kafka: KafkaOptions = KafkaOptions(),
    ledger: LedgerOptions = LedgerOptions(), out: OutputOptions = OutputOptions(),
) -> None:
    """Preview the restart start_from_ledger would make now (a dry run: nothing is written).

    Fresh or resumed checkpoint and why, where, the startingOffsets, what each partition re-reads or
    skips, and the findings the restart would record.

    Example: offset-ledger plan orders --app-version 2.0 --checkpoint-root /checkpoints/orders --topic orders
    """
    import os

    fmt = check_format(out.fmt)
    root = checkpoint.checkpoint_root
    if "://" not in root and not root.startswith(("/", "file:")):
        root = os.path.abspath(root)  # as start_from_ledger makes a relative local root absolute
    cluster = kafka.address()
    cluster.require()
    ops = open_operations(ledger.address(), cluster)
    try:
        if first_run is None:  # a typo is refused (with what exists), never previewed as a first run
            require_named(ops.engine, pipeline)
        topic = subscription.topic
        options = RestartOptions(topics=tuple(topic) if topic else None, topic_pattern=subscription.pattern,
                                 checkpoint_root=root, app_version=checkpoint.app_version,
                                 new_checkpoint=checkpoint.new_checkpoint, allow_first_run=allow_first_run)
        given = Policies(first_run=first_run, on_data_loss=on_data_loss)  # type: ignore[arg-type]
        preview = preview_restart(ops, PipelineRef(pipeline, consumer_group), options, given)
    finally:
        ops.close()
    _print_preview(preview, fmt, truncate=out.truncate)


def _print_preview(preview, fmt: str, *, truncate: bool) -> None:  # type: ignore[no-untyped-def]
    doc = restart_preview_answer(preview)
    plan = preview.plan
    costs = {(c.tp.topic, c.tp.partition): c for c in (preview.cost.partitions if preview.cost else ())}
    rows = []
    for t, parts in sorted(plan.starting_offsets.items()):
        for p, start in sorted(parts.items(), key=lambda kv: int(kv[0])):
            c = costs.get((t, int(p)))
            rows.append({"topic": t, "partition": int(p), "ledgerPosition": preview.positions.get((t, int(p))),
                         "startingOffset": start,
                         "reread": c.records if c is not None and c.direction == "reread" else 0,
                         "skip": c.records if c is not None and c.direction == "skip" else 0})
    if fmt != "table":
        emit(rows, ["topic", "partition", "ledgerPosition", "startingOffset", "reread", "skip"], fmt, doc)
        return
    where = "FRESH" if plan.fresh_checkpoint else "RESUMED"
    typer.echo(safe_text(f"pipeline {plan.pipeline} (consumer group {plan.consumer_group}): {where} checkpoint "
                         f"generation {plan.generation} at {plan.checkpoint_location}"))
    typer.echo(safe_text(f"why: {preview.why}"))
    typer.echo(f"startingOffsets: {plan.starting_offsets_json}" + ("" if plan.fresh_checkpoint else
                                                                  " (Spark ignores them on a resumed checkpoint)"))
    emit(rows, ["topic", "partition", "ledgerPosition", "startingOffset", "reread", "skip"], fmt, truncate=truncate)
    if preview.cost is not None and (preview.cost.records_reread or preview.cost.records_skipped):
        typer.echo(cost_line(preview.cost))
    if plan.event_time_floor is not None:
        typer.echo(f"event-time floor: {plan.event_time_floor.isoformat()} (drop records before it)")
    for finding in plan.findings:
        where_ = f" {finding.topic}/{finding.partition}" if finding.topic is not None else ""
        typer.echo(safe_text(f"finding {finding.kind}{where_}: {finding.message}"))
    typer.echo("nothing written: start_from_ledger (or Pipeline.start) with these arguments makes this restart; "
               "it first records batches the old checkpoint committed that the ledger lacks", err=True)


def register(app: typer.Typer) -> None:
    """Add ``resolve`` and ``plan`` to the command line."""
    app.command("resolve")(resolve_cmd)
    app.command("plan")(plan_cmd)
