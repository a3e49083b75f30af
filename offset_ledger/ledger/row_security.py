"""Team roles on PostgreSQL: a writer role reaches only its pipelines' rows (row-level security).

``offset-ledger db grant --role team_a --pipelines 'team-a-*'`` makes (or updates) a login role
that can read, insert and update only the rows of the pipelines its scope names
(``offset_ledger.rules.scope``: exact names and prefixes ending in ``*``), on every table the
listener, the checkpoint watcher, the restart helper and the sinks write, and may prune its pipelines'
batch history (``prune --pipeline``). The reset, finding, policy and sink-batch history is
append-only for it: no DELETE, and UPDATE only of the columns the recording itself moves (a repeated
finding's counter, a reset's consumption), never its content.

Why a table (``ledger_role_scopes``, 0017) and one set of policies, rather than policies per role:

- the policies are the same for every role (``offset_ledger_in_scope(pipeline)`` asks the table),
  so a grant or a changed scope is a row change, never DDL on the hot tables (no lock while
  listeners write), and a table added later is guarded by one entry in ``GUARDED``;
- a role with no row in the table is not restricted, so turning row security on changes nothing for
  the owner (who bypasses it anyway: the tables are not FORCEd), for migrations, or for roles
  granted access before 0017 (a dashboard's read-only role keeps reading everything);
- a team role cannot read the table's other rows (its own policy), so it does not learn other
  teams' pipeline names or prefixes.

The functions pin their ``search_path`` and name the table with its schema: a role cannot shadow
``ledger_role_scopes`` with a temporary table of its own. Views run with the reader's rights
(``security_invoker``, PostgreSQL 15), so the audit views show a team role only its rows; an
auditor role that reads every team is a grant with ``--pipelines '*'``.

The walls are part of the schema, not of a command: every upgrade or downgrade, by ``db upgrade`` or
by the automatic upgrade a writer runs at start, applies them again in the migration's own
transaction (``migrating``, called by ``migrations/env.py``), for the tables and columns of the
revision it reaches (``present``), with every scoped role's exact privileges (``privileges_sql``).
``tests/integration/test_team_walls_pg.py`` reads the whole schema from ``pg_catalog`` after every
upgrade path and compares it with ``GUARDED``: a table or view added without a policy fails there.

SQLite is a single-user file: it has no roles, and this module is PostgreSQL only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from offset_ledger.errors import InvalidInput
from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.rules.scope import PipelineScope

SCOPES_TABLE = "ledger_role_scopes"
IN_SCOPE = "offset_ledger_in_scope"
UNSCOPED = "offset_ledger_unscoped"
_ROLE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


@dataclass(frozen=True)
class Guarded:
    """One table under row security: which rows are a pipeline's, and what a writer role may do."""

    table: str
    #: SQL over one row of ``table``: true when the row belongs to a pipeline in the caller's scope.
    rows: str
    #: Privileges a writer role gets beside SELECT; ``UPDATE (a, b)`` limits it to those columns.
    writes: tuple[str, ...] = ()
    #: Check ``rows`` of a new or changed row after the statement instead of in the policy: a policy's
    #: WITH CHECK runs inside the statement, and the fast path's one statement inserts the batch and its
    #: ranges together (its CTEs cannot see each other's rows), so ``through("batches", ...)`` would
    #: refuse a team's own new batch. An AFTER row trigger sees the whole statement's rows.
    checked_after: bool = False
    #: A column ``rows`` reads that an earlier revision lacks: there (a downgrade, a grant on an older
    #: ledger) the table's rows are told by ``OWN`` instead.
    needs: str | None = None

    @property
    def updates(self) -> bool:
        return any(w.startswith("UPDATE") for w in self.writes)

    @property
    def deletes(self) -> bool:
        return "DELETE" in self.writes


OWN = f"{IN_SCOPE}(pipeline)"


def through(parent: str, key: str, parent_key: str = "id") -> str:
    """Rows without a pipeline column belong to their parent's pipeline: the parent row must be visible
    (the parent's own policy decides that, for the same caller)."""
    return f"EXISTS (SELECT 1 FROM {parent} p WHERE p.{parent_key} = {{table}}.{key})"


