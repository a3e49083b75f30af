"""Engines for the ledger database and schema upgrades through Alembic."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

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
from offset_ledger.errors import ConfigError, LedgerError, LedgerUnavailable

log = logging.getLogger(__name__)

_MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
# Serialises concurrent upgrades of one Postgres database (two listeners starting together).
_UPGRADE_LOCK_KEY = 0x0FF5E7


def make_engine(dsn: str | None = None, *, pool_size: int = 5) -> Engine:
    """An engine for ``dsn`` (default: OFFSET_LEDGER_DSN, else the embedded SQLite file)."""
    url_text = settings().resolved_dsn(dsn)
    try:
        url = make_url(url_text)
    except ArgumentError as exc:
        raise ConfigError(f"not a database URL: {url_text!r}", dsn=url_text) from exc
    if url.get_backend_name() == "sqlite":
        if url.database and url.database != ":memory:":
            Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")  # the API reads while a listener writes
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    try:
        return _server_engine(url, pool_size)
    except (ArgumentError, ImportError) as exc:
        raise ConfigError(f"cannot use database URL {url.render_as_string()!r}: {exc}") from exc


_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433, "oracle": 1521}


def ledger_fingerprint(dsn: str | None = None) -> str:
    """Which ledger database ``dsn`` names, without secrets: ``postgresql://host:5432/db``, ``sqlite:/abs/path``.

    The driver, user, password and connection options are left out (they do not change which
    database it is); the host is lower-cased and the default port filled in. Two spellings of one
    server (``localhost`` and ``127.0.0.1``) stay different: telling them apart safely would need
    name resolution, and the cost of a false "different" is a spool file left for an operator,
    while a false "same" writes one ledger's batches into another.
    """
    url_text = settings().resolved_dsn(dsn)
    try:
        url = make_url(url_text)
    except ArgumentError as exc:
        raise ConfigError(f"not a database URL: {url_text!r}", dsn=url_text) from exc
    backend = url.get_backend_name()
    if backend == "sqlite":
        if not url.database or url.database == ":memory:":
            return f"sqlite::memory:{os.getpid()}"  # gone with its process: no other process's ledger
        return f"sqlite:{Path(url.database).expanduser().resolve()}"
    host = url.host or str(url.query.get("host") or "")  # libpq takes a socket directory as ?host=
    port = url.port or _DEFAULT_PORTS.get(backend, "")
    return f"{backend}://{host.lower()}:{port}/{url.database or ''}"


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


# SQLSTATEs after which the same write can succeed later, so a writer retries (and spools) instead
# of giving up: what a failover, a restart or an overloaded server answers, and lost races.
_RETRIABLE_SQLSTATE_CLASSES = frozenset({
    "08",     # connection exception (connection lost, refused, failed)
    "53",     # insufficient resources: too many connections 53300, out of memory, disk full
})
_RETRIABLE_SQLSTATES = frozenset({
    "25006",  # read_only_sql_transaction: a demoted primary or a standby during failover
    "25P03",  # idle_in_transaction_session_timeout: the session is gone, a new one works
    "40001",  # serialization_failure (also recovery conflicts on a standby)
    "40003",  # statement_completion_unknown (the ledger's writes are idempotent)
    "40P01",  # deadlock_detected
    "55P03",  # lock_not_available (lock_timeout)
    "57014",  # query_canceled (statement_timeout, pg_cancel_backend)
    "57P01",  # admin_shutdown
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now (starting up, in recovery)
    "57P05",  # idle_session_timeout
    "58030",  # io_error
    "72000",  # snapshot_too_old
})


def sqlstate_retriable(sqlstate: str | None) -> bool:
    """Whether a database error with this SQLSTATE may succeed when retried (None: unknown, so no)."""
    if not sqlstate:
        return False
    return sqlstate in _RETRIABLE_SQLSTATES or sqlstate[:2] in _RETRIABLE_SQLSTATE_CLASSES


def _sqlstate(orig: BaseException) -> str | None:
    code = getattr(orig, "pgcode", None) or getattr(orig, "sqlstate", None)  # psycopg2 / psycopg 3
    return str(code) if code else None


def _connection_level(exc: BaseException, orig: BaseException) -> bool:
    """An error about the connection rather than the statement (also for a raw DBAPI error)."""
    if isinstance(exc, (OperationalError, InterfaceError, DisconnectionError, PoolTimeout)):
        return True
    # A DBAPI error raised on a raw cursor, unwrapped: PEP 249 names these classes alike in every driver.
    return any(k.__name__ in ("OperationalError", "InterfaceError") for k in type(orig).__mro__)


def translate_db_error(exc: Exception, doing: str) -> LedgerError:
    """A driver error as our own, classified in this one place.

    LedgerUnavailable (retriable) when the database cannot be reached or cannot take the write for
    now (the SQLSTATEs above; without a SQLSTATE, a connection-level error: refused, lost, SQLite busy);
    a LedgerError that says what to run when the schema is missing; else a LedgerError (permanent).
    Works on SQLAlchemy's wrapped errors and on raw DBAPI errors alike.
    """
    if isinstance(exc, LedgerError):
        return exc
    orig = getattr(exc, "orig", None) or exc
    detail = " ".join(str(orig).split())
    sqlstate = _sqlstate(orig)
    # 42P01 undefined_table (Postgres); SQLite reports it as an OperationalError.
    if sqlstate == "42P01" or "no such table" in detail:
        return LedgerError(f"the ledger database has no offset-ledger schema; run 'offset-ledger db upgrade' "
                           f"({detail})")
    if sqlstate_retriable(sqlstate):
        return LedgerUnavailable(f"the ledger database cannot take this for now while {doing} "
                                 f"(SQLSTATE {sqlstate}, retriable): {detail}", sqlstate=sqlstate)
    invalidated = isinstance(exc, DBAPIError) and exc.connection_invalidated
    # Without a SQLSTATE (refused or lost connections, pool timeouts, SQLite busy) the error's kind
    # decides; with one, the SQLSTATE does: a statement the server rejects for good is not retried.
    if invalidated or (sqlstate is None and _connection_level(exc, orig)):
        return LedgerUnavailable(f"cannot reach the ledger database while {doing}: {detail}")
    return LedgerError(f"ledger database error while {doing}: {detail}",
                       **({"sqlstate": sqlstate} if sqlstate else {}))


def check_connection(engine: Engine) -> None:
    """Raise LedgerUnavailable with a clear message when the database cannot be reached."""
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except OperationalError as exc:
        raise LedgerUnavailable(
            f"cannot connect to the ledger database {engine.url.render_as_string()}: {exc.orig}",
        ) from exc


def _alembic_config(engine: Engine):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
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
        # Classified like every other database error: a read-only or restarting server is retriable.
        error = translate_db_error(exc, f"the schema {direction}")
        raise type(error)(f"schema {direction} failed: {exc}") from exc


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


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config(None)).get_current_head()  # type: ignore[arg-type]
    assert head is not None
    return head


def ensure_schema(engine: Engine) -> None:
    """Upgrade to head unless already there (cheap check first: one SELECT)."""
    try:
        if current_revision(engine) == head_revision():
            return
    except OperationalError as exc:
        raise LedgerUnavailable(f"cannot connect to the ledger database: {exc.orig}") from exc
    except SQLAlchemyError:
        pass
    upgrade(engine)
