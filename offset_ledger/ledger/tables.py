"""The ledger schema: SQLAlchemy Core tables, the one source the migrations are built from.

Offsets follow Spark's convention (see ``offset_ledger.rules.model``): ``until_offset`` and
``next_offset`` are exclusive ends, ``from_offset`` is inclusive. Partition numbers are stored as
integers; the ``partition`` column name is quoted by SQLAlchemy where the dialect needs it.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    event,
    false,
)
from sqlalchemy.types import JSON, TypeDecorator

from offset_ledger.ledger.engine import migrations_dir

# A fixed naming convention makes constraint names identical on every database, so later
# migrations can refer to them.
metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

_NAME = 255
_Id = BigInteger().with_variant(Integer, "sqlite")  # SQLite autoincrements only INTEGER keys


def _tz() -> DateTime:
    return DateTime(timezone=True)


#: One streaming query run (Spark's run id), from QueryStarted to QueryTerminated.
runs = Table(
    "runs",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("query_id", String(64), nullable=False),
    Column("pipeline", String(_NAME), nullable=False),
    Column("consumer_group", String(_NAME), nullable=False),
    Column("query_name", String(_NAME)),
    Column("app_version", String(_NAME)),
    Column("checkpoint_location", Text),
    Column("started_at", _tz(), nullable=False),
    Column("terminated_at", _tz()),
    Column("exception", Text),
    Column("last_heartbeat_at", _tz()),
    Column("last_batch_id", BigInteger),
    # The checkpoint generation whose location the run's checkpoint is (NULL: none of them). Only
    # runs of the pipeline's current generation move positions once it has one (0003).
    Column("generation_id", BigInteger),
    # The longest micro-batch (Spark's triggerExecution) the run reported: a run is active until it
    # misses heartbeats for max(run timeout, 3 x this) (0003).
    Column("max_batch_ms", BigInteger),
    # The longest silence the listener observed between two of the run's events (progress or idle):
    # a longer idle or trigger interval than Spark's 10 s default widens its silence bound
    # (``rules.liveness``). NULL: not observed (a sink's or the watcher's run, an older listener) (0012).
    Column("max_gap_ms", BigInteger),
    # The driver process's own heartbeat (0022): a daemon thread of the listener writes ``beat_at`` every
    # ``beat_every_ms`` whatever the trigger, batch length or idleness, so a run is alive while its beat
    # is fresh and ended (crashed) when the beat stops (``rules.liveness``). NULL: a run of a release
    # without the heartbeat, a sink's or the watcher's run: its state is inferred (``uncertain``).
    Column("beat_at", _tz()),
    Column("beat_every_ms", BigInteger),
    Index(None, "pipeline", "consumer_group", "started_at"),
    Index(None, "query_id"),
)

#: One committed micro-batch of one query (idempotent on query id + batch id).
batches = Table(
    "batches",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(_NAME), nullable=False),
    Column("consumer_group", String(_NAME), nullable=False),
    Column("query_id", String(64), nullable=False),
    Column("run_id", String(64), nullable=False),
    Column("batch_id", BigInteger, nullable=False),
    Column("batch_time", _tz(), nullable=False),
    Column("recorded_at", _tz(), nullable=False),
    Column("input_rows", BigInteger, nullable=False, default=0),
    # 0004: Spark's eventTime figures (watermark in effect for the batch, min and max event time
    # seen) and its stateful operators' row counts (summed over operators); NULL when the query
    # has no watermark or no state. The restart of a windowed pipeline is computed from them.
    Column("watermark", _tz()),
    Column("event_time_min", _tz()),
    Column("event_time_max", _tz()),
    Column("state_rows_total", BigInteger),
    Column("state_rows_updated", BigInteger),
    Column("state_rows_dropped_by_watermark", BigInteger),
    # 0005: who recorded the batch: NULL the listener, "checkpoint" read back from Spark's commit
    # log (reconciliation on restart, or ``offset-ledger watch``).
    Column("source", String(16)),
    UniqueConstraint("query_id", "batch_id"),
    Index(None, "pipeline", "consumer_group", "batch_time"),
)

def _range_columns() -> list[Column[Any]]:
    """One recorded range per batch, source and partition: the columns the per-partition table had and
    its view keeps (fresh objects each call: a Column belongs to one Table)."""
    return [
        Column("pipeline", String(_NAME), nullable=False),
        Column("consumer_group", String(_NAME), nullable=False),
        Column("query_id", String(64), nullable=False),
        Column("batch_id", BigInteger, nullable=False),
        Column("source_index", Integer, nullable=False),
        Column("topic", String(_NAME), nullable=False),
        Column("partition", Integer, nullable=False),
        Column("from_offset", BigInteger),  # NULL: the start was not reported (a fresh checkpoint's first batch)
        Column("until_offset", BigInteger, nullable=False),
        Column("batch_time", _tz(), nullable=False),
    ]


#: Per batch, Kafka source and partition: the range read, ``[from_offset, until_offset)``. Until
#: 0016 this table held every range; since, it stays only as the name the previous release's
#: listener inserts into (with ``ON CONFLICT`` on its unique key, which no view accepts): a trigger
#: folds each row into ``offset_ranges`` and drops it, so the table stays empty. Read the ranges
#: from ``batch_offsets`` below (the view ``v_batch_offsets``).
batch_offsets_inbox = Table(
    "batch_offsets",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    *_range_columns(),
    UniqueConstraint("query_id", "batch_id", "source_index", "topic", "partition"),
    Index(None, "pipeline", "topic", "consumer_group", "batch_time"),
)


def postgres_array(item: Any) -> Any:
    """PostgreSQL's ``ARRAY`` of ``item``, asked for by a Postgres ledger only: the dialect's lazy point
    (a SQLite ledger's command never imports it)."""
    from sqlalchemy.dialects.postgresql import ARRAY

    return ARRAY(item)


class PackedInts(TypeDecorator):  # type: ignore[type-arg]
    """A list of integers (None: unknown): a PostgreSQL array, a JSON array text on SQLite.

    SQLite has no array type; its JSON functions (``json_each``, ``json_insert``) read and extend
    the text in SQL, which is what the ``v_batch_offsets`` view and the compatibility triggers do.
    """

    impl = Text
    cache_ok = True

    def __init__(self, big: bool = False) -> None:
        super().__init__()
        self.big = big

    def load_dialect_impl(self, dialect: Any) -> Any:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(postgres_array(BigInteger if self.big else Integer))
        return dialect.type_descriptor(Text())

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        if value is None or dialect.name == "postgresql":
            return value
        return json.dumps([None if v is None else int(v) for v in value], separators=(",", ":"))

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        if value is None or dialect.name == "postgresql":
            return value
        return json.loads(value)


#: 0016: a batch's ranges, compactly: one row per (batch, Kafka source, topic) with the partitions
#: and their ``[from_offset, until_offset)`` as parallel arrays (a NULL start: not reported), the
#: batch referenced by its numeric key: a small fraction of a row per partition's bytes (docs/benchmarks.md).
#: The foreign key is SQLite's only: PostgreSQL dropped it
#: in 0020 (a probe per deleted batch; every writer and prune handle the ranges themselves, every
#: reader joins ``batches``).
offset_ranges = Table(
    "offset_ranges",
    metadata,
    Column("batch_pk", _Id, ForeignKey("batches.id", ondelete="CASCADE"), primary_key=True),
    Column("source_index", Integer, primary_key=True),
    Column("topic", String(_NAME), primary_key=True),
    Column("partitions", PackedInts(), nullable=False),
    Column("from_offsets", PackedInts(big=True), nullable=False),
    Column("until_offsets", PackedInts(big=True), nullable=False),
)

#: Views the migrations create (never ``metadata.create_all``): Table objects for reading them.
views = MetaData()

#: 0016: the view ``v_batch_offsets``, one row per batch, source and partition with the columns the
#: ``batch_offsets`` table had (but its surrogate ``id``): every reader reads ranges through it.
#: INSTEAD OF triggers fold inserts into ``offset_ranges`` and apply updates and deletes there.
batch_offsets = Table(
    "v_batch_offsets",
    views,
    *_range_columns(),
)

def _position_columns() -> list[Column[Any]]:
    """The current position per (pipeline, consumer group, topic, partition): the columns the per-partition
    table had and its view keeps (fresh objects each call: a Column belongs to one Table)."""
    return [
        Column("pipeline", String(_NAME), primary_key=True),
        Column("consumer_group", String(_NAME), primary_key=True),
        Column("topic", String(_NAME), primary_key=True),
        Column("partition", Integer, primary_key=True),
        Column("next_offset", BigInteger, nullable=False),
        Column("updated_at", _tz(), nullable=False),
        Column("batch_id", BigInteger),
        Column("reset_id", BigInteger),  # set when a reset, not a batch, placed this position
        # set when a checkpoint generation's resolved starting offsets placed this position (0003)
        Column("generation_id", BigInteger),
        # Last (0021): a batch rewrites its position with the same query id, and PostgreSQL logs a
        # same-page update as the bytes between the unchanged prefix and suffix: here it is suffix.
        Column("query_id", String(64)),
    ]


#: Until 0024 the restart's source of truth, one row per partition rewritten by every batch; since,
#: the name the previous release's listener reads and writes (``INSERT ... ON CONFLICT`` on its key,
#: which no view accepts). On PostgreSQL its triggers fold each write into ``topic_positions``, and
#: ``topic_positions``' trigger keeps the rows it holds up to date; empty (a ledger created at 0024,
#: or ``TRUNCATE positions`` once no listener of the previous release runs) it costs nothing.
#: To be dropped in a later release. Read positions from ``positions`` below (``v_positions``).
positions_legacy = Table(
    "positions",
    metadata,
    *_position_columns(),
)


class PackedTexts(TypeDecorator):  # type: ignore[type-arg]
    """A list of strings (None elements allowed): a PostgreSQL ``text[]``, a JSON array text on SQLite."""

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Any) -> Any:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(postgres_array(Text))
        return dialect.type_descriptor(Text())

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        if value is None or dialect.name == "postgresql":
            return value
        return json.dumps(list(value), separators=(",", ":"))

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        if value is None or dialect.name == "postgresql":
            return value
        return json.loads(value)


