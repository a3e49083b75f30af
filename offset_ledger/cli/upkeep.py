"""The ledger's upkeep on the command line: ``db upgrade`` (the schema), ``db grant`` (team roles) and
``prune`` (old history)."""

from __future__ import annotations

from typing import Any, Optional

import typer

from offset_ledger.api.tokens import ROLES, ApiToken
from offset_ledger.cli.connections import LedgerOptions
from offset_ledger.cli.option_groups import grouped
from offset_ledger.cli.support import Format, check_format, emit, require_named
from offset_ledger.ledger.engine import check_connection, current_revision, require_schema, upgrade
from offset_ledger.ledger.partitions import ensure_ahead
from offset_ledger.ledger.prune import prune
from offset_ledger.ledger.row_security import (
    check_role,
    execute as run_sql,
    grant_sql,
    ledger_schema,
    present,
    require_postgres,
    team_access,
    walls_kept,
)
from offset_ledger.operate.operations import Operations
from offset_ledger.rules.durations import parse_duration
from offset_ledger.rules.scope import parse_scope


def _engine(ledger: LedgerOptions, *, create: bool) -> Any:
    """The ledger's engine, through the one place that makes engines (``Operations.open``)."""
    return Operations.open(ledger.address(create=create)).engine


@grouped
def db_upgrade(ledger: LedgerOptions = LedgerOptions(),
               revision: str = typer.Option("head", help="Target revision.")) -> None:
    """Create or upgrade the ledger schema (Alembic migrations)."""
    engine = _engine(ledger, create=True)  # the one command that makes a ledger where there is none
    upgrade(engine, revision)
    typer.echo(f"ledger schema at revision {current_revision(engine)} ({engine.url.render_as_string()})")
    made = ensure_ahead(engine) if engine.dialect.name == "postgresql" else []
    if made:
        typer.echo(f"offset_ranges partitions made ahead: {', '.join(made)}")
    if walls_kept(engine):  # re-applied in the migration's transaction (migrations/env.py), on every path
        typer.echo("row-level security re-applied for the team roles (offset-ledger db grant)")


@grouped
def db_grant(
    role: str = typer.Option(..., "--role", help="The team's database role (created when missing, as LOGIN)."),
    pipelines: str = typer.Option(..., "--pipelines", metavar="PATTERN[,...]",
                                  help="Pipelines the role may write: exact names and prefixes ending in * "
                                       "(team-a-*); '*' is every pipeline."),
    execute: bool = typer.Option(False, "--execute", help="Run the SQL (default: print it, change nothing)."),
    ledger: LedgerOptions = LedgerOptions(),
) -> None:
    """Make (or update) a writer role that reaches only its pipelines' rows (PostgreSQL row-level security).

    Run it with the ledger owner's DSN (the role that ran db upgrade). The role's reset, finding and
    policy history is append-only. SQLite is single-user and has no roles.
    """
    check_role(role)
    scope = parse_scope(pipelines, separators=",|")  # bad input fails before any connection is made
    engine = _engine(ledger, create=False)
    check_connection(engine)
    require_schema(engine)  # the ledger must exist and hold the schema (0017's ledger_role_scopes)
    require_postgres(engine.url.render_as_string())
    with engine.connect() as conn:
        guarded = present(conn)  # the tables and columns of this ledger's revision
    statements = grant_sql(role, scope, ledger_schema(engine), guarded)
    if not execute:
        typer.echo(";\n".join(statements) + ";")
        typer.echo(f"-- dry run: role {role!r} would reach pipelines {str(scope)!r}; add --execute to apply", err=True)
        return
    run_sql(engine, statements)
    typer.echo(f"role {role!r} reaches pipelines {str(scope)!r}: read, insert and update of their rows; "
               "reset, finding and policy history append-only")