#: Every table a writer role reaches, in one place. ``batch_offsets`` (0016) is the previous
#: release's write target: its trigger folds each row into ``offset_ranges`` and keeps nothing.
#: A team prunes its own pipelines' history (``prune --pipeline``): DELETE of ``batches`` and their
#: ``offset_ranges`` (the rows visible to it, its pipelines'), INSERT of the ``pruned_ranges`` islands.
GUARDED: tuple[Guarded, ...] = (
    Guarded("runs", OWN, ("INSERT", "UPDATE")),
    Guarded("batches", OWN, ("INSERT", "UPDATE", "DELETE")),
    Guarded("batch_offsets", OWN, ("INSERT", "UPDATE")),
    Guarded("offset_ranges", through("batches", "batch_pk"), ("INSERT", "UPDATE", "DELETE"), checked_after=True),
    # The previous release's positions (0024: its triggers fold them into topic_positions).
    Guarded("positions", OWN, ("INSERT", "UPDATE", "DELETE")),  # a restart drops removed partitions
    Guarded("topic_positions", OWN, ("INSERT", "UPDATE", "DELETE")),
    Guarded("checkpoint_generations", OWN, ("INSERT", "UPDATE")),
    # A listener of several pipelines reports without one: its row is the role's that wrote it (0023).
    Guarded("listener_health", f"CASE WHEN pipeline IS NULL THEN ledger_role = current_user ELSE {OWN} END",
            ("INSERT", "UPDATE"), needs="ledger_role"),
    Guarded("sinks", OWN, ("INSERT", "UPDATE")),
    # The audit history: appended; only what recording itself moves may change.
    Guarded("findings", OWN, ("INSERT", "UPDATE (occurrences, last_seen_at)")),
    Guarded("resets", OWN, ("INSERT", "UPDATE (status, consumed_at, consumed_by_generation)")),
    Guarded("reset_partitions", through("resets", "reset_id"), ("INSERT",)),
    Guarded("pipeline_policies", OWN, ("INSERT",)),
    Guarded("sink_batches", OWN, ("INSERT",)),
    Guarded("pruned_ranges", OWN, ("INSERT",)),  # written by prune before it deletes; verify reads it
)

#: The ledger's views: every ``v_*`` view of the schema, and a guarded name that is a view.
VIEW_FILTER = "(viewname LIKE 'v\\_%' OR viewname IN ({names}))"


def check_role(role: str) -> str:
    """A role name a grant may create: lower-case letters, digits and ``_`` (what PostgreSQL folds
    an unquoted name to, so psql and the DSN spell it alike)."""
    if not _ROLE.match(role) or role in ("public", "none") or role.startswith("pg_"):
        raise InvalidInput(f"--role {role[:80]!r}: use 1-63 of a-z 0-9 _ (starting with a letter or _), "
                           "not public or a pg_ name", option="--role")
    return role


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def functions_sql(schema: str) -> list[str]:
    """The two functions every policy calls (``CREATE OR REPLACE``: a grant re-applies them)."""
    table = f"{_ident(schema)}.{SCOPES_TABLE}"
    pin = f"SET search_path = {_ident(schema)}, pg_catalog, pg_temp"
    return [
        f"CREATE OR REPLACE FUNCTION {_ident(schema)}.{UNSCOPED}() RETURNS boolean LANGUAGE sql STABLE {pin} AS $$\n"
        f"  SELECT NOT EXISTS (SELECT 1 FROM {table} WHERE role_name = current_user)\n$$",
        f"CREATE OR REPLACE FUNCTION {_ident(schema)}.{IN_SCOPE}(pipeline text) RETURNS boolean LANGUAGE sql STABLE "
        f"{pin} AS $$\n"
        f"  SELECT NOT EXISTS (SELECT 1 FROM {table} WHERE role_name = current_user)\n"
        f"      OR EXISTS (SELECT 1 FROM {table} s WHERE s.role_name = current_user\n"
        f"                 AND CASE WHEN s.is_prefix THEN starts_with(pipeline, s.pattern) ELSE pipeline = s.pattern END)\n$$",
        *(_after_check_function_sql(g, schema) for g in GUARDED if g.checked_after),
    ]


