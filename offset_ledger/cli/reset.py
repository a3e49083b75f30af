"""``offset-ledger reset``: kafka-consumer-groups' ``--reset-offsets`` vocabulary over the ledger.

Every mode KCG has (``--to-earliest``, ``--to-latest``, ``--to-current``, ``--to-offset N``,
``--shift-by N``, ``--to-datetime``, ``--by-duration``, ``--from-file``) plus ``--to-offsets``
(JSON); ``--dry-run`` is the default and ``--export`` prints the plan as the CSV ``--from-file``
reads. Planning, auditing and writing are ``reset_operations.reset``'s; this module only turns options
into a ``ResetRequest`` and prints the outcome.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from offset_ledger.cli.connections import KafkaOptions, LedgerOptions, open_operations
from offset_ledger.cli.option_groups import grouped
from offset_ledger.cli.support import ConsumerGroup, OutputOptions, check_format, emit
from offset_ledger.errors import InvalidInput, UnknownTopic
from offset_ledger.operate.inputs import parse_timestamp, scope_from_specs, to_epoch_ms
from offset_ledger.operate.kcg import export_csv, parse_offsets_csv
from offset_ledger.operate.reads import positions
from offset_ledger.operate.reset_operations import reset
from offset_ledger.rules.durations import parse_duration
from offset_ledger.rules.model import TopicPartition
from offset_ledger.rules.move_cost import human_bytes, human_span
from offset_ledger.rules.resets import ResetRequest, parse_offsets_body, validate_offset

EXAMPLES = """

Examples:

  offset-ledger reset orders --to-earliest                       # dry run: what would change

  offset-ledger reset orders --shift-by -500 --topic orders:0,1 --execute --reason "replay"

  offset-ledger reset orders --to-current --export > saved.csv   # KCG's topic,partition,offset

  offset-ledger reset orders --from-file saved.csv --execute     # put them back exactly

  offset-ledger reset orders --by-duration PT30M --command-config client.properties