#: How SQLAlchemy's SQLite DateTime stores a value (UTC, naive): the view hands the text to that type.
SQLITE_TIME = "%Y-%m-%d %H:%M:%S.%f"


class PackedTimes(TypeDecorator):  # type: ignore[type-arg]
    """A list of aware datetimes: a PostgreSQL ``timestamptz[]``; on SQLite a JSON array of UTC texts in
    the format SQLAlchemy's SQLite DateTime reads (what ``v_positions`` hands out)."""

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Any) -> Any:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(postgres_array(DateTime(timezone=True)))
        return dialect.type_descriptor(Text())

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        if value is None or dialect.name == "postgresql":
            return value
        from datetime import timezone

        return json.dumps([v.astimezone(timezone.utc).replace(tzinfo=None).strftime(SQLITE_TIME)
                           if v.tzinfo is not None else v.strftime(SQLITE_TIME) for v in value],
                          separators=(",", ":"))

    def process_result_value(self, value: Any, dialect: Any) -> Any:
        if value is None or dialect.name == "postgresql":
            return value
        from datetime import datetime, timezone

        return [datetime.fromisoformat(v).replace(tzinfo=timezone.utc) for v in json.loads(value)]


#: 0024: the restart's source of truth, one row per (pipeline, consumer group, topic): the partitions
#: (ascending) and their next offsets as parallel arrays, and who placed each one as a short list of
#: *movers* (time, batch, reset, generation, query id; position ``i`` of each ``moved_*`` array) that
#: ``stamps`` indexes per partition (1-based; NULL: every partition has mover 1, the steady state of a
#: pipeline whose batches move all its partitions). A batch moves it with one UPDATE of one row per
#: topic (``ledger.fast_batch``), whose WAL record PostgreSQL logs as the bytes between the unchanged
#: prefix (keys, partitions) and suffix (the query id): the offsets and the mover, a tenth of what a row
#: per partition logged (docs/benchmarks.md). ``ledger.position_store`` reads and writes it,
#: ``v_positions`` (below) unnests it with the per-partition table's columns.
topic_positions = Table(
    "topic_positions",
    metadata,
    Column("pipeline", String(_NAME), primary_key=True),
    Column("consumer_group", String(_NAME), primary_key=True),
    Column("topic", String(_NAME), primary_key=True),
    Column("partitions", PackedInts(), nullable=False),
    Column("stamps", PackedInts()),
    Column("next_offsets", PackedInts(big=True), nullable=False),
    Column("moved_at", PackedTimes(), nullable=False),
    Column("moved_batch_ids", PackedInts(big=True), nullable=False),
    Column("moved_reset_ids", PackedInts(big=True), nullable=False),
    Column("moved_generation_ids", PackedInts(big=True), nullable=False),
    Column("moved_query_ids", PackedTexts(), nullable=False),  # last: unchanged from batch to batch
)

