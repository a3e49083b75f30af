"""Checkpoint locations compared as locations: a table of spellings, and properties over generated paths."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offset_ledger.rules.authority import GenerationRef, match_generation, same_location
from offset_ledger.rules.locations import Location, normalize_location, parse_location, same_place, same_root


@pytest.mark.parametrize("text, normal", [
    ("/ck", "/ck"),
    ("/ck/", "/ck"),
    ("/ck//gen-1-ab12cd34///", "/ck/gen-1-ab12cd34"),
    ("/ck/./a/../gen-1", "/ck/gen-1"),
    ("/", "/"),
    ("file:/ck/", "file:/ck"),
    ("file:///ck", "file:/ck"),
    ("file://localhost/ck", "file:/ck"),
    ("FILE://LocalHost/ck", "file:/ck"),
    ("s3a://bucket/ck/", "s3a://bucket/ck"),
    ("s3a://bucket", "s3a://bucket/"),
    ("S3A://Bucket/CK", "s3a://Bucket/CK"),  # bucket names and paths keep their case
    ("hdfs://NameNode:8020/ck", "hdfs://namenode/ck"),
    ("hdfs://nn:9000/ck", "hdfs://nn:9000/ck"),  # 9000 is a common setting, not the default
    ("hdfs:///ck", "hdfs:/ck"),
    ("abfss://data@Acct.DFS.core.windows.net/ck", "abfss://data@acct.dfs.core.windows.net/ck"),
    ("hdfs://[::1]:8020/ck", "hdfs://[::1]/ck"),
    ("ck/", "ck"),
    ("  /ck  ", "/ck"),
])
def test_normal_forms(text: str, normal: str) -> None:
    assert normalize_location(text) == normal


def test_percent_signs_are_literal_as_spark_reports_paths_unescaped() -> None:
    # Measured with PySpark 4.2 (tests/integration/test_exactness.py): "check points" stays as is.
    assert normalize_location("file:/ck/my%20job") == "file:/ck/my%20job"
    assert same_location("file:/tmp/check points/gen-1-ab12cd34", "/tmp/check points/gen-1-ab12cd34")
    assert not same_location("file:/tmp/check%20points/gen-1-ab12cd34", "/tmp/check points/gen-1-ab12cd34")


@pytest.mark.parametrize("recorded, handed_out, same", [
    ("file:/ckpt/orders/gen-2-ab12cd34", "/ckpt/orders/gen-2-ab12cd34", True),
    ("file:///ckpt/orders/gen-2-ab12cd34/", "/ckpt/orders/gen-2-ab12cd34", True),
    ("file:/ckpt/orders/gen-2-ab12cd34", "file:///ckpt//orders/gen-2-ab12cd34/", True),
    ("s3a://bucket/cp/gen-1-0011aabb", "s3a://bucket/cp/gen-1-0011aabb", True),
    # hdfs:/// is the default name node, which Spark names when it reports the location.
    ("hdfs://nn:8020/cp/gen-1-0011aabb", "hdfs:///cp/gen-1-0011aabb", True),
    ("hdfs://nn:8020/cp/gen-1-0011aabb", "hdfs://nn/cp/gen-1-0011aabb", True),
    # A plain path is on the default file system, whichever it is.
    ("hdfs://nn:8020/cp/gen-1-0011aabb", "/cp/gen-1-0011aabb", True),
    # A relative path is relative to a working directory: the absolute path ending with it.
    ("file:/home/me/ck/gen-1-0011aabb", "ck/gen-1-0011aabb", True),
    ("file:/home/me/xck/gen-1-0011aabb", "ck/gen-1-0011aabb", False),
    ("file:/ckpt/orders/gen-1-ab12cd34", "/ckpt/orders/gen-2-ab12cd34", False),
    ("file:/ckpt/copy-of-gen-2", "/ckpt/orders/gen-2-ab12cd34", False),
    # Copies elsewhere are other places, whatever the last directory is called (issue 20, case 7).
    ("file:/data/copy/gen-3-1a2b3c4d", "s3a://prod/ck/orders/gen-3-1a2b3c4d", False),
    ("s3a://backup/ck/orders/gen-3-1a2b3c4d", "s3a://prod/ck/orders/gen-3-1a2b3c4d", False),
    ("hdfs://other-nn:8020/ck/gen-3-1a2b3c4d", "hdfs://nn/ck/gen-3-1a2b3c4d", False),
    ("s3a://prod/ck/orders/gen-3-1a2b3c4d", "hdfs:///ck/orders/gen-3-1a2b3c4d", False),
    (None, "/ckpt/orders/gen-2-ab12cd34", False),
    ("", "/ckpt/orders/gen-2-ab12cd34", False),
])
def test_same_location(recorded: str | None, handed_out: str, same: bool) -> None:
    assert same_location(recorded, handed_out) is same


def test_a_copy_never_matches_the_generation_it_was_copied_from() -> None:
    live = GenerationRef(3, "s3a://prod/ck/orders/gen-3-1a2b3c4d", "q3")
    assert match_generation([live], checkpoint_location="file:/data/copy/gen-3-1a2b3c4d", query_id="q3",
                            query_seen_before=True) is None
    assert match_generation([live], checkpoint_location="s3a://prod/ck/orders/gen-3-1a2b3c4d/", query_id="q3",
                            query_seen_before=True) == live


def test_an_exact_match_wins_and_ambiguous_loose_matches_match_nothing() -> None:
    plain = GenerationRef(1, "/jobs/orders", "q1")
    local = GenerationRef(2, "file:///jobs/orders", "q2")
    assert match_generation([plain, local], checkpoint_location="file:/jobs/orders", query_id="q",
                            query_seen_before=True) == local
    on_hdfs = GenerationRef(3, "hdfs:///jobs/orders", None)
    # A plain path and hdfs:/// both could be hdfs://nn/jobs/orders: no way to tell, so neither.
    assert match_generation([plain, on_hdfs], checkpoint_location="hdfs://nn:8020/jobs/orders", query_id="q",
                            query_seen_before=True) is None


def test_roots_compare_as_locations() -> None:
    assert same_root("/ck/", "/ck") and same_root("file:///ck", "/ck") and same_root("s3a://b/ck/", "s3a://b/ck")
    assert same_root("hdfs:///ck", "hdfs://nn:8020/ck/") and same_root("/ck//orders", "file://localhost/ck/orders")
    assert not same_root("/ck", "/ck2") and not same_root("s3a://b/ck", "s3a://c/ck")
    # Two roots the caller wrote: a plain path is local, so naming other storage is a move.
    assert not same_root("/ck", "s3a://b/ck") and not same_root("/ck", "hdfs:///ck")


# ----------------------------------------------------------------------------- properties

_segment = st.text(alphabet="abcxyzABC019-_. %", min_size=1, max_size=8).filter(
    lambda s: s not in (".", "..") and s == s.strip())  # the whole location is stripped of surrounding blanks
_paths = st.lists(_segment, min_size=1, max_size=5)
_prefixes = st.sampled_from(["", "file:", "file://", "file://localhost", "hdfs://nn:8020", "hdfs://", "s3a://bkt"])


def _spell(prefix: str, segments: list[str], slashes: list[int], trailing: int) -> str:
    body = "".join("/" * n + s for n, s in zip(slashes, segments))
    return prefix + body + "/" * trailing


@given(_prefixes, _paths, st.lists(st.integers(1, 3), min_size=5, max_size=5), st.integers(0, 2))
def test_slashes_never_change_a_location(prefix: str, segments: list[str], slashes: list[int],
                                         trailing: int) -> None:
    tidy = _spell(prefix, segments, [1] * len(segments), 0)
    # Not the first: "file:" + "//x" names the authority x, as in any URI.
    messy = _spell(prefix, segments, [1, *slashes[1:]], trailing)
    assert parse_location(messy) == parse_location(tidy)
    assert same_root(messy, tidy)
    # Idempotent: the normal form is its own normal form.
    assert normalize_location(normalize_location(messy)) == normalize_location(messy)


@given(_paths)
def test_spark_reporting_a_local_path_is_the_path(segments: list[str]) -> None:
    path = "/" + "/".join(segments)
    reported = "file:" + path  # what Spark's resolvedCheckpointRoot prints for a local path
    assert same_location(reported, path) and same_location(reported, "file://" + path)


@given(_paths, _paths)
def test_different_paths_are_different_places(a: list[str], b: list[str]) -> None:
    pa, pb = parse_location("/" + "/".join(a)), parse_location("/" + "/".join(b))
    assert same_place(pa, pb) is (pa.path == pb.path)
    assert same_place(pa, pb) is same_place(pb, pa)
    # The same path on another file system named with its authority is a copy, not the place.
    assert not same_place(Location("s3a", "prod", pa.path), Location("s3a", "backup", pa.path))
