"""The sink's pure rules: batch identity and fencing, the running batch's offsets, COPY text."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offset_ledger.errors import CheckpointFormatError
from offset_ledger.rules.checkpoint import read_committed_batches
from offset_ledger.rules.sink_batch import running_batch
from offset_ledger.rules.sink_copy import copy_instant, copy_line, copy_value, quote_ident
from offset_ledger.rules.sink_identity import SinkState, decide
from tests.unit.rules.test_checkpoint import FIXTURES, DictFiles

# -- identity and fence ----------------------------------------------------------------------


def test_first_commit_gets_sequence_one() -> None:
    d = decide(SinkState(), generation_id=7, batch_id=0, current_generation_id=7, committed_sequence=None)
    assert (d.verdict, d.sequence) == ("commit", 1)


def test_a_rerun_of_a_committed_batch_is_skipped_with_its_sequence() -> None:
    d = decide(SinkState(5, 7, 4), generation_id=7, batch_id=4, current_generation_id=7, committed_sequence=5)
    assert (d.verdict, d.sequence) == ("skip", 5)
    # Also when a newer generation exists meanwhile: it is done, nothing to fence.
    d = decide(SinkState(9, 8, 3), generation_id=7, batch_id=4, current_generation_id=8, committed_sequence=5)
    assert d.verdict == "skip"


def test_batch_ids_restart_at_zero_in_a_new_generation_and_the_sequence_keeps_growing() -> None:
    d = decide(SinkState(12, 7, 11), generation_id=8, batch_id=0, current_generation_id=8, committed_sequence=None)
    assert (d.verdict, d.sequence) == ("commit", 13)


def test_a_zombie_of_an_older_generation_is_fenced() -> None:
    d = decide(SinkState(12, 7, 11), generation_id=7, batch_id=12, current_generation_id=8, committed_sequence=None)
    assert d.verdict == "fenced" and d.sequence is None and "not the pipeline's current" in d.reason
    # A checkpoint the ledger has no generation for is fenced too.
    d = decide(SinkState(), generation_id=7, batch_id=0, current_generation_id=None, committed_sequence=None)
    assert d.verdict == "fenced"


def test_a_driver_behind_the_sinks_last_commit_on_the_same_generation_is_fenced() -> None:
    d = decide(SinkState(12, 8, 5), generation_id=8, batch_id=3, current_generation_id=8, committed_sequence=None)
    assert d.verdict == "fenced" and "behind" in d.reason


_attempt = st.tuples(st.integers(0, 3), st.integers(0, 6), st.booleans())  # generation bump, batch id, zombie


@settings(max_examples=300, deadline=None)
@given(st.lists(_attempt, min_size=1, max_size=60))
def test_any_history_of_attempts_commits_each_batch_once_in_sequence_order(attempts) -> None:  # type: ignore[no-untyped-def]
    """A fake store under ``decide``: sequences grow by one per commit, never reused, never by a zombie."""
    state, committed, current = SinkState(), {}, 1
    log = []
    for bump, batch_id, zombie in attempts:
        current += bump
        generation = current - 1 if zombie and current > 1 else current
        d = decide(state, generation_id=generation, batch_id=batch_id, current_generation_id=current,
                   committed_sequence=committed.get((generation, batch_id)))
        if d.verdict == "commit":
            assert generation == current and (generation, batch_id) not in committed
            committed[(generation, batch_id)] = d.sequence
            state = SinkState(d.sequence, generation, batch_id)  # type: ignore[arg-type]
            log.append((generation, batch_id))
        elif d.verdict == "skip":
            assert d.sequence == committed[(generation, batch_id)]
    assert sorted(committed.values()) == list(range(1, len(committed) + 1))
    assert log == sorted(log)  # commits in (generation, batch id) order: the sequence is monotonic


# -- the running batch from a real checkpoint -------------------------------------------------

_SPARKS = sorted(p.name for p in FIXTURES.glob("spark-*"))


@pytest.mark.parametrize("spark", _SPARKS)
def test_the_running_batch_has_the_ranges_the_commit_log_reader_gives(spark: str) -> None:
    files = DictFiles.from_dir(FIXTURES / spark / "kafka-one")
    _, committed = read_committed_batches("/x", files)
    for oracle in committed:
        # Inside foreachBatch the commit file does not exist yet.
        del files.files[f"commits/{oracle.batch_id}"]
        query_id, batch = running_batch("/x", files, oracle.batch_id)
        assert batch == oracle and query_id
    assert committed and committed[0].starts is not None  # batch 0 starts at the initial offsets


def test_a_missing_offsets_file_is_a_clear_error() -> None:
    files = DictFiles.from_dir(FIXTURES / "spark-4.2.0" / "kafka-one")
    with pytest.raises(CheckpointFormatError, match="offsets/9"):
        running_batch("/x", files, 9)
    del files.files["metadata"]
    with pytest.raises(CheckpointFormatError, match="metadata"):
        running_batch("/x", files, 1)


# -- COPY text -------------------------------------------------------------------------------


def _unescape(field: str) -> str | None:
    """PostgreSQL's reading of one COPY text field (the subset copy_value writes)."""
    if field == "\\N":
        return None
    out, i = [], 0
    while i < len(field):
        c = field[i]
        if c == "\\":
            nxt = field[i + 1]
            out.append({"n": "\n", "r": "\r", "t": "\t", "\\": "\\"}[nxt])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