#: 0024: the view ``v_positions``, one row per (pipeline, consumer group, topic, partition) with the
#: columns the per-partition ``positions`` table had: every reader reads positions through it. Its
#: INSTEAD OF triggers take single-row inserts, updates and deletes (tools, tests); the ledger's own
#: writers go through ``ledger.position_store`` (a row per topic, not per partition).
positions = Table(
    "v_positions",
    views,
    *_position_columns(),
)

#: Anomalies: gaps, regressions, data loss, removed partitions, ...
findings = Table(
    "findings",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(_NAME), nullable=False),
    Column("consumer_group", String(_NAME), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("topic", String(_NAME)),
    Column("partition", Integer),
    Column("query_id", String(64)),
    Column("batch_id", BigInteger),
    Column("expected_offset", BigInteger),
    Column("actual_offset", BigInteger),
    Column("message", Text, nullable=False),
    Column("details", JSON),
    Column("created_at", _tz(), nullable=False),
    Column("generation_id", BigInteger),  # the generation a restart's finding belongs to (0003)
    Column("run_id", String(64)),         # the run a recording finding is about (0003)
    # 0005: a repeated finding (same pipeline, group, run, kind, topic, partition) is one row: how
    # often it was seen and when last (NULL: once, at created_at).
    Column("occurrences", BigInteger),
    Column("last_seen_at", _tz()),
    Index(None, "pipeline", "consumer_group", "created_at"),
)

