"""``offset-ledger verify``: has this pipeline read every record exactly once, ever?"""

from __future__ import annotations

from typing import Optional

import typer

from offset_ledger.cli.connections import KafkaServerOptions, LedgerOptions, open_operations
from offset_ledger.cli.option_groups import grouped
from offset_ledger.cli.support import ConsumerGroup, OutputOptions, check_format, emit
from offset_ledger.errors import HistoryUnverified
from offset_ledger.operate.action_answers import verify_answer
from offset_ledger.operate.verifying import verify_pipeline

COLUMNS = ["status", "topic", "partition", "incarnation", "fromOffset", "untilOffset", "records", "kind", "times",
           "explanation", "borders", "notes"]


@grouped
def verify_cmd(
    pipeline: str = typer.Argument(..., metavar="PIPELINE", help="Pipeline name in the ledger."),
    topic: Optional[str] = typer.Option(None, "--topic", metavar="TOPIC", help="Only this topic."),
    unexplained_only: bool = typer.Option(False, "--unexplained-only",
                                          help="List only the stretches nothing explains."),
    consumer_group: ConsumerGroup = None, ledger: LedgerOptions = LedgerOptions(),
    out: OutputOptions = OutputOptions(), kafka: KafkaServerOptions = KafkaServerOptions(),
) -> None:
    """Check that the recorded batch ranges tile every partition from its first start to the current
    position: no gap, no overlap, except where a reset or a finding explains it (each explained
    stretch names it).

    A batch that read fewer rows than its range spans (records retention deleted before the job
    fetched them, with failOnDataLoss=false) is a stretch of kind loss, unless Kafka (--bootstrap-server)
    shows the topic compacted or the missing offsets transaction markers / aborted records.

    A range whose start nobody knows (no start reported, no readable sources/<n>/0) leaves the offsets
    from the previous end to its end unknown: a stretch of kind unknown, never "read once".

    Exit 0 when everything is accounted for, 6 when a stretch is not, or is unknown (the report says
    which, with the batches and generations around it); the usual codes for errors.

    Example: offset-ledger verify orders --format json
    """
    fmt = check_format(out.fmt)
    cluster = kafka.address()
    ops = open_operations(ledger.address(), cluster if cluster and cluster.bootstrap_servers else None)
    try:
        report = verify_pipeline(ops, pipeline, consumer_group, topic=topic)
    finally:
        ops.close()
    rows = report.table_rows()
    if unexplained_only:
        rows = [r for r in rows if r["status"] != "explained"]
    document = verify_answer(report)
    if unexplained_only:
        document["stretches"] = [s for s in document["stretches"] if not s["explained"]]
    counts = document["summary"]
    if fmt == "table" and not rows:
        typer.echo("no gap and no overlap" if not report.stretches else "no unexplained stretch")
    elif fmt != "table" or rows:
        emit(rows, COLUMNS, fmt, document, truncate=out.truncate)
    if fmt == "table":
        verdict = "every record read exactly once, or explained" if report.ok else "NOT accounted for"
        typer.echo(f"{pipeline} ({report.consumer_group}): {counts['partitions']} partition(s), "
                   f"{counts['ranges']:,} ranges, {counts['explained']} explained stretch(es), "
                   f"{counts['unexplained']} unexplained ({counts['unexplainedGaps']} gap(s), "
                   f"{counts['unexplainedOverlaps']} overlap(s){_losses(counts)}{_unknown(counts)}): {verdict} "
                   f"[{report.seconds:.2f}s]")
    if not report.ok:
        # After the report on stdout: one line on stderr and exit code 6 (errors.EXIT_UNVERIFIED).
        raise HistoryUnverified(
            f"pipeline {pipeline!r}: {counts['unexplained']} unexplained stretch(es) "
            f"({counts['unexplainedGaps']} gap(s), {counts['unexplainedOverlaps']} overlap(s){_losses(counts)}"
            f"{_unknown(counts)})",
            pipeline=pipeline, unexplained=counts["unexplained"])


def _losses(counts: dict[str, int]) -> str:
    """The loss part of the summary line, only when there is one (the line is unchanged otherwise)."""
    if not counts.get("unexplainedLosses"):
        return ""
    return f", {counts['unexplainedLosses']} loss(es): {counts['recordsLost']:,} record(s) never read"


def _unknown(counts: dict[str, int]) -> str:
    """The unknown-start part of the summary line, only when there is one."""
    return f", {counts['unknown']} unknown start(s)" if counts.get("unknown") else ""


def register(app: typer.Typer) -> None:
    """Add ``verify`` to the command line."""
    app.command("verify")(verify_cmd)