@given(st.lists(st.one_of(st.none(), st.text()), min_size=1, max_size=5))
def test_strings_and_nulls_survive_copy_text(values) -> None:  # type: ignore[no-untyped-def]
    line = copy_line(values)
    assert line.endswith("\n") and line.count("\n") == 1
    fields = line[:-1].split("\t")
    assert [_unescape(f) for f in fields] == values


def test_copy_values_of_other_types() -> None:
    assert [copy_value(v) for v in (True, 3, 1.5, float("nan"), Decimal("2.50"), date(2026, 1, 2))] == [
        "t", "3", "1.5", "NaN", "2.50", "2026-01-02"]
    assert copy_value(datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02T03:04:05"
    assert copy_value(b"\x01\xff") == "\\\\x01ff"
    assert copy_value({"a": [1, "x\ty"]}) == '{"a":[1,"x\\\\ty"]}'
    assert copy_value("") == ""  # an empty string is not NULL


def test_identifiers_are_quoted_per_part() -> None:
    assert quote_ident("orders") == '"orders"'
    assert quote_ident('s.we"ird') == '"s"."we""ird"'


# -- the Delta log ---------------------------------------------------------------------------


def test_a_delta_commit_gives_its_txn_metadata_and_rows() -> None:
    from offset_ledger.rules.delta_log import commit_version, parse_commit

    data = b"\n".join([
        b'{"commitInfo":{"operation":"WRITE","userMetadata":"{\\"sequence\\": 4}",'
        b'"operationMetrics":{"numFiles":"2","numOutputRows":"10"}}}',
        b'{"txn":{"appId":"orders:out","version":4,"lastUpdated":1}}',
        b'{"add":{"path":"part-0.parquet","size":1}}', b""])
    c = parse_commit(7, data, "p")
    assert (c.version, c.txn_app_id, c.txn_version, c.user_metadata, c.output_rows) == (
        7, "orders:out", 4, '{"sequence": 4}', 10)
    assert commit_version("00000000000000000012.json") == 12
    assert commit_version("00000000000000000010.checkpoint.parquet") is None
    assert commit_version("_last_checkpoint") is None
    with pytest.raises(CheckpointFormatError, match="line 1"):
        parse_commit(1, b"{not json", "p")


def test_staging_tables_are_named_per_sink_generation_batch_and_attempt() -> None:
    from offset_ledger.sinks.staging import Staging, jdbc_target

    a, b = Staging("public.orders_out", "orders:public.orders_out"), Staging("orders_out", "other")
    name = a.name(7, 12, "abcd1234")
    assert name.startswith("public.ol_stage_") and name.endswith("_7_12_abcd1234") and len(name.split(".")[1]) < 63
    assert a.prefix != b.prefix and b.name(1, 0, "x").startswith("ol_stage_")
    url, props = jdbc_target("postgresql+psycopg2://u:p%40w@db.example:6543/ledger")
    assert url == "jdbc:postgresql://db.example:6543/ledger"
    assert props == {"driver": "org.postgresql.Driver", "user": "u", "password": "p@w"}


@given(st.integers(min_value=-(10**15), max_value=10**16))
def test_a_timestamp_goes_to_copy_as_its_utc_instant(micros: int) -> None:
    text = copy_instant(micros)
    assert text.endswith("+00:00")
    parsed = datetime.fromisoformat(text)
    since = parsed - datetime(1970, 1, 1, tzinfo=timezone.utc)
    assert since // timedelta(microseconds=1) == micros


def test_instant_fields_of_a_copy_line_are_utc_and_others_unchanged() -> None:
    # 00:30Z and 01:30Z of Berlin's 2026-10-25 DST change: one local wall clock, two instants.
    first, second = 1792888200 * 10**6, 1792891800 * 10**6
    assert copy_line([first, "x", None, second], frozenset({0, 2, 3})) == (
        "2026-10-25T00:30:00+00:00\tx\t\\N\t2026-10-25T01:30:00+00:00\n")
    assert copy_line([5, datetime(2026, 10, 25, 2, 30)]) == "5\t2026-10-25T02:30:00\n"


def test_a_nested_column_goes_through_spark_s_json_when_it_holds_an_instant_anywhere() -> None:
    from pyspark.sql.types import (
        ArrayType,
        IntegerType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampNTZType,
        TimestampType,
    )

    from offset_ledger.sinks.staging import NESTED_JSON, holds_instant

    deep = StructType([StructField("a", ArrayType(MapType(StringType(), TimestampType())))])
    assert holds_instant(deep) and holds_instant(ArrayType(TimestampType()))
    assert holds_instant(MapType(TimestampType(), IntegerType()))
    assert not holds_instant(StructType([StructField("w", TimestampNTZType()), StructField("n", IntegerType())]))
    assert not holds_instant(TimestampType())  # a top-level instant is staged as epoch microseconds instead
    assert NESTED_JSON["timeZone"] == "UTC" and NESTED_JSON["timestampFormat"].endswith("xxx")