#: Every reset requested, dry runs included: who, when, why, how.
resets = Table(
    "resets",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(_NAME), nullable=False),
    Column("consumer_group", String(_NAME), nullable=False),
    Column("mode", String(16), nullable=False),  # earliest | latest | offsets | timestamp | shift
    Column("parameters", JSON),
    Column("actor", String(_NAME), nullable=False),
    Column("reason", Text),
    Column("dry_run", Boolean, nullable=False),
    Column("forced", Boolean, nullable=False, default=False),
    Column("created_at", _tz(), nullable=False),
    # pending: waiting for the restart helper; consumed: applied through a fresh checkpoint
    Column("status", String(16), nullable=False),
    Column("consumed_at", _tz()),
    Column("consumed_by_generation", BigInteger),
    Index(None, "pipeline", "consumer_group", "created_at"),
)

#: Per reset and partition: the position before and after, and the log bounds seen then.
reset_partitions = Table(
    "reset_partitions",
    metadata,
    Column("reset_id", BigInteger, ForeignKey("resets.id", ondelete="CASCADE"), primary_key=True),
    Column("topic", String(_NAME), primary_key=True),
    Column("partition", Integer, primary_key=True),
    Column("before_next_offset", BigInteger),  # NULL: the partition had no position
    Column("after_next_offset", BigInteger, nullable=False),
    Column("log_start_offset", BigInteger),
    Column("log_end_offset", BigInteger),
)

