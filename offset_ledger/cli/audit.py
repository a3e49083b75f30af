"""``offset-ledger findings`` and ``offset-ledger resets``: what happened, from the command line."""

from __future__ import annotations

from typing import Optional

import typer

from offset_ledger.cli.connections import LedgerOptions, open_operations
from offset_ledger.cli.option_groups import grouped
from offset_ledger.cli.support import ConsumerGroup, OutputOptions, check_format, check_limit, emit, more_signal
from offset_ledger.operate.audit import MAX_PAGE, list_findings
from offset_ledger.operate.inputs import parse_timestamp
from offset_ledger.operate.reset_operations import resets_page


@grouped
def findings_cmd(
    pipeline: str = typer.Argument(..., metavar="PIPELINE", help="Pipeline name in the ledger."),
    kind: Optional[str] = typer.Option(None, "--kind", metavar="KIND",
                                       help="Only this kind (gap, regression, data_loss, foreign_run, ...)."),
    since: Optional[str] = typer.Option(None, "--since", metavar="TIME",
                                        help="Seen at or after TIME (ISO 8601 or epoch ms)."),
    limit: int = typer.Option(50, "--limit", metavar="N", help="Findings per page (1-1000)."),
    before: Optional[int] = typer.Option(None, "--before", metavar="ID", help="Page: findings older than ID."),
    every: bool = typer.Option(False, "--all", help="Every finding, page after page (ignores --limit)."),
    consumer_group: ConsumerGroup = None, ledger: LedgerOptions = LedgerOptions(),
    out: OutputOptions = OutputOptions(),
) -> None:
    """Findings of a pipeline, newest first: gaps, regressions, data loss, foreign runs, resets consumed.

    A cut-short answer says so in every format ("more: --before ID" on stderr).
    """
    fmt = check_format(out.fmt)
    if not every:
        check_limit(limit)
    start = parse_timestamp(since) if since is not None else None
    ops = open_operations(ledger.address())
    rows: list[dict] = []
    try:
        while True:
            group, page, before = list_findings(ops, pipeline, consumer_group, kind=kind, since=start,
                                                limit=MAX_PAGE if every else limit, before_id=before)
            rows.extend(page)
            if not every or before is None:
                break
    finally:
        ops.close()
    if fmt == "table":  # a finding seen once has no lastSeenAt (null in JSON, as the API): its time is createdAt
        shown = [{**r, "lastSeenAt": r["lastSeenAt"] or r["createdAt"]} for r in rows]
        emit(shown, ["id", "lastSeenAt", "occurrences", "kind", "topic", "partition", "expectedOffset",
                     "actualOffset", "message"], fmt, truncate=out.truncate)
        if before is not None:
            more_signal(f"--before {before} (or --all)")
        return
    emit(rows, ["id", "createdAt", "lastSeenAt", "occurrences", "kind", "topic", "partition", "expectedOffset",
                "actualOffset", "message"], fmt,
         {"pipeline": pipeline, "consumerGroup": group, "findings": rows, "nextBefore": before})
    if before is not None:
        more_signal(f"--before {before} (or --all)")


@grouped
def resets_cmd(
    pipeline: str = typer.Argument(..., metavar="PIPELINE", help="Pipeline name in the ledger."),
    limit: int = typer.Option(50, "--limit", metavar="N", help="Newest N resets (1-1000, as every --limit)."),
    dry_runs: bool = typer.Option(True, "--dry-runs/--no-dry-runs",
                                  help="Show dry runs too, marked DRY RUN (the default), or executed resets only."),
    consumer_group: ConsumerGroup = None, ledger: LedgerOptions = LedgerOptions(),
    out: OutputOptions = OutputOptions(),
) -> None:
    """The audit trail of a pipeline's resets, newest first: who, when, why, mode, status, partitions."""
    fmt = check_format(out.fmt)
    check_limit(limit)
    ops = open_operations(ledger.address())
    try:
        group, found, more = resets_page(ops, pipeline, consumer_group, limit=limit, dry_runs=dry_runs)
    finally:
        ops.close()
    # A dry run applied nothing: its row says so where the eye starts (the KIND column), not only in
    # a true/false column at the end.
    rows = [{**r, "kind": "DRY RUN" if r["dryRun"] else "reset", "partitions": len(r["partitions"]),
             "changes": "; ".join(f"{p['topic']}:{p['partition']} {p['beforeNextOffset']}->{p['afterNextOffset']}"
                                  + (" refused" if p["refused"] else "")
                                  for p in r["partitions"][:4]) + (" ..." if len(r["partitions"]) > 4 else "")}
            for r in found]
    columns = ["resetId", "kind", "createdAt", "actor", "mode", "status", "forced", "partitions", "reason", "changes"]
    if fmt == "csv":  # the machine formats keep the API's dryRun field
        columns = ["resetId", "createdAt", "actor", "mode", "status", "dryRun", "forced", "partitions", "reason",
                   "changes"]
    emit(rows, columns, fmt, {"pipeline": pipeline, "consumerGroup": group, "resets": found}, truncate=out.truncate)
    dry = sum(1 for r in found if r["dryRun"])
    if dry and fmt == "table":
        typer.echo(f"{dry} of {len(found)} shown are dry runs: audited, nothing applied (--no-dry-runs hides them)",
                   err=True)
    if more:
        more_signal(f"--limit {min(limit * 2, MAX_PAGE)} (older resets not shown)" if limit < MAX_PAGE
                    else f"older resets not shown (the newest {MAX_PAGE} are)")


def register(app: typer.Typer) -> None:
    """Add ``findings`` and ``resets`` to the command line."""
    app.command("findings")(findings_cmd)
    app.command("resets")(resets_cmd)