def policies_sql(guarded: tuple[Guarded, ...] = GUARDED) -> list[str]:
    """Row security on every guarded table (idempotent: each policy is dropped and made again)."""
    out = [
        f"ALTER TABLE {SCOPES_TABLE} ENABLE ROW LEVEL SECURITY",
        f"DROP POLICY IF EXISTS offset_ledger_own_scope ON {SCOPES_TABLE}",
        f"CREATE POLICY offset_ledger_own_scope ON {SCOPES_TABLE} FOR SELECT USING (role_name = current_user)",
        f"GRANT SELECT ON {SCOPES_TABLE} TO PUBLIC",
    ]
    for g in guarded:
        rows = g.rows.format(table=g.table)
        update = rows if g.updates else f"{UNSCOPED}()"
        delete = rows if g.deletes else f"{UNSCOPED}()"
        check, check_update = ("true", "true" if g.updates else update) if g.checked_after else (rows, update)
        out.append(f"ALTER TABLE {g.table} ENABLE ROW LEVEL SECURITY")
        for command, clause in (("SELECT", f"USING ({rows})"), ("INSERT", f"WITH CHECK ({check})"),
                                ("UPDATE", f"USING ({update}) WITH CHECK ({check_update})"),
                                ("DELETE", f"USING ({delete})")):
            name = f"offset_ledger_{command.lower()}"
            out.append(f"DROP POLICY IF EXISTS {name} ON {g.table}")
            out.append(f"CREATE POLICY {name} ON {g.table} FOR {command} {clause}")
        if g.checked_after:
            out.extend(_after_check_sql(g))
    names = ", ".join(_literal(g.table) for g in guarded)
    out.append(
        "DO $$ DECLARE v record; BEGIN\n"
        f"  FOR v IN SELECT viewname FROM pg_views WHERE schemaname = current_schema() AND {VIEW_FILTER.format(names=names)} LOOP\n"
        "    EXECUTE format('ALTER VIEW %I SET (security_invoker = true)', v.viewname);\n"
        "  END LOOP; END $$")
    return out


def _after_check_function_sql(g: Guarded, schema: str) -> str:
    """The trigger function that refuses (as row security would, SQLSTATE 42501) a scoped role's new or
    changed row of ``g`` outside its scope. It runs as the caller, so ``rows`` sees what the caller's
    policies let it see; its pinned search path keeps a temporary table from standing in for ours."""
    check = g.rows.format(table=g.table).replace(f"{g.table}.", "NEW.")
    return (f"CREATE OR REPLACE FUNCTION {_ident(schema)}.offset_ledger_{g.table}_in_scope() RETURNS trigger "
            f"LANGUAGE plpgsql SET search_path = {_ident(schema)}, pg_catalog, pg_temp AS $$\n"
            f"BEGIN\n  IF NOT ({check}) THEN\n"
            f"    RAISE EXCEPTION 'new row violates row-level security policy for table \"{g.table}\"' "
            "USING ERRCODE = '42501';\n  END IF;\n  RETURN NULL;\nEND $$")


def _after_check_sql(g: Guarded) -> list[str]:
    """The AFTER row trigger calling it; the owner and unscoped roles skip it (its WHEN)."""
    trigger = f"offset_ledger_{g.table}_scope"
    return [
        f"DROP TRIGGER IF EXISTS {trigger} ON {g.table}",
        f"CREATE TRIGGER {trigger} AFTER INSERT OR UPDATE ON {g.table} FOR EACH ROW "
        f"WHEN (NOT {UNSCOPED}()) EXECUTE FUNCTION offset_ledger_{g.table}_in_scope()",
    ]


def privileges_sql(role: str, schema: str, guarded: tuple[Guarded, ...] = GUARDED) -> list[str]:
    """A scoped role's privileges, exactly: on every guarded table what ``GUARDED`` gives it (everything
    else revoked), USAGE on their id sequences, SELECT on the views, and nothing on a partition (a
    partition made under a granted table, 0018's first one, keeps that table's grants: reached directly,
    the parent's row checks would not run). Idempotent; every path that brings a ledger to a revision
    runs it for every scoped role (``keep_walls``)."""
    r = _ident(role)
    out = [
        f"GRANT USAGE ON SCHEMA {_ident(schema)} TO {r}",
        f"GRANT SELECT ON alembic_version TO {r}",
    ]
    for g in guarded:
        out.append(f"REVOKE ALL ON {g.table} FROM {r}")
        out.append(f"GRANT {', '.join(('SELECT', *g.writes))} ON {g.table} TO {r}")
    tables = ", ".join(_literal(g.table) for g in guarded)
    out.append(
        "DO $$ DECLARE s text; v record; BEGIN\n"
        f"  FOR s IN SELECT pg_get_serial_sequence(quote_ident(c.table_name), 'id') FROM information_schema.columns c\n"
        f"           WHERE c.table_schema = current_schema() AND c.column_name = 'id' AND c.table_name IN ({tables}) LOOP\n"
        f"    IF s IS NOT NULL THEN EXECUTE format('GRANT USAGE ON SEQUENCE %s TO %I', s, {_literal(role)}); END IF;\n"
        "  END LOOP;\n"
        "  FOR v IN SELECT viewname FROM pg_views WHERE schemaname = current_schema()\n"
        f"           AND {VIEW_FILTER.format(names=tables)} LOOP\n"
        f"    EXECUTE format('GRANT SELECT ON %I TO %I', v.viewname, {_literal(role)});\n"
        "  END LOOP;\n"
        "  FOR v IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid\n"
        "           JOIN pg_class t ON t.oid = i.inhparent JOIN pg_namespace n ON n.oid = t.relnamespace\n"
        f"           WHERE n.nspname = current_schema() AND t.relname IN ({tables}) LOOP\n"
        f"    EXECUTE format('REVOKE ALL ON %I FROM %I', v.relname, {_literal(role)});\n"
        "  END LOOP; END $$")
    return out