#: Checkpoint generations handed out by the restart helper under a pipeline's checkpoint root.
checkpoint_generations = Table(
    "checkpoint_generations",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(_NAME), nullable=False),
    Column("consumer_group", String(_NAME), nullable=False),
    Column("generation", Integer, nullable=False),
    Column("checkpoint_root", Text, nullable=False),
    Column("location", Text, nullable=False),
    Column("app_version", String(_NAME)),
    Column("reason", String(64), nullable=False),  # first | app_version | reset | requested | ...
    Column("created_at", _tz(), nullable=False),
    Column("starting_offsets", JSON),  # exactly what the plan handed Spark (sentinels kept)
    # 0003: the starting offsets as numbers (-2/-1 resolved against the watermarks read then), the
    # Kafka topic ids (KIP-516) and watermarks seen then, and the query that claimed the generation.
    Column("resolved_offsets", JSON),
    Column("topic_ids", JSON),
    Column("watermarks", JSON),
    Column("query_id", String(64)),
    # 0005: a windowed generation's inputs (window, slide, watermark delay, event-time floor, rewind
    # basis) so later restarts keep its floor, and whether the helper only defaulted the group.
    Column("stateful", JSON),
    Column("group_defaulted", Boolean),
    # 0019: the highest ``sink_batches.id`` of the pipeline when the generation opened (under the
    # pipeline lock every sink commit takes): a commit recorded later has a higher id, whatever the
    # clocks say (``sink_store.older_commits_ahead``). NULL: opened by a release before 0019.
    Column("sink_batch_floor", BigInteger),
    UniqueConstraint("pipeline", "consumer_group", "generation"),
)

#: Listener health reported by each listener instance (counters are cumulative).
listener_health = Table(
    "listener_health",
    metadata,
    Column("listener_id", String(64), primary_key=True),
    Column("pipeline", String(_NAME)),
    Column("host", String(_NAME)),
    Column("reported_at", _tz(), nullable=False),
    Column("queued", BigInteger, nullable=False, default=0),
    Column("written", BigInteger, nullable=False, default=0),
    Column("retried", BigInteger, nullable=False, default=0),
    Column("spilled", BigInteger, nullable=False, default=0),
    Column("failed", BigInteger, nullable=False, default=0),
    Column("last_error", Text),
    # 0023: the database role that wrote the row (PostgreSQL's default: current_user). A pipeline-less
    # row (a listener of several pipelines) belongs to that role under row security.
    Column("ledger_role", String(_NAME)),
)


#: 0005: a pipeline's restart policies (``offset_ledger.rules.policies``); every change is a row with the
#: whole set after it, who made it and why; the newest row is in force.
pipeline_policies = Table(
    "pipeline_policies",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(_NAME), nullable=False),
    Column("policies", JSON, nullable=False),
    Column("actor", String(_NAME), nullable=False),
    Column("reason", Text),
    Column("created_at", _tz(), nullable=False),
    Index(None, "pipeline", "id"),
)


#: 0006: a transactional sink (``offset_ledger.sinks``): its target and its last commit, the row a
#: commit locks (the fence). ``last_sequence`` only grows, across checkpoint generations.
sinks = Table(
    "sinks",
    metadata,
    Column("sink", String(_NAME), primary_key=True),
    Column("pipeline", String(_NAME), nullable=False),
    Column("consumer_group", String(_NAME), nullable=False),
    Column("kind", String(16), nullable=False),  # postgres | delta
    Column("target", Text, nullable=False),  # the table (schema.name) or the Delta table's path
    Column("target_database", Text),  # NULL: the ledger's own database; else host:port/dbname (no credentials)
    Column("last_sequence", BigInteger, nullable=False),
    Column("generation_id", BigInteger),  # the checkpoint generation and batch of the last commit
    Column("batch_id", BigInteger),
    Column("updated_at", _tz(), nullable=False),
)

