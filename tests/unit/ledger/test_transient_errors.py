"""Which database errors the writer retries: classified by SQLSTATE once, at the ledger edge."""

from __future__ import annotations

import psycopg2
import psycopg2.errors
import pytest
from sqlalchemy.exc import DBAPIError

from offset_ledger.errors import LedgerError, LedgerUnavailable
from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.ledger.recorder import translate

TRANSIENT = ["25006", "57P01", "57P02", "57P03", "08000", "08003", "08006", "08001", "08004", "40001",
             "40P01", "53300", "53200", "55P03", "57014", "25P03"]
PERMANENT = ["22003", "23505", "23502", "42703", "42501", "22P02", "XX000"]


def pg_error(sqlstate: str) -> psycopg2.Error:
    """The psycopg2 exception a server answer with this SQLSTATE raises (pgcode set as the driver does)."""
    base = psycopg2.errors.lookup(sqlstate) if sqlstate not in {"08000", "08006", "08001", "08004"} \
        else psycopg2.OperationalError
    cls = type(f"Pg{sqlstate}", (base,), {"pgcode": sqlstate})
    return cls(f"server said {sqlstate}")


def wrapped(orig: psycopg2.Error) -> DBAPIError:
    return DBAPIError.instance("INSERT INTO batches ...", {}, orig, psycopg2.Error)


@pytest.mark.parametrize("sqlstate", TRANSIENT)
def test_transient_sqlstates_are_retriable_wrapped_or_raw(sqlstate: str) -> None:
    for exc in (wrapped(pg_error(sqlstate)), pg_error(sqlstate)):
        error = translate_db_error(exc, "writing")
        assert isinstance(error, LedgerUnavailable) and error.retriable, (sqlstate, type(exc))
        assert error.details["sqlstate"] == sqlstate
        assert translate(exc).retriable  # the recorder's translation is the same one


def test_read_only_transaction_arrives_as_internal_error_and_is_still_retriable() -> None:
    exc = wrapped(pg_error("25006"))
    assert type(exc).__name__ == "InternalError"  # what SQLAlchemy makes of ReadOnlySqlTransaction
    error = translate_db_error(exc, "writing")
    assert error.retriable and "read-only" in error.message


@pytest.mark.parametrize("sqlstate", PERMANENT)
def test_errors_about_the_statement_or_the_data_are_permanent(sqlstate: str) -> None:
    for exc in (wrapped(pg_error(sqlstate)), pg_error(sqlstate)):
        error = translate_db_error(exc, "writing")
        assert isinstance(error, LedgerError) and not error.retriable, (sqlstate, type(exc))


def test_a_missing_schema_is_permanent_and_says_what_to_run() -> None:
    error = translate_db_error(wrapped(pg_error("42P01")), "writing")
    assert not error.retriable and "offset-ledger db upgrade" in error.message


def test_errors_without_sqlstate_keep_their_class_rule() -> None:
    import sqlite3

    assert translate_db_error(sqlite3.OperationalError("database is locked"), "writing").retriable
    assert translate_db_error(psycopg2.OperationalError("could not connect to server"), "writing").retriable
    assert not translate_db_error(sqlite3.IntegrityError("UNIQUE constraint failed"), "writing").retriable
    assert not translate_db_error(ValueError("odd"), "writing").retriable


def test_a_schema_upgrade_during_a_failover_is_retriable(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # A listener's first write upgrades the schema; on a read-only ledger that must be retried, not
    # turned into a permanent error that dead-letters every event of the batch.
    from alembic import command

    from offset_ledger.ledger.engine import make_engine, upgrade

    def read_only(*_args, **_kw):  # type: ignore[no-untyped-def]
        raise wrapped(pg_error("25006"))

    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    monkeypatch.setattr(command, "upgrade", read_only)
    try:
        with pytest.raises(LedgerUnavailable, match="schema upgrade failed") as info:
            upgrade(engine)
        assert info.value.retriable and info.value.details["sqlstate"] == "25006"
        monkeypatch.setattr(command, "upgrade", lambda *_a, **_k: (_ for _ in ()).throw(
            wrapped(pg_error("42501"))))  # insufficient_privilege: permanent
        with pytest.raises(LedgerError) as denied:
            upgrade(engine)
        assert not denied.value.retriable
    finally:
        engine.dispose()
