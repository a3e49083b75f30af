"""The failover's pure parts: MM2 checkpoint records, topic names by replication policy, the plan."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offset_ledger.errors import ConfigError, FailoverRefused, InvalidInput, KafkaError
from offset_ledger.rules.failover import (
    FailoverRequest,
    Mm2Checkpoint,
    checkpoints_topic,
    decode_checkpoint,
    encode_checkpoint,
    failover_findings,
    latest_checkpoints,
    plan_failover,
    returns_home,
    target_topic,
    with_time_spans,
)
from offset_ledger.rules.model import TopicPartition, Watermarks

TP = TopicPartition


def test_a_record_laid_out_by_hand_as_mm2_writes_it() -> None:
    # Checkpoint.KEY_SCHEMA: group STRING, topic STRING, partition INT32; value: version INT16
    # header, then upstreamOffset INT64, offset INT64, metadata STRING (all big-endian).
    key = b"\x00\x03etl" + b"\x00\x0eprimary.orders" + b"\x00\x00\x00\x02"
    value = b"\x00\x00" + struct.pack(">q", 1200) + struct.pack(">q", 1190) + b"\x00\x02{}"
    cp = decode_checkpoint(key, value)
    assert cp == Mm2Checkpoint("etl", "primary.orders", 2, 1200, 1190, "{}")
    assert encode_checkpoint(cp) == (key, value)


def test_an_unknown_version_is_an_error_not_a_guess() -> None:
    key, value = encode_checkpoint(Mm2Checkpoint("g", "t", 0, 1, 1, ""))
    with pytest.raises(KafkaError, match="version 1 is unknown"):
        decode_checkpoint(key, b"\x00\x01" + value[2:])


@pytest.mark.parametrize("cut", [1, 5, 12, 19, 21])
def test_truncated_values_are_errors(cut: int) -> None:
    key, value = encode_checkpoint(Mm2Checkpoint("g", "t", 0, 10, 9, "meta"))
    with pytest.raises(KafkaError):
        decode_checkpoint(key, value[:cut])


def test_truncated_keys_are_errors() -> None:
    key, value = encode_checkpoint(Mm2Checkpoint("group", "topic", 3, 10, 9, ""))
    with pytest.raises(KafkaError):
        decode_checkpoint(key[:-1], value)


@given(st.text(max_size=40), st.text(min_size=1, max_size=60), st.integers(0, 2**31 - 1),
       st.integers(-1, 2**63 - 1), st.integers(-1, 2**63 - 1), st.text(max_size=200))
def test_records_round_trip(group: str, topic: str, partition: int, up: int, down: int, meta: str) -> None:
    cp = Mm2Checkpoint(group, topic, partition, up, down, meta)
    assert decode_checkpoint(*encode_checkpoint(cp)) == cp


def test_the_last_checkpoint_of_the_group_wins() -> None:
    records = [Mm2Checkpoint("a", "p.t", 0, 5, 5), Mm2Checkpoint("b", "p.t", 0, 9, 9),
               Mm2Checkpoint("a", "p.t", 0, 7, 6), Mm2Checkpoint("a", "p.t", 1, 3, 3)]
    assert latest_checkpoints(records, "a") == {TP("p.t", 0): records[2], TP("p.t", 1): records[3]}


def test_topic_names_by_policy() -> None:
    assert checkpoints_topic("primary") == "primary.checkpoints.internal"
    assert target_topic("orders", source_alias="primary") == "primary.orders"
    assert target_topic("orders", source_alias="primary", policy="identity") == "orders"
    assert target_topic("orders", source_alias="dc1", separator="_") == "dc1_orders"
    # failing back: a topic that came from the target maps to its original name
    assert target_topic("primary.orders", source_alias="backup", target_alias="primary") == "orders"
    assert target_topic("primary.orders", source_alias="backup") == "backup.primary.orders"
    with pytest.raises(InvalidInput):
        target_topic("orders", source_alias="p", policy="custom")  # type: ignore[arg-type]


def _wm(start: int, end: int) -> Watermarks:
    return Watermarks(start, end)


def test_translated_partitions_start_at_the_checkpoint_and_say_the_gap() -> None:
    plan = plan_failover(
        {TP("orders", 0): 100, TP("orders", 1): 50},
        {TP("primary.orders", 0): Mm2Checkpoint("g", "primary.orders", 0, 90, 88),
         TP("primary.orders", 1): Mm2Checkpoint("g", "primary.orders", 1, 50, 50)},
        {TP("primary.orders", 0): _wm(0, 120), TP("primary.orders", 1): _wm(0, 50),
         TP("primary.orders", 2): _wm(0, 7)},
        {"orders": "primary.orders"})
    assert plan.starting_offsets == {"primary.orders": {"0": 88, "1": 50, "2": 0}}
    p0, p1, p2 = plan.partitions
    assert (p0.status, p0.behind_checkpoint, p0.reread_max) == ("translated", 10, 32)
    assert (p1.behind_checkpoint, p1.reread_max) == (0, 0)
    assert (p2.status, p2.reread_max) == ("new_partition", 7)
    assert plan.reread_max == 39 and not plan.problems


@pytest.mark.parametrize("cp,wm,reason", [
    (None, _wm(0, 10), "no_checkpoint"),
    (Mm2Checkpoint("g", "primary.t", 0, 12, 12), _wm(0, 20), "checkpoint_ahead"),
    (Mm2Checkpoint("g", "primary.t", 0, 8, 3), _wm(5, 20), "below_log_start"),
    (Mm2Checkpoint("g", "primary.t", 0, 8, 30), _wm(0, 20), "beyond_log_end"),
])
def test_unsafe_partitions_fail_loudly_or_start_at_the_log_start(cp: Mm2Checkpoint | None, wm: Watermarks,
                                                                  reason: str) -> None:
    ledger = {TP("t", 0): 10}
    cps = {} if cp is None else {TP("primary.t", 0): cp}
    with pytest.raises(FailoverRefused, match=reason) as info:
        plan_failover(ledger, cps, {TP("primary.t", 0): wm}, {"t": "primary.t"})
    assert info.value.details["problems"][0]["partition"] == 0
    plan = plan_failover(ledger, cps, {TP("primary.t", 0): wm}, {"t": "primary.t"}, uncheckpointed="earliest")
    assert plan.starting_offsets == {"primary.t": {"0": wm.log_start_offset}}
    assert plan.problems[0].reason == reason
    assert plan.partitions[0].reread_max == wm.log_end_offset - wm.log_start_offset
    kinds = [f.kind for f in failover_findings(plan, source_alias="primary", target_bootstrap="b:1",
                                              target_cluster_id="B", source_cluster_id=None)]
    assert kinds == ["failover", "failover"]


def test_missing_topics_and_partitions_are_refused() -> None:
    with pytest.raises(FailoverRefused, match="primary.t"):
        plan_failover({TP("t", 0): 1}, {}, {}, {"t": "primary.t"})
    with pytest.raises(FailoverRefused, match="t:1"):
        plan_failover({TP("t", 0): 1, TP("t", 1): 1}, {TP("primary.t", 0): Mm2Checkpoint("g", "primary.t", 0, 1, 1)},
                      {TP("primary.t", 0): _wm(0, 1)}, {"t": "primary.t"}, uncheckpointed="earliest")
    with pytest.raises(InvalidInput):
        plan_failover({}, {}, {}, {}, uncheckpointed="latest")  # type: ignore[arg-type]


def test_time_spans_and_the_summary_finding() -> None:
    plan = plan_failover({TP("t", 0): 10}, {TP("p.t", 0): Mm2Checkpoint("g", "p.t", 0, 8, 8)},
                         {TP("p.t", 0): _wm(0, 12)}, {"t": "p.t"})
    plan = with_time_spans(plan, {TP("p.t", 0): 1_000}, {TP("p.t", 0): 4_500})
    (summary,) = failover_findings(plan, source_alias="p", target_bootstrap="b:1", target_cluster_id="B",
                                   source_cluster_id="A")
    assert "at most 4 record(s)" in summary.message and "3.5 s" in summary.message
    assert summary.details["partitions"][0]["rereadFromMs"] == 1_000
    assert summary.details["target_cluster_id"] == "B"


# The property the whole feature stands on: whatever MM2 translated, a start never lies past what
# the ledger read (no record skipped), and the re-read bound covers every record between the start
# and the ledger's position on the target.
@given(st.data())
def test_no_record_is_skipped_and_the_bound_holds(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 4))
    ledger, cps, wms, replica_of_ledger = {}, {}, {}, {}
    for p in range(n):
        # A backup log: upstream offsets 0..end replicated 1:1 at downstream offset + shift (what
        # MM2 writes after the backup's own earlier records), some of it already on the backup.
        shift = data.draw(st.integers(0, 50))
        end = data.draw(st.integers(0, 200))
        u = data.draw(st.integers(0, end))  # the ledger's position, replicated
        # retention on the backup, but not past what the ledger had read (that would be data loss)
        log_start = data.draw(st.integers(0, shift + u))
        ledger[TP("t", p)] = u
        wms[TP("p.t", p)] = Watermarks(log_start, shift + end)
        replica_of_ledger[p] = shift + u
        if data.draw(st.booleans()):
            c = data.draw(st.integers(0, end))  # the group offset MM2 saw (maybe ahead: a foreign commit)
            slack = data.draw(st.integers(0, c))  # MM2's conservative translation
            cps[TP("p.t", p)] = Mm2Checkpoint("g", "p.t", p, c, shift + c - slack)
    try:
        plan = plan_failover(ledger, cps, wms, {"t": "p.t"}, uncheckpointed=data.draw(st.sampled_from(
            ["fail", "earliest"])))
    except FailoverRefused:
        return
    for part in plan.partitions:
        replica = replica_of_ledger[part.partition]
        assert part.start_next_offset <= replica  # nothing the ledger did not read is skipped
        assert replica - part.start_next_offset <= part.reread_max
        assert wms[TP("p.t", part.partition)].log_start_offset <= part.start_next_offset


def test_a_topic_returns_home_only_by_the_default_policys_prefix_of_the_target_alias() -> None:
    assert returns_home("primary.orders", target_alias="primary")
    assert returns_home("primary_orders", target_alias="primary", separator="_")
    assert not returns_home("primary.orders", target_alias="backup")
    assert not returns_home("primary.orders", target_alias=None)
    assert not returns_home("primary.", target_alias="primary")
    assert not returns_home("primary.orders", target_alias="primary", policy="identity")  # names carry no origin


def test_a_returning_topic_never_takes_mm2s_translation() -> None:
    """Failing back: with or without a checkpoint, the partition is not_translated_back (never a silent start)."""
    ledger = {TP("primary.orders", 0): 25, TP("primary.orders", 1): 25}
    marks = {TP("orders", 0): Watermarks(0, 29), TP("orders", 1): Watermarks(0, 28)}
    cps = {TP("orders", 0): Mm2Checkpoint("g", "orders", 0, 25, 27)}
    with pytest.raises(FailoverRefused) as exc:
        plan_failover(ledger, cps, marks, {"primary.orders": "orders"}, returning={"primary.orders"})
    assert "failing back" in exc.value.message and "primary.orders:0, primary.orders:1" in exc.value.message
    plan = plan_failover(ledger, cps, marks, {"primary.orders": "orders"}, returning={"primary.orders"},
                         uncheckpointed="earliest")
    assert plan.starting_offsets == {"orders": {"0": 0, "1": 0}} and plan.reread_max == 57
    assert [x.reason for x in plan.problems] == ["not_translated_back"] * 2
    # Not returning: the same checkpoint is an ordinary translation.
    plan = plan_failover(ledger, cps, marks, {"primary.orders": "orders"}, uncheckpointed="earliest")
    assert plan.starting_offsets == {"orders": {"0": 27, "1": 0}}


@pytest.mark.parametrize(("given", "error", "option"), [
    ({"to_bootstrap": " "}, ConfigError, "to_bootstrap"),
    ({"source_alias": ""}, ConfigError, "source_alias"),
    ({"replication_policy": "mirror"}, InvalidInput, "replication_policy"),
    ({"separator": ""}, InvalidInput, "separator"),
    ({"uncheckpointed": "latest"}, InvalidInput, "uncheckpointed"),
    ({"topics": []}, InvalidInput, "topics"),
    ({"topics": "orders"}, InvalidInput, "topics"),
])
def test_a_failover_request_names_the_argument_it_refuses(given: dict, error: type, option: str) -> None:
    with pytest.raises(error) as exc:
        FailoverRequest(**{"to_bootstrap": "backup:9092", **given})
    assert exc.value.details["option"] == option


def test_a_failover_request_holds_its_topics_as_a_tuple_and_names_them_by_its_policy() -> None:
    request = FailoverRequest("backup:9092", target_alias="backup", topics=["orders", "backup.audit"])  # type: ignore[arg-type]
    assert request.topics == ("orders", "backup.audit")
    assert [request.target_topic(t) for t in request.topics] == ["primary.orders", "audit"]
    assert [request.returns_home(t) for t in request.topics] == [False, True]
    identity = FailoverRequest("backup:9092", replication_policy="identity", separator="")  # no separator needed
    assert identity.target_topic("orders") == "orders"
