"""Where the executors put a batch before the commit: one UNLOGGED staging table per attempt.

The table is ``ol_stage_<sink hash>_<generation id>_<batch id>_<attempt>`` in the target's schema,
with the batch's columns and the target's types (no constraints: a target's own id and default
columns are not in the batch). The commit moves its rows into the target and drops it in the same
transaction; an attempt that died before its commit leaves a table that the next commit drops.
UNLOGGED: staged rows are scratch, and a crash that loses them only makes Spark re-run the batch.

Executors write it one of two ways: ``copy`` (Spark's Python workers COPY each partition with
psycopg2; psycopg2 must be installed where the executors run) or ``jdbc`` (Spark's own JDBC writer
in the JVM; PostgreSQL's JDBC driver must be on Spark's classpath, e.g. ``spark.jars``).
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from sqlalchemy.engine import Connection

from offset_ledger.errors import ConfigError
from offset_ledger.ledger import sink_target
from offset_ledger.ledger.target_copy import copy_partition, psycopg2_args
from offset_ledger.rules.sink_copy import quote_ident

StageMode = Literal["copy", "jdbc"]


class Staging:
    """The staging tables of one sink's target."""

    def __init__(self, table: str, sink: str) -> None:
        self.table = table
        self.schema = table.split(".", 1)[0] if "." in table else None
        self.prefix = "ol_stage_" + hashlib.sha1(sink.encode()).hexdigest()[:10] + "_"

    def name(self, generation_id: int, batch_id: int, attempt: str) -> str:
        bare = f"{self.prefix}{generation_id}_{batch_id}_{attempt}"
        return f"{self.schema}.{bare}" if self.schema else bare

    def create(self, conn: Connection, name: str, columns: list[str]) -> None:
        sink_target.create_staging(conn, self.table, name, columns)

    def write(self, df: Any, name: str, columns: list[str], mode: StageMode, dsn: str) -> None:
        """The executors' part: every partition of ``df`` into the staging table (nothing through the driver)."""
        if mode == "copy":
            selected, instants = instants_as_micros(df, columns)
            selected.foreachPartition(copy_partition(psycopg2_args(dsn), name, columns, instants))
        elif mode == "jdbc":
            url, props = jdbc_target(dsn)
            df.select(*columns).write.jdbc(url, quote_ident(name), mode="append", properties=props)
        else:
            raise ConfigError(f"unknown stage mode {mode!r}: use 'copy' or 'jdbc'")

    def move(self, conn: Connection, name: str, columns: list[str]) -> int:
        """Staged rows into the target, the staging table dropped: in the caller's commit transaction."""
        return sink_target.move_staged(conn, self.table, name, columns)

    def drop(self, conn: Connection, name: str) -> None:
        """This attempt's staging table, when its batch is refused (another attempt's is not ours to drop)."""
        sink_target.drop_staging(conn, name)

    def clean(self, conn: Connection, generation_id: int, batch_id: int) -> None:
        """Drop leftovers of attempts that died: this batch's and earlier ones, and other generations'."""
        for bare in sink_target.staging_tables(conn, self.schema, self.prefix):
            parts = bare[len(self.prefix):].split("_")
            if len(parts) != 3 or not (parts[0].isdigit() and parts[1].isdigit()):
                continue
            gen, batch = int(parts[0]), int(parts[1])
            if gen != generation_id or batch <= batch_id:
                sink_target.drop_staging(conn, f"{self.schema}.{bare}" if self.schema else bare)


def instants_as_micros(df: Any, columns: list[str]) -> tuple[Any, frozenset[int]]:
    """``df``'s ``columns``, each ``timestamp`` one as Spark's epoch microseconds; and their positions.

    PySpark would hand the workers a ``timestamp`` as a naive datetime in *their* local time zone
    (ambiguous across a DST change, shifted when the executors' zone is not the database's);
    the microseconds are the instant itself, written as UTC by ``rules.sink_copy.copy_instant``.
    ``timestamp_ntz`` is wall clock in PySpark already and passes as it is.

    A struct, array or map column holding a ``timestamp`` anywhere inside goes to the target as
    JSON (as every nested column does) rendered by Spark in the JVM (``to_json``), never by the
    worker: a nested ``timestamp`` as a UTC instant with its offset (``2026-10-25T00:30:00.000000+00:00``),
    a nested ``timestamp_ntz`` as wall clock without one, null fields kept (``NESTED_JSON``).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampType

    types = {f.name: f.dataType for f in df.schema.fields}
    instants = frozenset(i for i, c in enumerate(columns) if isinstance(types.get(c), TimestampType))
    nested = frozenset(i for i, c in enumerate(columns)
                       if i not in instants and types.get(c) is not None and holds_instant(types[c]))
    if not instants and not nested:
        return df, instants

    def column(name: str) -> Any:  # a name as it is, dots included (not a struct field path)
        return F.col("`" + name.replace("`", "``") + "`")

    def staged(i: int, c: str) -> Any:
        if i in instants:
            return F.unix_micros(column(c)).alias(c)
        if i in nested:
            return F.to_json(column(c), NESTED_JSON).alias(c)
        return column(c)

    return df.select(*[staged(i, c) for i, c in enumerate(columns)]), instants


#: ``to_json`` options for a nested column holding instants: UTC with an explicit offset (``xxx``
#: never abbreviates it to ``Z``), microseconds as Spark keeps them, wall clock for ``timestamp_ntz``,
#: null fields written (as the worker's JSON of other nested columns does).
NESTED_JSON = {"timeZone": "UTC", "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSxxx",
               "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS", "ignoreNullFields": "false"}


def holds_instant(data_type: Any) -> bool:
    """Whether a struct, array or map type holds a ``timestamp`` (an instant) at any depth."""
    from pyspark.sql.types import ArrayType, MapType, StructType, TimestampType

    if isinstance(data_type, StructType):
        return any(isinstance(f.dataType, TimestampType) or holds_instant(f.dataType) for f in data_type.fields)
    if isinstance(data_type, ArrayType):
        return isinstance(data_type.elementType, TimestampType) or holds_instant(data_type.elementType)
    if isinstance(data_type, MapType):
        return any(isinstance(t, TimestampType) or holds_instant(t) for t in (data_type.keyType, data_type.valueType))
    return False


def jdbc_target(dsn: str) -> tuple[str, dict[str, str]]:
    """Spark's JDBC URL and properties for a SQLAlchemy Postgres DSN."""
    args = psycopg2_args(dsn)
    url = f"jdbc:postgresql://{args.get('host', 'localhost')}:{args.get('port', 5432)}/{args.get('dbname', '')}"
    props = {"driver": "org.postgresql.Driver", "user": str(args.get("user", ""))}
    if args.get("password"):
        props["password"] = str(args["password"])
    return url, props
