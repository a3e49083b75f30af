"""Driver errors become our own, and a missing schema says what to run."""

from __future__ import annotations

from pathlib import Path

import pytest

from offset_ledger.errors import LedgerError, LedgerUnavailable
from offset_ledger.ledger.engine import make_engine
from offset_ledger.operations import Operations


def test_a_ledger_without_schema_says_to_run_db_upgrade(tmp_path: Path) -> None:
    ops = Operations(make_engine(f"sqlite:///{tmp_path / 'empty.db'}"))
    try:
        with pytest.raises(LedgerError, match="run 'offset-ledger db upgrade'") as info:
            ops.list_pipelines(with_lag=False)
        assert not isinstance(info.value, LedgerUnavailable)  # not retriable: retrying will not help
    finally:
        ops.close()


# What a failover, a restart or an overloaded server answers: the same write can succeed later.
RETRIABLE = {
    "25006": "read_only_sql_transaction (a demoted primary, a standby)",
    "57P01": "admin_shutdown", "57P02": "crash_shutdown", "57P03": "cannot_connect_now",
    "08000": "connection_exception", "08003": "connection_does_not_exist", "08006": "connection_failure",
    "08001": "sqlclient_unable_to_establish_sqlconnection", "08004": "sqlserver_rejected_establishment",
    "40001": "serialization_failure", "40P01": "deadlock_detected", "53300": "too_many_connections",
    "53100": "disk_full", "53200": "out_of_memory", "55P03": "lock_not_available", "57014": "query_canceled",
}
# Statements the server rejects for good: retrying forever would stall every later event.
PERMANENT = {
    "23505": "unique_violation", "22003": "numeric_value_out_of_range", "42501": "insufficient_privilege",
    "54000": "program_limit_exceeded (an OperationalError in psycopg2, yet permanent)",
    "42703": "undefined_column",
}


def _pg_error(sqlstate: str) -> Exception:
    """The exception psycopg2 raises for ``sqlstate`` (its own class, with the code set as the server does)."""
    import psycopg2.errors

    exc = psycopg2.errors.lookup(sqlstate)(f"ERROR: server says {sqlstate}")
    exc.__setstate__({"pgcode": sqlstate, "pgerror": f"ERROR: server says {sqlstate}"})
    return exc


def _wrapped(orig: Exception) -> Exception:
    """As SQLAlchemy hands it over: the matching sqlalchemy.exc class around the driver's exception."""
    import psycopg2
    from sqlalchemy.exc import DBAPIError

    return DBAPIError.instance("INSERT INTO batches ...", {}, orig, psycopg2.Error)


@pytest.mark.parametrize("sqlstate", sorted(RETRIABLE))
@pytest.mark.parametrize("raw", [False, True], ids=["wrapped", "raw-cursor"])
def test_transient_sqlstates_are_retriable(sqlstate: str, raw: bool) -> None:
    from offset_ledger.ledger.engine import sqlstate_retriable, translate_db_error
    from offset_ledger.ledger.recorder import translate

    orig = _pg_error(sqlstate)
    exc = orig if raw else _wrapped(orig)
    for error in (translate_db_error(exc, "writing"), translate(exc)):
        assert isinstance(error, LedgerUnavailable) and error.retriable, (sqlstate, error)
        assert sqlstate in error.message
    assert sqlstate_retriable(sqlstate)


def test_read_only_transaction_arrives_as_internal_error_and_is_still_retriable() -> None:
    # The case of issue 20: psycopg2 raises ReadOnlySqlTransaction as an InternalError, which the
    # type alone would call permanent.
    from sqlalchemy.exc import InternalError

    from offset_ledger.ledger.engine import translate_db_error

    exc = _wrapped(_pg_error("25006"))
    assert isinstance(exc, InternalError)
    error = translate_db_error(exc, "writing")
    assert error.retriable and error.details["sqlstate"] == "25006"


@pytest.mark.parametrize("sqlstate", sorted(PERMANENT))
@pytest.mark.parametrize("raw", [False, True], ids=["wrapped", "raw-cursor"])
def test_rejected_statements_are_permanent(sqlstate: str, raw: bool) -> None:
    from offset_ledger.ledger.engine import sqlstate_retriable, translate_db_error

    orig = _pg_error(sqlstate)
    error = translate_db_error(orig if raw else _wrapped(orig), "writing")
    assert type(error) is LedgerError and not error.retriable, (sqlstate, error)
    assert not sqlstate_retriable(sqlstate)


def test_missing_schema_is_permanent_and_says_what_to_run() -> None:
    from offset_ledger.ledger.engine import translate_db_error

    error = translate_db_error(_wrapped(_pg_error("42P01")), "writing")
    assert type(error) is LedgerError and "offset-ledger db upgrade" in error.message


def test_without_a_sqlstate_the_kind_of_error_decides() -> None:
    # Refused or lost connections carry no SQLSTATE (libpq reports them client-side), nor does SQLite.
    import sqlite3

    import psycopg2

    from offset_ledger.ledger.engine import sqlstate_retriable, translate_db_error

    refused = psycopg2.OperationalError("connection to server at 127.0.0.1 port 1 failed: Connection refused")
    assert isinstance(translate_db_error(refused, "writing"), LedgerUnavailable)
    assert isinstance(translate_db_error(_wrapped(refused), "writing"), LedgerUnavailable)
    busy = sqlite3.OperationalError("database is locked")
    assert isinstance(translate_db_error(busy, "writing"), LedgerUnavailable)
    broken = sqlite3.IntegrityError("NOT NULL constraint failed: batches.query_id")
    assert type(translate_db_error(broken, "writing")) is LedgerError
    assert not sqlstate_retriable(None) and not sqlstate_retriable("")