#: 0006: per sink, every batch it committed: the ledger's identity of the batch (generation, batch
#: id -> sequence) and what it wrote (rows, table version).
sink_batches = Table(
    "sink_batches",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("sink", String(_NAME), nullable=False),
    Column("pipeline", String(_NAME), nullable=False),
    Column("consumer_group", String(_NAME), nullable=False),
    Column("sequence", BigInteger, nullable=False),
    Column("generation_id", BigInteger, nullable=False),
    Column("query_id", String(64), nullable=False),
    Column("batch_id", BigInteger, nullable=False),
    Column("target", Text, nullable=False),
    Column("row_count", BigInteger),
    Column("table_version", BigInteger),  # Delta: the table version the batch made
    Column("committed_at", _tz(), nullable=False),  # when the target committed
    Column("recorded_at", _tz(), nullable=False),  # when the ledger learned it (later: reconciled)
    UniqueConstraint("sink", "sequence"),
    UniqueConstraint("sink", "generation_id", "batch_id"),
    Index(None, "pipeline", "consumer_group", "query_id", "batch_id"),
)


#: 0009: what ``prune`` deleted, so ``verify`` can tell pruned history from history never recorded.
#: One row per island: consecutive ranges of one query on one partition whose offsets tile
#: ``[from_offset, until_offset)`` (a hole among the deleted ranges starts a new island and stays a gap).
pruned_ranges = Table(
    "pruned_ranges",
    metadata,
    Column("id", _Id, primary_key=True, autoincrement=True),
    Column("pipeline", String(_NAME), nullable=False),
    Column("consumer_group", String(_NAME), nullable=False),
    Column("query_id", String(64), nullable=False),
    Column("topic", String(_NAME), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("from_batch_id", BigInteger, nullable=False),
    Column("until_batch_id", BigInteger, nullable=False),  # inclusive: the island's last batch
    Column("from_offset", BigInteger),  # NULL: the first batch's start was not reported (0014)
    Column("until_offset", BigInteger, nullable=False),
    Column("batches", BigInteger, nullable=False),
    Column("first_batch_time", _tz(), nullable=False),
    Column("cutoff", _tz(), nullable=False),
    Column("pruned_at", _tz(), nullable=False),
    # 0014: the island stands for its reads (verify sweeps it as history). False: recorded by 0009,
    # which folded an unknown start into the first end; verify only explains gaps by such an island.
    Column("counts_reads", Boolean, nullable=False, server_default=false()),
    Column("first_until_offset", BigInteger),  # where the island's first batch ended (exclusive)
    Column("last_batch_time", _tz()),
    Column("run_id", String(64)),  # the run that read the island (a finding may flag it)
    Index(None, "pipeline", "consumer_group", "topic", "partition"),
)


#: 0017: the pipelines a team's database role may write (``offset-ledger db grant``; PostgreSQL row-level
#: security, ``offset_ledger.ledger.row_security``). A role with no row here is not restricted (the owner
#: and every role from before 0017); one with rows reaches only the pipelines its patterns name.
role_scopes = Table(
    "ledger_role_scopes",
    metadata,
    Column("role_name", String(_NAME), primary_key=True),
    # an exact pipeline name, or the prefix of a pattern written with a trailing '*' ('' for '*')
    Column("pattern", String(_NAME), primary_key=True),
    Column("is_prefix", Boolean, primary_key=True),
    Column("granted_at", _tz(), nullable=False),
)


def _migration(name: str) -> Any:
    """A migration module, read from its file (the migrations directory is no package)."""
    import importlib.util

    path = migrations_dir() / "versions" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_offset_ledger_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _create_compact_views(target: MetaData, connection: Any, tables: Any = None, **_: Any) -> None:
    """``metadata.create_all`` of the whole schema (tests, tools) also gets the 0016 and 0024 views and
    triggers: the migrations' own DDL, read from their files so that there is one text of it."""
    if tables is not None and offset_ranges not in tables:
        return  # a migration creating a subset (0001)
    _migration("0016_compact_ranges").create_views(connection)
    if tables is None or topic_positions in tables:
        _migration("0024_topic_positions").create_views(connection)
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql("ALTER TABLE topic_positions SET (fillfactor = 50, toast_tuple_target = 8160)")


event.listen(metadata, "after_create", _create_compact_views)
