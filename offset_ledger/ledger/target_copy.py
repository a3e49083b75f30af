"""Executor side of the Postgres sink: each partition COPYs its rows into the staging table.

Runs in Spark's Python workers (never on the driver's collect path): the function and everything
it needs are importable module members and plain values, so it pickles the same way on classic
Spark and on Spark Connect. It is SQL (a ``COPY``), so it lives in ``ledger/`` beside the rest of the
target's SQL (``ledger.sink_target``), but apart from it: a worker imports this module and
``rules.sink_copy`` only, never SQLAlchemy or the ledger's tables.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from offset_ledger.errors import ConfigError
from offset_ledger.rules.sink_copy import copy_line, quote_ident

#: Bytes buffered per COPY call: a partition of any size streams through bounded memory.
_CHUNK_BYTES = 8 << 20


def psycopg2_args(dsn: str) -> dict[str, Any]:
    """psycopg2.connect keyword arguments from a SQLAlchemy URL (``postgresql+psycopg2://...``)."""
    from sqlalchemy.engine import make_url

    url = make_url(dsn)
    if url.get_backend_name() != "postgresql":
        raise ConfigError(f"the Postgres sink needs a postgresql:// DSN, not {url.get_backend_name()}://")
    args: dict[str, Any] = url.translate_connect_args(username="user", database="dbname")
    args.update({k: v for k, v in url.query.items() if isinstance(v, str)})
    return args


def copy_partition(connect_args: Mapping[str, Any], staging: str, columns: list[str],
                   instants: frozenset[int] = frozenset()) -> Callable[[Iterable[Any]], None]:
    """The ``foreachPartition`` function that COPYs one partition's rows into the attempt's staging table.

    ``instants``: the positions of ``timestamp`` columns, which the driver selected as epoch
    microseconds (``Staging.write``) so that no worker's local time zone touches them.
    """
    args = dict(connect_args)
    statement = f"COPY {quote_ident(staging)} ({', '.join(quote_ident(c) for c in columns)}) FROM STDIN"

    def stage(rows: Iterable[Any]) -> None:
        import psycopg2  # type: ignore[import-untyped]

        conn = None
        buf = io.StringIO()
        try:
            for row in rows:
                buf.write(copy_line(row, instants))
                if buf.tell() >= _CHUNK_BYTES:
                    conn = conn or psycopg2.connect(**args)
                    _flush(conn, statement, buf)
                    buf = io.StringIO()
            if buf.tell():
                conn = conn or psycopg2.connect(**args)
                _flush(conn, statement, buf)
            if conn is not None:
                conn.commit()
        finally:
            if conn is not None:
                conn.close()

    return stage


def _flush(conn: Any, statement: str, buf: io.StringIO) -> None:
    buf.seek(0)
    with conn.cursor() as cur:
        cur.copy_expert(statement, buf)