def grant_sql(role: str, scope: PipelineScope, schema: str, guarded: tuple[Guarded, ...] = GUARDED) -> list[str]:
    """Every statement of ``db grant``, in order; run them in one transaction as the ledger's owner."""
    check_role(role)
    r = _ident(role)
    out = [
        f"DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = {_literal(role)}) THEN\n"
        f"  CREATE ROLE {r} LOGIN; END IF; END $$",
        *functions_sql(schema),
        *policies_sql(guarded),
        *privileges_sql(role, schema, guarded),
    ]
    out.append(f"DELETE FROM {SCOPES_TABLE} WHERE role_name = {_literal(role)}")
    rows = [(p, False) for p in sorted(scope.exact)] + [(p, True) for p in scope.prefixes]
    if scope.unrestricted:
        rows = [("", True)]  # '*': every pipeline, still with the writer's append-only history
    out.append(f"INSERT INTO {SCOPES_TABLE} (role_name, pattern, is_prefix, granted_at) VALUES\n  "
               + ",\n  ".join(f"({_literal(role)}, {_literal(p)}, {'true' if prefix else 'false'}, now())"
                              for p, prefix in rows))
    return out


def ledger_schema(engine: Engine) -> str:
    """The schema the ledger's tables are in (the DSN's search path)."""
    with engine.connect() as conn:
        return str(conn.execute(text("SELECT current_schema()")).scalar_one())


def require_postgres(dsn: str) -> None:
    """InvalidInput unless ``dsn`` names a PostgreSQL ledger (checked before anything connects)."""
    from sqlalchemy.engine import make_url

    if make_url(dsn).get_backend_name() != "postgresql":
        raise InvalidInput("db grant needs a PostgreSQL ledger: SQLite is a single-user file without roles "
                           "(see docs/security.md)", option="--dsn")


def execute(engine: Engine, statements: list[str]) -> None:
    """Run ``statements`` in one transaction (raw cursor: ``%`` in format() is not a parameter)."""
    from sqlalchemy.exc import SQLAlchemyError

    dbapi_error = engine.dialect.dbapi.Error  # type: ignore[union-attr]
    try:
        with engine.begin() as conn:
            cursor = conn.connection.cursor()
            try:
                for stmt in statements:
                    cursor.execute(stmt)
            finally:
                cursor.close()
    except (SQLAlchemyError, dbapi_error) as exc:
        raise translate_db_error(exc, "applying row-level security") from exc


def walled(conn: Connection) -> bool:
    """Whether this ledger has walls to keep: PostgreSQL from 0017, with a role scoped now or the
    policies made once (``db grant`` turned row security on; a scope deleted since changes nothing)."""
    if conn.dialect.name != "postgresql":
        return False
    on = conn.execute(text("SELECT relrowsecurity FROM pg_class WHERE oid = to_regclass(:t)"),
                      {"t": SCOPES_TABLE}).first()
    if on is None:
        return False
    return bool(on[0]) or bool(conn.execute(text(f"SELECT EXISTS (SELECT 1 FROM {SCOPES_TABLE})")).scalar())


def scoped_roles(conn: Connection) -> list[str]:
    """The roles with a scope that exist (a role dropped since keeps its rows but gets no grant)."""
    return list(conn.execute(text(
        f"SELECT DISTINCT s.role_name FROM {SCOPES_TABLE} s JOIN pg_roles r ON r.rolname = s.role_name "
        "ORDER BY 1")).scalars())


def present(conn: Connection) -> tuple[Guarded, ...]:
    """``GUARDED`` as the schema stands at its revision: a table a downgrade removed is left out, and
    one without the column its rows need is told by its pipeline alone."""
    out = []
    for g in GUARDED:
        if conn.execute(text("SELECT to_regclass(:t)"), {"t": g.table}).scalar() is None:
            continue
        if g.needs is not None and not conn.execute(text(
                "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(:t) AND attname = :c AND NOT attisdropped"),
                {"t": g.table, "c": g.needs}).first():
            g = replace(g, rows=OWN, needs=None)
        out.append(g)
    return tuple(out)