def access_table() -> str:
    """docs/security.md's access table (markdown): per database role and API token kind what it may read
    and write, generated from the grants ``db grant`` makes (``row_security.GUARDED``) and the token roles."""
    lines = ["| Who | May read | May write |", "|---|---|---|",
             "| ledger owner (ran `db upgrade`) | every table and view | every table; migrations, `db grant`, "
             "a whole-ledger `prune` |",
             "| team role (`db grant --role R --pipelines P`) | its pipelines' rows only (below) | "
             "its pipelines' rows only (below); `prune --pipeline` of its pipelines |",
             "| a role without a grant | what its own GRANTs give, every pipeline | what its own GRANTs give |"]
    for role in ROLES:
        token = ApiToken("t", role)
        lines.append(f"| `{role}` token | every pipeline: positions, history, lag, topics, audit, metrics | "
                     + ("resets, policies and every other request that changes state |" if token.may_operate
                        else "nothing (403 on every request that changes state) |"))
    lines.append("| scoped token (`name:role[P]:secret`) | as its role, pipelines in P only "
                 "(another is an unknown name, 404) | as its role, pipelines in P only |")
    lines += ["", "| Table or view | A team role may |", "|---|---|"]
    lines += [f"| {table} | {may} |" for table, may in team_access()]
    return "\n".join(lines)


def db_access() -> None:
    """Print what each database role and API token kind may read and write (docs/security.md's table)."""
    typer.echo(access_table())


@grouped
def prune_cmd(
    older_than: str = typer.Option(..., "--older-than", help="Age of history to remove: 30d, 12h, 90m, P30D (docs/cli.md, durations)."),
    execute: bool = typer.Option(False, "--execute", help="Delete for real (default: dry run, counts only)."),
    pipeline: Optional[str] = typer.Option(None, "--pipeline", help="Only this pipeline's history."),
    chunk_size: int = typer.Option(20_000, "--chunk-size", min=1, help="Rows deleted per transaction."),
    ledger: LedgerOptions = LedgerOptions(), fmt: Format = "table",
) -> None:
    """Remove old batch history; positions, resets, findings and each partition's latest batch stay."""
    fmt = check_format(fmt)
    age = parse_duration(older_than, "--older-than")  # bad input fails before any connection is made
    engine = _engine(ledger, create=False)
    check_connection(engine)
    if pipeline is not None:  # a typo must not read as "would delete 0"
        require_named(engine, pipeline)

    def _progress(table: str, done: int, total: int) -> None:
        typer.echo(f"  {table}: deleted {done:,} of {total:,}", err=True)

    report = prune(engine, age, pipeline=pipeline, execute=execute, chunk_size=chunk_size,
                   progress=_progress)
    if fmt != "table":  # machine formats: one row per table; the document says what ran
        rows = [{"table": name, "deleted": c.deleted, "kept": c.kept, "older": c.older}
                for name, c in (("batches", report.batches), ("batch_offsets", report.batch_offsets))]
        emit(rows, ["table", "deleted", "kept", "older"], fmt, {
            "pipeline": pipeline, "olderThan": older_than, "cutoff": report.cutoff, "executed": report.executed,
            "tables": {r["table"]: {k: r[k] for k in ("deleted", "kept", "older")} for r in rows},
            "prunedRanges": report.islands if report.executed else None, "seconds": round(report.seconds, 3)})
        return
    verb = "deleted" if report.executed else "would delete"
    scope = f" of pipeline {pipeline!r}" if pipeline else ""
    typer.echo(f"history{scope} older than {older_than} (before {report.cutoff.isoformat(timespec='seconds')}):")
    for name, counts in (("batches", report.batches), ("batch_offsets", report.batch_offsets)):
        typer.echo(f"  {name:<14} {verb} {counts.deleted:>12,}  kept {counts.kept:,} of {counts.older:,} old rows")
    typer.echo("  kept always: every position, reset and finding, and each partition's latest batch")
    if not report.executed:
        typer.echo("dry run: nothing deleted; add --execute to delete")
    else:
        if report.islands:
            typer.echo(f"  recorded {report.islands:,} pruned ranges: verify reads them as the history they were")
        typer.echo(f"done in {report.seconds:.1f}s")


def register(app: typer.Typer, context: dict[str, Any]) -> None:
    """Add ``db upgrade``, ``db grant``, ``db access`` and ``prune`` to the command line."""
    db_app = typer.Typer(help="Ledger database schema.", no_args_is_help=True, rich_markup_mode=None,
                         context_settings=context)
    db_app.command("upgrade")(db_upgrade)
    db_app.command("grant")(db_grant)
    db_app.command("access")(db_access)
    app.add_typer(db_app, name="db")
    app.command("prune")(prune_cmd)