"""


def _read(path: str, what: str) -> str:
    try:
        return sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"cannot read {what} {path!r}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:  # a binary file, or another encoding: name where it breaks
        raise InvalidInput(f"cannot read {what} {path!r}: not UTF-8 text (byte {exc.start})") from exc


def build_request(ops: Any, pipeline: str, consumer_group: Optional[str], *, modes: dict[str, Any],
                  scope: Any, out_of_range: Optional[str]) -> Any:
    """The one ``ResetRequest`` the chosen mode option describes (``modes``: option name -> value or None)."""
    import json
    from datetime import datetime, timezone

    # "is", not "in (None, False)": 0 == False, and offset 0 or a shift by 0 is a choice (KCG takes both).
    chosen = [name for name, value in modes.items() if value is not None and value is not False]
    if len(chosen) != 1:
        raise InvalidInput("choose exactly one of " + ", ".join(modes)
                           + (f" (got {', '.join(chosen)})" if chosen else ""))
    (mode,) = chosen
    value = modes[mode]
    # A shift past either end of the log lands on that end, as kafka-consumer-groups does; explicit
    # targets (offsets, files) are refused instead unless --out-of-range clamp is given.
    policy = out_of_range or ("clamp" if mode in ("--shift-by", "--to-current") else "refuse")
    if policy not in ("refuse", "clamp"):
        raise InvalidInput(f"unknown --out-of-range {policy!r}; use refuse or clamp")
    common: dict[str, Any] = {"scope": scope, "out_of_range": policy}
    if mode == "--to-earliest":
        return ResetRequest("earliest", **common)
    if mode == "--to-latest":
        return ResetRequest("latest", **common)
    if mode == "--to-current":
        return ResetRequest("shift", shift_by=0, **common)
    if mode == "--shift-by":
        return ResetRequest("shift", shift_by=value, **common)
    if mode == "--to-datetime":
        return ResetRequest("timestamp", timestamp_ms=to_epoch_ms(parse_timestamp(value)), **common)
    if mode == "--by-duration":
        since = datetime.now(timezone.utc) - parse_duration(value, "--by-duration")
        return ResetRequest("timestamp", timestamp_ms=to_epoch_ms(since), **common)
    if mode == "--to-offsets":
        try:
            body = json.loads(_read(value, "--to-offsets"))
        except ValueError as exc:
            raise InvalidInput(f"--to-offsets {value!r} is not valid JSON: {exc}") from exc
        return ResetRequest("offsets", offsets=parse_offsets_body(body), **common)
    if mode == "--from-file":
        return ResetRequest("offsets", offsets=parse_offsets_csv(_read(value, "--from-file"), source=value),
                            **common)
    # --to-offset N: every partition in scope, including partitions the ledger has no position on yet.
    validate_offset("--to-offset", "*", value)
    return ResetRequest("offsets", offsets=_every_partition(ops, pipeline, consumer_group, scope, value), **common)


def _every_partition(ops: Any, pipeline: str, consumer_group: Optional[str], scope: Any, offset: int) -> Any:
    if scope:
        topics = sorted(scope)
    else:
        _group, rows = positions(ops, pipeline, consumer_group)
        topics = sorted({r["topic"] for r in rows})
    seen = ops.kafka.snapshot(topics)
    out = {}
    for topic in topics:
        if topic not in seen.partitions:
            raise UnknownTopic(topic)
        wanted = (scope or {}).get(topic)
        for partition in seen.partitions[topic]:
            if wanted is None or partition in wanted:
                out[TopicPartition(topic, partition)] = offset
    return out


@dataclass(frozen=True)
class ResetTarget:
    """Where a reset moves the positions: exactly one mode (KCG's vocabulary), and what to do out of range."""

    to_earliest: Annotated[bool, typer.Option("--to-earliest", help="Each partition's log-start offset.")] = False
    to_latest: Annotated[bool, typer.Option("--to-latest", help="Each partition's log-end offset.")] = False
    to_current: Annotated[bool, typer.Option(
        "--to-current", help="The current positions (with --export: save them).")] = False
    to_offset: Annotated[Optional[int], typer.Option(
        "--to-offset", metavar="N", help="Every partition in scope to N.")] = None
    to_offsets: Annotated[Optional[str], typer.Option(
        "--to-offsets", metavar="FILE", help='JSON file {"topic": {"0": n}} (- = stdin).')] = None
    from_file: Annotated[Optional[str], typer.Option(
        "--from-file", metavar="FILE", help="CSV topic,partition,offset, as KCG and --export write it (- = stdin).")] = None
    to_datetime: Annotated[Optional[str], typer.Option(
        "--to-datetime", metavar="TIME",
        help="First offset at or after TIME (ISO 8601, naive = UTC, or epoch ms).")] = None
    by_duration: Annotated[Optional[str], typer.Option(
        "--by-duration", metavar="DURATION", help="First offset at or after now - DURATION (PT30M, P1DT2H, 30m).")] = None
    shift_by: Annotated[Optional[int], typer.Option(
        "--shift-by", metavar="N", help="Move each position by N (negative replays); stops at the log's ends.")] = None
    out_of_range: Annotated[Optional[str], typer.Option(
        "--out-of-range", metavar="refuse|clamp",
        help="Targets outside [log-start, log-end]: refuse (default) or clamp (the default for --shift-by).")] = None

    def modes(self) -> dict[str, Any]:
        """Mode option name -> its value (None / False: not given), in the order the error names them."""
        return {"--to-earliest": self.to_earliest, "--to-latest": self.to_latest, "--to-current": self.to_current,
                "--to-offset": self.to_offset, "--to-offsets": self.to_offsets, "--from-file": self.from_file,
                "--to-datetime": self.to_datetime, "--by-duration": self.by_duration, "--shift-by": self.shift_by}


@dataclass(frozen=True)
class ResetScope:
    """Which partitions a reset moves: some topics (or some of their partitions), or all of them."""

    topic: Annotated[Optional[list[str]], typer.Option(
        "--topic", metavar="TOPIC[:P,...]", help="Scope: a topic, or some of its partitions (repeatable).")] = None
    all_topics: Annotated[bool, typer.Option(
        "--all-topics", help="Scope: every topic of the pipeline (the default).")] = False


@dataclass(frozen=True)
class ResetAction:
    """Whether a reset is applied and what the audit trail records of it (who, why, forced)."""

    execute: Annotated[bool, typer.Option(
        "--execute", help="Apply the reset (default: dry run, still audited).")] = False
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only show the plan (the default; KCG's flag).")] = False
    reason: Annotated[Optional[str], typer.Option(
        "--reason", metavar="TEXT", help="Why (kept in the audit trail).")] = None
    actor: Annotated[Optional[str], typer.Option(
        "--actor", metavar="NAME", help="Who (default: the OS user).")] = None
    force: Annotated[bool, typer.Option(
        "--force", help="Reset even while the pipeline has an active run.")] = False


@grouped
def reset_cmd(
    pipeline: str = typer.Argument(..., metavar="PIPELINE", help="Pipeline name in the ledger."),
    target: ResetTarget = ResetTarget(), scope: ResetScope = ResetScope(), action: ResetAction = ResetAction(),
    export: bool = typer.Option(False, "--export", help="Print the targets as CSV topic,partition,offset."),
    consumer_group: ConsumerGroup = None, ledger: LedgerOptions = LedgerOptions(),
    kafka: KafkaOptions = KafkaOptions(), out: OutputOptions = OutputOptions(),
) -> None:
    """Reset a pipeline's positions (dry run unless --execute); the next start_from_ledger applies it."""
    import getpass

    fmt = check_format(out.fmt)
    if action.execute and action.dry_run:
        raise InvalidInput("choose one of --dry-run and --execute")
    if scope.all_topics and scope.topic:
        raise InvalidInput("choose one of --all-topics and --topic")
    partitions = scope_from_specs(scope.topic or [])
    cluster = kafka.address()
    if target.by_duration is not None:  # bad input fails before any connection is made
        parse_duration(target.by_duration, "--by-duration")
    ops = open_operations(ledger.address(), cluster)
    try:
        request = build_request(ops, pipeline, consumer_group, modes=target.modes(), scope=partitions,
                                out_of_range=target.out_of_range)
        outcome = reset(ops, pipeline, request, actor=action.actor or getpass.getuser() or "cli",
                        reason=action.reason, dry_run=not action.execute, force=action.force,
                        consumer_group=consumer_group)
    finally:
        ops.close()
    _print(outcome, fmt, export, truncate=out.truncate)


def _print(outcome: Any, fmt: str, export: bool, *, truncate: bool = True) -> None:
    doc = outcome.to_dict()
    if export:
        # The export is applied later (--from-file): a target Kafka cannot hold is never written to it.
        outcome.plan.check_executable()
        sys.stdout.write(export_csv(outcome.plan.partitions))
    else:
        # The columns are the JSON answer's own names and values (operate/answers.partition_reset_dict),
        # with the cost's per-partition bytes and span beside them.
        costs = {(c["topic"], c["partition"]): c for c in (doc["cost"] or {}).get("partitions", [])}
        rows = [{**p, **{k: costs.get((p["topic"], p["partition"]), {}).get(k) for k in ("approxBytes", "spanSeconds")}}
                for p in doc["partitions"]]
        emit(rows, RESET_COLUMNS, fmt, doc, truncate=truncate)
    refused = sum(1 for p in outcome.plan.partitions if p.refused)
    if outcome.cost is not None:
        typer.echo(cost_line(outcome.cost, refused=refused), err=True)
    if outcome.dry_run:
        note = " (executing would be refused: targets out of range)" if outcome.plan.refused else ""
        typer.echo(f"dry run recorded as reset {doc['resetId']}{note}; pass --execute to apply", err=True)
    else:
        typer.echo(f"reset {doc['resetId']} is pending: the next start_from_ledger applies it through a "
                   "fresh checkpoint", err=True)


#: a reset's table and CSV columns: names of its JSON answer (a refused partition: no target, nothing moved)
RESET_COLUMNS = ["topic", "partition", "beforeNextOffset", "targetNextOffset", "logStartOffset", "logEndOffset",
                 "recordsReplayed", "recordsSkipped", "approxBytes", "spanSeconds", "outOfRange", "clamped",
                 "requestedNextOffset"]


def cost_line(cost: Any, *, refused: int = 0) -> str:
    """One line for people: what the move re-reads and skips, about how many bytes, over what time
    (``refused`` partitions move nothing and are not counted; the line says so)."""
    parts = []
    for direction, records, size in (("re-reads", cost.records_reread, cost.bytes_reread),
                                     ("skips", cost.records_skipped, cost.bytes_skipped)):
        first, last = cost.span("reread" if direction == "re-reads" else "skip")
        when = "" if first is None or last is None else \
            f", records from {_minute(first)} to {_minute(last)} ({human_span(last - first)})"
        parts.append(f"{direction} {records:,} records" + (f" (~{human_bytes(size)}{when})" if records else ""))
    unknown = "" if cost.complete else ("; some sizes or times unknown (Kafka did not answer in time, or "
                                        "DESCRIBE on the cluster is not granted)")
    not_counted = "" if not refused else (
        f"; {refused} partition{'s' if refused != 1 else ''} refused (target outside the log): not counted")
    return "cost: " + "; ".join(parts) + not_counted + unknown


def _minute(ms: int) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def register(app: typer.Typer) -> None:
    """Add ``reset`` to the command line."""
    app.command("reset", help=(reset_cmd.__doc__ or "") + EXAMPLES)(reset_cmd)
