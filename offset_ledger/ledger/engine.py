"""Engines for the ledger database and schema upgrades through Alembic."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    DisconnectionError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout

from offset_ledger.config import settings
from offset_ledger.errors import ConfigError, LedgerError, LedgerUnavailable, LedgerWithoutSchema
from offset_ledger.ledger.partitions import ensure_ahead
from offset_ledger.ledger.sqlite_positions import sqlite_set

if TYPE_CHECKING:
    from offset_ledger.addresses import LedgerAddress

log = logging.getLogger(__name__)

_PACKAGE = Path(__file__).resolve().parents[1]
# Serialises concurrent upgrades of one Postgres database (two listeners starting together).
_UPGRADE_LOCK_KEY = 0x0FF5E7


def engine_for(address: LedgerAddress) -> Engine:
    """An engine on the ledger at ``address`` (resolved by a face: ``LedgerAddress.resolve``).

    With ``Operations.open`` the only caller of ``make_engine``: a component that needs an engine and
    no verbs (the listener's recorder, heartbeat and mirror, a sink) gets it here from the address it
    was handed, never from a DSN string of its own (``tests/unit/project/test_addresses.py``).
    """
    return make_engine(address.dsn, pool_size=address.pool_size, create=address.create)


def make_engine(dsn: str | None = None, *, pool_size: int = 5, create: bool = True) -> Engine:
    """An engine for ``dsn`` (default: OFFSET_LEDGER_DSN, else the embedded SQLite file).

    ``create=False`` (reads): a SQLite file that does not exist is a ConfigError instead of a new,
    empty ledger at a mistyped path.
    """
    if dsn:  # given (--dsn or OFFSET_LEDGER_DSN through the CLI): no pydantic-settings on a read's start path
        url_text = dsn
    else:
        url_text = settings().resolved_dsn(dsn)
    try:
        url = make_url(url_text)
    except ArgumentError as exc:
        raise ConfigError(f"not a database URL: {url_text!r}", dsn=url_text) from exc
    if url.get_backend_name() == "sqlite":
        if url.database and url.database != ":memory:":
            if not create and not Path(url.database).exists():
                raise ConfigError(f"no ledger database at {url.database}: check --dsn / OFFSET_LEDGER_DSN, or "
                                  "create it with 'offset-ledger db upgrade'", dsn=url_text, missing=True)
            _check_sqlite_file(Path(url.database), url_text)
            Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")  # the API reads while a listener writes
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()
            # What v_positions' INSTEAD OF triggers call (0024): a topic row's arrays with one partition set.
            dbapi_conn.create_function("offset_ledger_position_set", 15, sqlite_set, deterministic=True)

        return engine
    try:
        return _server_engine(url, pool_size)
    except (ArgumentError, ImportError) as exc:
        raise ConfigError(f"cannot use database URL {url.render_as_string()!r}: {exc}") from exc


_SQLITE_HEADER = b"SQLite format 3\x00"


def _check_sqlite_file(path: Path, url_text: str) -> None:
    """A ``--dsn`` naming a file of another kind (a CSV, a log) is a usage error, before any driver call
    (SQLite would only say "file is not a database" at the first statement, or a write would clobber it)."""
    try:
        with path.open("rb") as f:
            head = f.read(len(_SQLITE_HEADER))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"cannot open the ledger database {path}: {exc.strerror or exc}", dsn=url_text) from exc
    if head and head != _SQLITE_HEADER:  # an empty file is an empty database
        raise ConfigError(f"{path} is not a database (SQLite expects its own file format): check --dsn / OFFSET_LEDGER_DSN",
                          dsn=url_text)


def _server_engine(url: URL, pool_size: int, **options: Any) -> Engine:
    """A pooled engine on a database server: connections checked before use and recycled."""
    return create_engine(
        url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True, pool_recycle=1800,
        connect_args={"connect_timeout": 5} if url.get_backend_name() == "postgresql" else {}, **options,
    )


def read_engine(engine: Engine, *, pool_size: int = 5) -> Engine:
    """An engine for reads of the same database: on PostgreSQL, autocommit connections in a pool of their own.

    A read in a transaction costs psycopg2 a BEGIN before the first query and a ROLLBACK at the
    end; switching a pooled connection to autocommit per checkout costs two isolation-level
    changes instead. Under READ COMMITTED each statement sees its own snapshot either way, so
    the REST reads lose nothing. Other databases share the engine as it is.
    """
    if engine.dialect.name != "postgresql":
        return engine
    return _server_engine(engine.url, pool_size, isolation_level="AUTOCOMMIT")


# SQLSTATEs after which the same write succeeds later: the server is failing over, restarting or
# busy, or the transaction lost a race. Everything else a server reports is about the statement or
# the data, and retrying it would only stall the writer behind it.
_TRANSIENT_SQLSTATES = {
    "25006": "is read-only (a failover in progress, or a standby)",   # read_only_sql_transaction
    "57P01": "was shut down by an administrator",                     # admin_shutdown
    "57P02": "crashed and is restarting",                             # crash_shutdown
    "57P03": "is starting up or shutting down",                       # cannot_connect_now
    "40001": "aborted the transaction on a serialization failure",    # serialization_failure
    "40P01": "aborted the transaction on a deadlock",                 # deadlock_detected
    "53300": "has too many connections",                              # too_many_connections
    "53200": "is out of memory",                                      # out_of_memory
    "55P03": "could not take a lock in time",                         # lock_not_available
    "57014": "cancelled the statement (statement timeout)",           # query_canceled
    "25P03": "ended an idle transaction (idle_in_transaction_session_timeout)",  # idle_in_transaction_session_timeout
}


def transient_reason(sqlstate: str | None) -> str | None:
    """Why a database error with this SQLSTATE is worth retrying (None: it is not)."""
    if not sqlstate:
        return None
    if sqlstate.startswith("08"):  # connection_exception and all of its class
        return "lost the connection"
    return _TRANSIENT_SQLSTATES.get(sqlstate)


#: insufficient_privilege: a missing GRANT, and a row that row-level security refuses (``db grant``).
PERMISSION_DENIED = "42501"


def permission_denied(exc: BaseException) -> bool:
    """Whether ``exc`` (ours, SQLAlchemy's or the driver's) is the database refusing this role the write:
    permanent for that record, however often it is retried."""
    details = getattr(exc, "details", None)
    if isinstance(details, dict) and details.get("sqlstate") == PERMISSION_DENIED:
        return True
    orig = getattr(exc, "orig", None) or exc
    sqlstate = getattr(orig, "pgcode", None) or getattr(orig, "sqlstate", None)
    return sqlstate == PERMISSION_DENIED or "violates row-level security policy" in str(orig)


def translate_db_error(exc: Exception, doing: str) -> LedgerError:
    """A driver error as our own: LedgerUnavailable (retriable) when the database cannot be reached or
    reports a transient SQLSTATE, a LedgerError that says what to run when the schema is missing,
    else a LedgerError. Wrapped (SQLAlchemy) and raw DB-API errors alike: the one classification."""
    if isinstance(exc, LedgerError):
        return exc
    orig = getattr(exc, "orig", None) or exc
    detail = " ".join(str(orig).split())
    sqlstate = getattr(orig, "pgcode", None) or getattr(orig, "sqlstate", None)
    # 42P01 undefined_table (Postgres); SQLite reports it as an OperationalError.
    if "file is not a database" in detail:  # SQLite: --dsn names a file of another kind (a CSV, a log)
        return LedgerWithoutSchema(f"the ledger --dsn names a file that is not a database; check --dsn / "
                                   f"OFFSET_LEDGER_DSN ({detail})")
    if sqlstate == "42P01" or "no such table" in detail:
        return LedgerWithoutSchema(f"the ledger database has no offset-ledger schema; run 'offset-ledger db "
                                   f"upgrade' ({detail})")
    reason = transient_reason(sqlstate)
    if reason is not None:
        return LedgerUnavailable(f"the ledger database {reason} while {doing}: {detail}", sqlstate=sqlstate)
    if (isinstance(exc, (OperationalError, InterfaceError, DisconnectionError, PoolTimeout))
            or (isinstance(exc, DBAPIError) and exc.connection_invalidated)
            or _is_raw(exc, "OperationalError", "InterfaceError")):
        return LedgerUnavailable(f"cannot reach the ledger database while {doing}: {detail}",
                                 **({"sqlstate": sqlstate} if sqlstate else {}))
    return LedgerError(f"ledger database error while {doing}: {detail}",
                       **({"sqlstate": sqlstate} if sqlstate else {}))


def _is_raw(exc: Exception, *names: str) -> bool:
    """Whether ``exc`` is a raw DB-API error (raised on a driver cursor) of one of these PEP 249 classes."""
    return any(cls.__name__ in names and cls.__module__.split(".")[0] in {"psycopg2", "sqlite3", "psycopg"}
               for cls in type(exc).__mro__)


def check_connection(engine: Engine) -> None:
    """Raise LedgerUnavailable with a clear message when the database cannot be reached."""
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except OperationalError as exc:
        raise LedgerUnavailable(
            f"cannot connect to the ledger database {engine.url.render_as_string()}: {exc.orig}",
        ) from exc


def require_schema(engine: Engine) -> str:
    """The schema revision; LedgerWithoutSchema (exit 2, HTTP 503) when the database has none.

    Reads and ``serve`` call this first: one SELECT, so a mistyped or never-upgraded ledger is refused
    at start with what to run, instead of answering every request with the same error later.
    """
    try:
        with engine.connect() as conn:
            revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "opening the ledger") from exc
    if revision is None:
        raise LedgerWithoutSchema("the ledger database has no offset-ledger schema; run 'offset-ledger db upgrade'")
    return str(revision)


def migrations_dir() -> Path:
    """The Alembic scripts: inside the installed package (the wheel maps the checkout's top-level
    ``migrations/`` to ``offset_ledger/migrations``), else beside the package (a checkout or an
    editable install)."""
    for candidate in (_PACKAGE / "migrations", _PACKAGE.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise ConfigError(f"the schema migrations are missing from this install (looked in {_PACKAGE / 'migrations'}); "
                      "reinstall offset-ledger")


def _alembic_config(engine: Engine):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.attributes["engine"] = engine
    return cfg


def _migrate(engine: Engine, direction: str, revision: str) -> None:
    from alembic import command

    check_connection(engine)
    try:
        with engine.begin() as conn:
            if engine.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _UPGRADE_LOCK_KEY})
            cfg = _alembic_config(engine)
            cfg.attributes["connection"] = conn
            getattr(command, direction)(cfg, revision)
    except SQLAlchemyError as exc:
        if permission_denied(exc):
            # A role that is not the ledger's owner (a team's, ``db grant``) cannot migrate it, nor re-apply
            # the team walls a migration must leave standing (``row_security.migrating``): nothing changed.
            detail = " ".join(str(getattr(exc, "orig", None) or exc).split()).split(" [SQL:")[0]
            raise LedgerError(f"schema {direction} refused: the ledger's schema is at revision "
                              f"{_revision_or_none(engine)} and this release needs "
                              f"{head_revision() if revision == 'head' else revision}; role "
                              f"{engine.url.username!r} may not migrate it ({detail}): run 'offset-ledger db "
                              "upgrade' as the ledger's owner", sqlstate=PERMISSION_DENIED) from exc
        # Classified like every other database error: a listener that upgrades its schema while the
        # ledger fails over (read-only, shutting down) retries instead of dead-lettering its events.
        error = translate_db_error(exc, f"the schema {direction}")
        raise type(error)(f"schema {direction} failed: {exc}", **error.details) from exc


def _revision_or_none(engine: Engine) -> str | None:
    try:
        return current_revision(engine)
    except SQLAlchemyError:
        return None


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply the Alembic migrations up to ``revision`` (idempotent)."""
    _migrate(engine, "upgrade", revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Revert the Alembic migrations down to ``revision``."""
    _migrate(engine, "downgrade", revision)


def current_revision(engine: Engine) -> str | None:
    """The schema revision the database is at (None when never upgraded)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


#: The newest migration's revision: what every start compares the ledger's revision with. Written here,
#: not read from the scripts: Alembic parses all of them to find the head (13-40 ms on each cold start of a
#: listener, restart or CLI command); tests/unit/ledger/test_schema_head.py holds it to Alembic's answer.
SCHEMA_HEAD = "0024"


def head_revision() -> str:
    return SCHEMA_HEAD


def ensure_schema(engine: Engine) -> None:
    """Upgrade to head unless already there (cheap check first: one SELECT)."""
    try:
        at_head = current_revision(engine) == head_revision()
    except OperationalError as exc:
        raise LedgerUnavailable(f"cannot connect to the ledger database: {exc.orig}") from exc
    except SQLAlchemyError:
        at_head = False
    if not at_head:
        upgrade(engine)
    ensure_partitions(engine)


def ensure_partitions(engine: Engine) -> None:
    """PostgreSQL from 0018: ``offset_ranges`` partitions ahead of the newest batch (``ledger.partitions``).
    Best effort: a role that may not create tables (a team's) leaves it to the owner's ``db upgrade`` or
    ``prune``; rows arriving past the partitions go to the DEFAULT one meanwhile."""
    if engine.dialect.name != "postgresql":
        return

    try:
        ensure_ahead(engine)
    except SQLAlchemyError as exc:
        log.info("offset_ranges: partitions ahead not made (%s)", str(exc).splitlines()[0])