def walls_sql(conn: Connection) -> list[str]:
    """The functions, policies, view options and every scoped role's privileges, for the schema as it
    stands now (``present``)."""
    schema = str(conn.execute(text("SELECT current_schema()")).scalar_one())
    guarded = present(conn)
    return [*functions_sql(schema), *policies_sql(guarded),
            *(stmt for role in scoped_roles(conn) for stmt in privileges_sql(role, schema, guarded))]


def keep_walls(conn: Connection) -> bool:
    """Re-apply the walls on ``conn``, in its transaction; False when this ledger has none (nothing done)."""
    if not walled(conn):
        return False
    cursor = conn.connection.cursor()  # raw: ``%`` in format() is not a parameter
    try:
        for stmt in walls_sql(conn):
            cursor.execute(stmt)
    finally:
        cursor.close()
    return True


@contextmanager
def migrating(conn: Connection) -> Iterator[None]:
    """Around the migrations of one upgrade or downgrade, in their transaction (``migrations/env.py``):
    whatever path runs them (``db upgrade``, a writer's automatic upgrade at start, a downgrade), the
    walls stand again before it commits. A migration re-creates a view (``CREATE OR REPLACE VIEW``
    resets ``security_invoker``), a table or a partition (which keeps the old table's grants), so the
    whole set is applied again, not patched. A role that cannot apply it (not the tables' owner) cannot
    migrate either: the transaction fails and nothing changes.

    A downgrade below 0017 drops the scopes and the policies while the team roles keep their table
    grants, which would let every team read every pipeline: refused while a role is scoped."""
    scoped = walled(conn) and bool(scoped_roles(conn))
    yield
    if conn.dialect.name != "postgresql":
        return
    if scoped and conn.execute(text("SELECT to_regclass(:t)"), {"t": SCOPES_TABLE}).scalar() is None:
        raise InvalidInput("a downgrade below 0017 would drop the team roles' scopes and row security while "
                           "they keep their grants (every team would read every pipeline): revoke the team "
                           f"roles and delete their rows from {SCOPES_TABLE} first (docs/security.md)",
                           option="--revision")
    keep_walls(conn)


def scoped_self(conn: Connection) -> str | None:
    """The connection's role when a grant scopes it to its team's pipelines, else None (the owner, an
    unscoped role, SQLite, a ledger before 0017). A role reads its own scope rows (their policy)."""
    if conn.dialect.name != "postgresql" or conn.execute(
            text("SELECT to_regclass(:t)"), {"t": SCOPES_TABLE}).scalar() is None:
        return None
    return conn.execute(text(f"SELECT current_user WHERE EXISTS (SELECT 1 FROM {SCOPES_TABLE} "
                             "WHERE role_name = current_user)")).scalar()


def walls_kept(engine: Engine) -> bool:
    """Whether this ledger keeps walls (``db upgrade`` says so)."""
    with engine.connect() as conn:
        return walled(conn)


def _verbs(g: Guarded) -> str:
    """What a team role may do to ``g``'s rows, in words (from the same privileges the grant gives)."""
    verbs = ["read"]
    for w in g.writes:
        if w.startswith("UPDATE ("):
            verbs.append("update of " + ", ".join(f"`{c.strip()}`" for c in w[len("UPDATE ("):-1].split(",")))
        else:
            verbs.append(w.lower())
    return ", ".join(verbs)


def team_access() -> list[tuple[str, str]]:
    """(table, what a team role may do there) for every guarded table, then the views and the rest:
    the per-table half of docs/security.md's access table, generated from ``GUARDED``."""
    rows = []
    for g in GUARDED:
        whose = "its pipelines' rows"
        if g.needs is not None:
            whose += f", and those without a pipeline it wrote (`{g.needs}`)"
        elif g.rows != OWN:
            parent = g.rows.split(" FROM ", 1)[1].split(" ", 1)[0]
            whose = f"the rows of its pipelines' {parent}"
        rows.append((f"`{g.table}`", f"{_verbs(g)}: {whose}"))
    rows.append(("the views (`v_*`)", "read: its pipelines' rows (`security_invoker`)"))
    rows.append(("`alembic_version`", "read"))
    rows.append((f"`{SCOPES_TABLE}`", "read: its own scope"))
    rows.append(("a partition of `offset_ranges`", "nothing (reached through `offset_ranges`)"))
    return rows
