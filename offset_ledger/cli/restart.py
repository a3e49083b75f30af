"""``offset-ledger resolve``: the plan a restart would use, printed, nothing written."""

from __future__ import annotations

from typing import Optional

import typer

from offset_ledger.cli.support import (
    BootstrapOption,
    CommandConfigOption,
    DsnOption,
    KafkaOptionOption,
    TimeoutOption,
    kafka_client,
    safe_text,
)


def resolve_cmd(
    pipeline: str = typer.Argument(..., metavar="PIPELINE", help="Pipeline name in the ledger."),
    topic: Optional[list[str]] = typer.Option(None, "--topic", "-t", help="Topic the pipeline subscribes to (repeatable)."),
    pattern: Optional[str] = typer.Option(None, "--pattern", help="Topic regex, like subscribePattern (instead of --topic)."),
    bootstrap_servers: Optional[str] = BootstrapOption,
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
    kafka_option: Optional[list[str]] = KafkaOptionOption,
    command_config: Optional[str] = CommandConfigOption, timeout: Optional[int] = TimeoutOption,
    window: Optional[str] = typer.Option(None, "--window",
                                         help="Windowed pipeline: the window length (10m, '10 minutes'); rewinds for open windows."),
    slide: Optional[str] = typer.Option(None, "--slide", help="Sliding windows: the slide (5m)."),
    watermark_delay: Optional[str] = typer.Option(None, "--watermark-delay",
                                                  help="The withWatermark delay (10s); default: read back from the ledger."),
    event_time_is_kafka_timestamp: bool = typer.Option(
        False, "--event-time-is-kafka-timestamp", help="The event time is the Kafka record timestamp (tighter rewind)."),
    dsn: Optional[str] = DsnOption,
) -> None:
    """Print the startingOffsets JSON a restart would use (stdout) and the findings (stderr); writes nothing.

    Examples:

      offset-ledger resolve orders --topic orders --bootstrap-server broker:9093 --command-config client.properties

      offset-ledger resolve orders --pattern 'orders-.*' --on-data-loss earliest
    """
    from offset_ledger.cli.reset import cost_line
    from offset_ledger.errors import ConfigError
    from offset_ledger.ledger.engine import make_engine
    from offset_ledger.operate.move_cost import plan_cost
    from offset_ledger.operate.operations import Operations
    from offset_ledger.operate.restart_plan import plan_restart, resolve_ref

    kafka = kafka_client(bootstrap_servers, kafka_option, command_config, timeout)
    if window is not None or slide is not None or watermark_delay is not None:
        # Bad durations fail before any connection is made.
        from offset_ledger.rules.durations import parse_duration
        from offset_ledger.rules.stateful import WindowSpec

        for option, value in (("--window", window), ("--slide", slide), ("--watermark-delay", watermark_delay)):
            if value is not None:
                parse_duration(value, option)  # each value's grammar first, then how they combine
        if window is None:
            raise ConfigError("--slide and --watermark-delay need --window")
        WindowSpec.parse(window, slide)
    kafka.require()
    ops = Operations(make_engine(dsn, create=False), bootstrap_servers=kafka.bootstrap_servers,
                     kafka_options=kafka.options, kafka_timeout_ms=kafka.timeout_ms)
    try:
        from offset_ledger.operate.restart import policies_in_effect
        from offset_ledger.rules.policies import Policies
        from offset_ledger.rules.restart_options import PipelineRef, RestartOptions

        options = RestartOptions(topics=tuple(topic) if topic else None, topic_pattern=pattern,
                                 allow_first_run=allow_first_run)
        given = Policies(first_run=first_run, on_data_loss=on_data_loss,  # type: ignore[arg-type]
                         window=window, slide=slide, watermark_delay=watermark_delay,
                         event_time_is_kafka_timestamp=event_time_is_kafka_timestamp or None)
        use, _ = policies_in_effect(ops, pipeline, given)  # as start_from_ledger applies them
        group = resolve_ref(ops.engine, PipelineRef(pipeline, consumer_group))
        # A window only when asked here: a stored one applies on start_from_ledger's upgrades.
        plan, ledger, cluster = plan_restart(ops, group, options, use,
                                             use.window_spec() if window is not None else None)
        cost = plan_cost(ops.kafka, plan.starting_offsets, ledger.positions, cluster.watermarks)
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
    if ledger.pending_reset_ids:
        ids = ", ".join(str(i) for i in ledger.pending_reset_ids)
        typer.echo(f"pending reset(s) {ids}: included above; they take effect through start_from_ledger's "
                   "fresh checkpoint", err=True)


def register(app: typer.Typer) -> None:
    """Add ``resolve`` to the command line."""
    app.command("resolve")(resolve_cmd)
