"""``offset-ledger failover``: move a pipeline to the MirrorMaker 2 backup cluster (or back)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Annotated, Optional

import typer

from offset_ledger.cli.connections import CommandConfig, KafkaOptionItems, LedgerOptions
from offset_ledger.cli.option_groups import grouped
from offset_ledger.cli.support import ConsumerGroup, OutputOptions, check_format, emit, safe_text
from offset_ledger.errors import InvalidInput
from offset_ledger.kafka.client_config import gather
from offset_ledger.operate.action_answers import failover_json
from offset_ledger.operate.failover import fail_over
from offset_ledger.operate.operations import Operations
from offset_ledger.rules.failover import FailoverRequest


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@dataclass(frozen=True)
class TargetCluster:
    """The cluster to fail over to: its brokers, and its client properties (-o, --command-config)."""

    to_bootstrap: Annotated[str, typer.Option(
        "--to-bootstrap", metavar="HOST:PORT",
        help="Bootstrap servers of the cluster to fail over to (the MM2 target).")]
    kafka_option: KafkaOptionItems = None
    command_config: CommandConfig = None


@dataclass(frozen=True)
class MirrorMaker:
    """How MirrorMaker 2 names and translates what it mirrors (its aliases, policy, and the untranslatable)."""

    source_alias: Annotated[str, typer.Option(
        "--source-alias", help="MirrorMaker 2's alias of the cluster the pipeline read (the MM2 source).")] = "primary"
    target_alias: Annotated[Optional[str], typer.Option(
        "--target-alias", help="MM2's alias of the target: topics that came from it map back (failing back).")] = None
    replication_policy: Annotated[str, typer.Option(
        "--replication-policy", metavar="default|identity",
        help="MM2's replication policy: default (<alias>.<topic>) or identity.")] = "default"
    separator: Annotated[str, typer.Option(
        "--separator", help="The default policy's separator (replication.policy.separator).")] = "."
    uncheckpointed: Annotated[str, typer.Option(
        "--uncheckpointed", metavar="fail|earliest",
        help="Partitions MM2 has no safe translation for: fail (default, names them) or earliest (the backup's "
             "log start).")] = "fail"


@dataclass(frozen=True)
class FailoverAction:
    """Whether ``failover`` writes: ``--execute`` / ``--dry-run`` (the default) and ``--force``."""

    execute: Annotated[bool, typer.Option(
        "--execute", help="Record the new generation and positions (default: a dry run, as reset).")] = False
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Plan and print; write nothing (the default).")] = False
    force: Annotated[bool, typer.Option(
        "--force", help="Fail over although the ledger shows an active run.")] = False


@grouped
def failover_cmd(
    pipeline: str = typer.Argument(..., metavar="PIPELINE", help="Pipeline name in the ledger."),
    *, target: TargetCluster,
    mm2: MirrorMaker = MirrorMaker(),
    topic: Optional[list[str]] = typer.Option(None, "--topic", "-t",
                                              help="Only these ledger topics (repeatable; default: all of the pipeline's)."),
    consumer_group: ConsumerGroup = None,
    checkpoint_root: Optional[str] = typer.Option(
        None, "--checkpoint-root", help="Where the new generation goes (default: the current generation's root)."),
    action: FailoverAction = FailoverAction(),
    out: OutputOptions = OutputOptions(),
    as_json: bool = typer.Option(False, "--json", hidden=True, help="Deprecated: --format json."),
    ledger: LedgerOptions = LedgerOptions(),
) -> None:
    """Start PIPELINE on the MirrorMaker 2 backup cluster from MM2's translation of its mirrored group.

    The pipeline's consumer-group mirror (commit_to_kafka) must have committed its positions on the
    primary, and MM2 must checkpoint that group into the backup. Prints, per partition, where the
    backup starts and how many records at most are read again, then the startingOffsets JSON and
    the new checkpoint location. The Kafka options (-o, --command-config) are the target's.

    Examples:

      offset-ledger failover orders --to-bootstrap backup:9092 --source-alias primary

      offset-ledger failover orders --to-bootstrap primary:9092 --source-alias backup --target-alias primary --uncheckpointed earliest --execute

    A dry run unless --execute, like reset, import-checkpoint and prune (until 0.x it wrote by default).

    Failing back (the second example): MM2 translates nothing back onto the original topic, so it
    starts at that topic's log start (docs/failover.md, "Failing back").
    """
    # Bad values fail before anything connects.
    fmt = check_format(out.fmt)
    if as_json:  # the one output option of every command, -f json, since this release
        typer.echo("note: --json is deprecated; use -f json", err=True)
        fmt = "json"
    if mm2.uncheckpointed not in ("fail", "earliest"):
        raise InvalidInput(f"--uncheckpointed must be fail or earliest, not {mm2.uncheckpointed!r}")
    if mm2.replication_policy not in ("default", "identity"):
        raise InvalidInput(f"--replication-policy must be default or identity, not {mm2.replication_policy!r}")
    if not target.to_bootstrap.strip():
        raise InvalidInput("--to-bootstrap must name the target cluster's brokers")
    if action.execute and action.dry_run:
        raise InvalidInput("--execute and --dry-run contradict each other; give one")
    request = FailoverRequest(
        to_bootstrap=target.to_bootstrap, source_alias=mm2.source_alias, target_alias=mm2.target_alias,
        replication_policy=mm2.replication_policy,  # type: ignore[arg-type]
        separator=mm2.separator, uncheckpointed=mm2.uncheckpointed,  # type: ignore[arg-type]
        topics=tuple(topic) if topic else None, checkpoint_root=checkpoint_root,
        kafka_options=gather(target.kafka_option, target.command_config))
    # A reader's address: a mistyped SQLite path is an error, never a new ledger.
    ops = Operations.open(ledger.address())
    try:
        result = fail_over(ops, pipeline, request, consumer_group=consumer_group, dry_run=not action.execute,
                           force=action.force)
    finally:
        ops.close()
    if not action.execute and not action.dry_run:
        # Deprecation, for one release: a bare failover used to write; say so, once, on stderr.
        typer.echo("note: failover is a dry run unless --execute (it wrote by default before this release)",
                   err=True)
    if fmt == "json":
        typer.echo(failover_json(result))
        return
    rows = [{"targetTopic": p.target_topic, "partition": p.partition, "status": p.status,
             "ledgerNextOffset": p.ledger_next_offset, "checkpointUpstreamOffset": p.checkpoint_upstream_offset,
             "startNextOffset": p.start_next_offset, "rereadMax": p.reread_max,
             "rereadSpan": f"{_when(p.reread_from_ms)} .. {_when(p.reread_until_ms)}" if p.reread_max else None}
            for p in result.plan.partitions]
    columns = ["targetTopic", "partition", "status", "ledgerNextOffset", "checkpointUpstreamOffset",
               "startNextOffset", "rereadMax"]
    if fmt == "csv":
        emit(rows, columns, "csv")
        return
    emit(rows, [*columns, "rereadSpan"], "table", truncate=out.truncate)
    typer.echo(f"startingOffsets: {result.starting_offsets_json}")
    if result.dry_run:
        typer.echo("dry run: nothing written; add --execute to fail over", err=True)
    else:
        typer.echo(f"checkpoint: {result.checkpoint_location} (generation {result.generation})")
    for finding in result.findings:
        typer.echo(safe_text(f"{finding.kind}: {finding.message}"), err=True)


def register(app: typer.Typer) -> None:
    """Add ``failover`` to the command line."""
    app.command("failover")(failover_cmd)
