"""The pure checkpoint parser, from literal files and from real checkpoints Spark 3.5 and 4.2 wrote."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from offset_ledger.errors import CheckpointFormatError, InvalidInput
from offset_ledger.rules.checkpoint import (
    classify_offset,
    kafka_positions,
    parse_initial_offsets,
    parse_source_choice,
    read_checkpoint,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"
META = b'{"id":"q-1"}'
BATCH_META = '{"batchWatermarkMs":0,"batchTimestampMs":1700000000000,"conf":{}}'


class DictFiles:
    """A checkpoint as a dict of relative path -> bytes."""

    def __init__(self, files: Mapping[str, bytes | str]) -> None:
        self.files = {k: v.encode() if isinstance(v, str) else v for k, v in files.items()}

    @classmethod
    def from_dir(cls, root: Path) -> DictFiles:
        return cls({str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()})

    def list(self, relative_dir: str) -> list[str]:
        prefix = relative_dir.rstrip("/") + "/"
        return sorted({k[len(prefix):].split("/")[0] for k in self.files if k.startswith(prefix)})

    def read(self, relative_path: str) -> bytes | None:
        return self.files.get(relative_path)


def _offsets(*sources: str, version: str = "v1") -> str:
    return "\n".join([version, BATCH_META, *sources])


def _commit(version: str = "v1") -> str:
    return f'{version}\n{{"nextBatchWatermarkMs":0}}'


def test_last_committed_batch_is_the_position_and_later_planned_batches_are_not() -> None:
    files = DictFiles({
        "metadata": META,
        "offsets/0": _offsets('{"orders":{"0":5,"1":5}}'), "commits/0": _commit(),
        "offsets/1": _offsets('{"orders":{"0":10,"1":9}}'), "commits/1": _commit(),
        "offsets/2": _offsets('{"orders":{"0":15,"1":14}}'),  # planned, never committed
        ".1.crc": b"junk", "offsets/.2.crc": b"junk",
    })
    state = read_checkpoint("/ckpt/orders/", files)
    assert state.location == "/ckpt/orders"
    assert (state.query_id, state.committed_batch_id, state.planned_batch_ids) == ("q-1", 1, (2,))
    assert state.batch_timestamp_ms == 1700000000000
    chosen = kafka_positions(state)
    assert chosen.positions == {"orders": {0: 10, 1: 9}} and chosen.used == (0,)


def test_nothing_committed_takes_the_initial_offsets_kafka_wrote() -> None:
    files = DictFiles({
        "metadata": META, "offsets/0": _offsets('{"orders":{"0":5}}'),
        "sources/0/0": b'\x00v1\n{"orders":{"0":0}}',
    })
    state = read_checkpoint("/ckpt", files)
    assert state.committed_batch_id is None and state.planned_batch_ids == (0,)
    assert kafka_positions(state).positions == {"orders": {0: 0}}


def test_several_kafka_sources_need_a_choice_and_all_takes_the_lowest_per_partition() -> None:
    files = DictFiles({
        "metadata": META,
        "offsets/4": _offsets('{"orders":{"0":10,"1":7}}', "-", '{"orders":{"0":8,"1":9},"pay":{"0":3}}', "", "-"),
        "commits/4": _commit(),
    })
    state = read_checkpoint("/ckpt", files)
    assert [s.kind for s in state.sources] == ["kafka", "none", "kafka", "none", "none"]
    with pytest.raises(InvalidInput, match="--source"):
        kafka_positions(state)
    everything = kafka_positions(state, "all")
    assert everything.positions == {"orders": {0: 8, 1: 7}, "pay": {0: 3}}
    assert everything.used == (0, 2)
    second = kafka_positions(state, 2)
    assert second.positions == {"orders": {0: 8, 1: 9}, "pay": {0: 3}}
    assert any("source 0" in s and "not chosen" in s for s in second.skipped)
    with pytest.raises(InvalidInput, match="no Kafka source 1"):
        kafka_positions(state, 1)


def test_non_kafka_sources_are_reported_and_skipped() -> None:
    for raw in ('{"logOffset":3}', "42", '{"0":{"value":5,"runTimeMs":1}}', '{"t":{"x":1}}', '{"t":{"0":true}}'):
        assert classify_offset(raw, 0, "p").kind == "other", raw
    files = DictFiles({"metadata": META, "offsets/0": _offsets('{"logOffset":0}', '{"orders":{"0":2}}'),
                       "commits/0": _commit()})
    chosen = kafka_positions(read_checkpoint("/ckpt", files))
    assert chosen.positions == {"orders": {0: 2}}
    assert chosen.skipped == ('source 0: not Kafka ({"logOffset":0}), skipped',)
    only_files = DictFiles({"metadata": META, "offsets/0": _offsets('{"logOffset":0}'), "commits/0": _commit()})
    with pytest.raises(InvalidInput, match="no Kafka source"):
        kafka_positions(read_checkpoint("/ckpt", only_files))


@pytest.mark.parametrize(("path", "content", "reason"), [
    ("offsets/1", _offsets('{"orders":{"0":'), "not JSON"),
    ("offsets/1", _offsets('{"orders":{"0":1}}', version="v99"), "v99"),
    ("offsets/1", "", "empty file"),
    ("offsets/1", "version one\n{}\n{}", "not a format version"),
    ("commits/1", _commit("v99"), "v99"),
    ("metadata", "{not json", "not JSON"),
    ("metadata", '{"name":"x"}', 'no query "id"'),
    ("offsets/1", b"\xff\xfe", "not UTF-8"),
])
def test_corrupt_or_unknown_version_files_name_the_file(path: str, content: str | bytes, reason: str) -> None:
    files = {"metadata": META, "offsets/1": _offsets('{"orders":{"0":1}}'), "commits/1": _commit()}
    files[path] = content  # type: ignore[assignment]
    with pytest.raises(CheckpointFormatError) as err:
        read_checkpoint("/ckpt", DictFiles(files))
    assert err.value.path == f"/ckpt/{path}" and reason in err.value.message


def test_missing_metadata_and_no_position_at_all_are_errors() -> None:
    with pytest.raises(CheckpointFormatError, match="metadata"):
        read_checkpoint("/ckpt", DictFiles({"offsets/0": _offsets("{}")}))
    with pytest.raises(CheckpointFormatError, match="no committed batch and no initial offsets"):
        read_checkpoint("/ckpt", DictFiles({"metadata": META}))
    with pytest.raises(CheckpointFormatError, match="v2"):
        parse_initial_offsets(b"\x00v2\n{}", 0, "/ckpt/sources/0/0")


def test_offset_log_v2_lines_carry_source_ids() -> None:
    files = DictFiles({"metadata": META, "offsets/0": _offsets('0:{"orders":{"0":4}}', "1:-", version="v2"),
                       "commits/0": _commit("v2")})
    state = read_checkpoint("/ckpt", files)
    assert [(s.source_id, s.kind) for s in state.sources] == [("0", "kafka"), ("1", "none")]
    bad = DictFiles({"metadata": META, "offsets/0": _offsets('{"orders":{"0":4}}', version="v2"),
                     "commits/0": _commit()})
    with pytest.raises(CheckpointFormatError, match="source id"):
        read_checkpoint("/ckpt", bad)


def test_source_choice() -> None:
    assert parse_source_choice(None) is None and parse_source_choice("all") == "all"
    assert parse_source_choice("2") == 2 and parse_source_choice(1) == 1
    for bad in ("-1", "x", -1, True):
        with pytest.raises(InvalidInput):
            parse_source_choice(bad)  # type: ignore[arg-type]


# -- real checkpoints (tests/fixtures/checkpoints/capture.py) ----------------------------------

_SPARKS = sorted(p.name for p in FIXTURES.glob("spark-*"))


def test_fixtures_hold_spark_4_2_and_3_5() -> None:
    assert "spark-4.2.0" in _SPARKS and "spark-3.5.7" in _SPARKS


@pytest.mark.parametrize("spark", _SPARKS)
def test_real_single_kafka_source(spark: str) -> None:
    state = read_checkpoint("/x", DictFiles.from_dir(FIXTURES / spark / "kafka-one"))
    assert state.committed_batch_id == 3 and state.planned_batch_ids == () and state.version == 1
    (topic, parts), = kafka_positions(state).positions.items()
    assert topic.startswith("orders_") and parts == {0: 20, 1: 20}
    # Spark's own initial offsets file (NUL byte, v1) parses too.
    initial = parse_initial_offsets((FIXTURES / spark / "kafka-one" / "sources" / "0" / "0").read_bytes(), 0, "p")
    assert initial.kind == "kafka" and list(initial.kafka.values()) == [{0: 0, 1: 0}]  # type: ignore[union-attr]


@pytest.mark.parametrize("spark", _SPARKS)
def test_real_checkpoint_with_its_last_commit_removed_resumes_one_batch_earlier(spark: str) -> None:
    files = DictFiles.from_dir(FIXTURES / spark / "kafka-one")
    del files.files["commits/3"]
    state = read_checkpoint("/x", files)
    assert state.committed_batch_id == 2 and state.planned_batch_ids == (3,)
    assert list(kafka_positions(state).positions.values()) == [{0: 15, 1: 15}]


@pytest.mark.parametrize("spark", _SPARKS)
def test_real_two_kafka_sources_and_a_file_source(spark: str) -> None:
    two = read_checkpoint("/x", DictFiles.from_dir(FIXTURES / spark / "kafka-two"))
    with pytest.raises(InvalidInput, match="2 Kafka sources"):
        kafka_positions(two)
    merged = kafka_positions(two, "all").positions
    assert sorted(len(p) for p in merged.values()) == [2, 3]
    mixed = kafka_positions(read_checkpoint("/x", DictFiles.from_dir(FIXTURES / spark / "kafka-and-file")))
    assert mixed.used == (1,) and "logOffset" in mixed.skipped[0]
    (topic, parts), = mixed.positions.items()
    assert topic.startswith("payments_") and parts == {0: 10, 1: 10, 2: 10}


def test_real_offset_log_v2_from_spark_4_2() -> None:
    state = read_checkpoint("/x", DictFiles.from_dir(FIXTURES / "spark-4.2.0" / "kafka-one-offsetlog-v2"))
    assert state.version == 2 and state.committed_batch_id == 3
    assert list(kafka_positions(state).positions.values()) == [{0: 20, 1: 20}]
