"""The pure stateful-restart rule from literals: durations, T*, the next watermark, the rewind."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from offset_ledger.errors import InvalidRestartOptions, StatefulRestartRefused
from offset_ledger.rules.model import EARLIEST, TopicPartition
from offset_ledger.rules.stateful import (
    BatchFigures,
    WindowSpec,
    derive_delay_ms,
    from_ms,
    next_watermark_ms,
    parse_duration_ms,
    plan_rewind,
    to_ms,
)

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.mark.parametrize("text, ms", [
    ("10 seconds", 10_000), ("1 minute", 60_000), ("10 minutes", 600_000), ("10s", 10_000), ("5m", 300_000),
    ("1 hour", 3_600_000), ("interval 1 minute 30 seconds", 90_000), ("500 milliseconds", 500),
    (" 2 Days ", 172_800_000), (timedelta(seconds=3), 3_000), (1500, 1500),
])
def test_durations_as_spark_writes_them(text: object, ms: int) -> None:
    assert parse_duration_ms(text) == ms  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["", "ten seconds", "10", "10 parsecs", "0 seconds", "-5 s", "10 s x", True, None])
def test_bad_durations_are_clear_errors(text: object) -> None:
    with pytest.raises(InvalidRestartOptions):
        parse_duration_ms(text)  # type: ignore[arg-type]


def test_slide_longer_than_window_is_refused() -> None:
    with pytest.raises(InvalidRestartOptions, match="slide"):
        WindowSpec.parse("10 seconds", "20 seconds")


@pytest.mark.parametrize("window, slide, watermark_s, floor_s", [
    ("10 seconds", None, 25, 20),     # [20, 30) ends after 25: open; [10, 20) emitted
    ("10 seconds", None, 30, 30),     # [20, 30) ends at 30 <= W: emitted; [30, 40) is the first open
    ("10 seconds", None, 29.999, 20),
    ("10 seconds", "5 seconds", 27, 20),  # windows every 5 s: [15, 25) emitted, [20, 30) open
    ("10 seconds", "5 seconds", 25, 20),  # [15, 25) ends at W: emitted
    ("10 seconds", "5 seconds", 24, 15),
    ("1 minute", None, 0, 0),
])
def test_earliest_open_window(window: str, slide: str | None, watermark_s: float, floor_s: float) -> None:
    spec = WindowSpec.parse(window, slide)
    assert spec.earliest_open_start_ms(to_ms(at(watermark_s))) == to_ms(at(floor_s))


def test_next_watermark_is_the_max_event_time_minus_delay_or_the_reported_one() -> None:
    batches = [BatchFigures(0, from_ms(0), at(12)), BatchFigures(1, at(2), at(9)), BatchFigures(2, at(2), None)]
    # Batch 2 ran with 2 (= 12 - 10); the next batch uses max(2, 12 - 10) = 2 ... with delay 5: 7.
    assert next_watermark_ms(batches, 10_000) == to_ms(at(2))
    assert next_watermark_ms(batches, 5_000) == to_ms(at(7))


def test_delay_is_read_back_from_a_batch_whose_watermark_moved() -> None:
    batches = [BatchFigures(0, from_ms(0), at(12)), BatchFigures(1, at(2), at(19)), BatchFigures(2, at(9), at(20))]
    assert derive_delay_ms(batches) == 10_000
    assert derive_delay_ms([BatchFigures(0, from_ms(0), at(12))]) is None


def _ranges(**by_tp: tuple[int | None, int]) -> dict[TopicPartition, tuple[int | None, int]]:
    names = {"a0": A0, "a1": A1, "b0": B0}
    return {names[k]: v for k, v in by_tp.items()}


BATCHES = [
    BatchFigures(0, from_ms(0), at(9), _ranges(a0=(0, 10), a1=(0, 10))),
    BatchFigures(1, at(0), at(18), _ranges(a0=(10, 20), a1=(10, 20))),
    BatchFigures(2, at(8), at(27), _ranges(a0=(20, 30), a1=(20, 30))),
    BatchFigures(3, at(17), at(36), _ranges(a0=(30, 40), a1=(30, 40), b0=(None, 4))),
]
POSITIONS = {A0: 40, A1: 40, B0: 4}


def test_rewind_to_the_start_of_the_earliest_batch_that_saw_the_floor() -> None:
    rewind = plan_rewind(BATCHES, POSITIONS, WindowSpec.parse("10 seconds"), delay_ms=10_000)
    assert rewind is not None
    # W = max(17, 36 - 10) = 26 -> [20, 30) is open -> T* = 20; batch 2 (max 27) is the first to see it.
    assert rewind.watermark == at(26) and rewind.event_time_floor == at(20)
    assert rewind.first_batch_id == 2 and rewind.batches_reread == 2
    # b-0 first appeared in batch 3 without a start (a partition Spark discovered): from earliest.
    assert rewind.offsets == {A0: 20, A1: 20, B0: EARLIEST}
    assert rewind.records_reread == 40
    finding = rewind.finding("q")
    assert finding.kind == "state_rewind"
    assert "2026-01-01T00:00:20+00:00" in finding.message and "40 record(s)" in finding.message
    assert finding.details["first_batch_id"] == 2


def test_partitions_no_batch_read_keep_their_position_and_the_delay_can_be_derived() -> None:
    positions = {**POSITIONS, TopicPartition("c", 0): 7}
    rewind = plan_rewind(BATCHES, positions, WindowSpec.parse("10 seconds"), delay_ms=None)
    # derived from batch 3: its watermark 17 = 27 (the max before it) - 10 s; W = 36 - 10 -> T* = 20.
    assert rewind is not None and rewind.delay_derived and rewind.delay_ms == 10_000
    assert rewind.offsets[TopicPartition("c", 0)] == 7 and rewind.offsets[A0] == 20


def test_sliding_window_rewinds_further() -> None:
    rewind = plan_rewind(BATCHES, POSITIONS, WindowSpec.parse("10 seconds", "5 seconds"), delay_ms=10_000)
    assert rewind is not None
    # W = 26: [15, 25) emitted, [20, 30) open -> T* = 20 (batch 2); with delay 12: W = 24 -> T* = 15 (batch 1).
    assert rewind.event_time_floor == at(20)
    deeper = plan_rewind(BATCHES, POSITIONS, WindowSpec.parse("10 seconds", "5 seconds"), delay_ms=12_000)
    assert deeper is not None and deeper.event_time_floor == at(15) and deeper.first_batch_id == 1
    assert deeper.offsets[A0] == 10


def test_nothing_late_enough_keeps_positions() -> None:
    batches = [BatchFigures(0, from_ms(0), at(9), _ranges(a0=(0, 10))), BatchFigures(1, at(0), None, _ranges(a0=(10, 10)))]
    rewind = plan_rewind(batches, {A0: 10}, WindowSpec.parse("10 seconds"), delay_ms=0)
    # W = 9 -> T* = 0 -> batch 0 saw 9 >= 0: rewind to 0.
    assert rewind is not None and rewind.offsets == {A0: 0}
    later = plan_rewind(batches, {A0: 10}, WindowSpec.parse("5 seconds"), delay_ms=0)
    # W = 9 -> T* = 5; batch 0 max 9 >= 5 -> still batch 0.
    assert later is not None and later.first_batch_id == 0


def test_kafka_timestamp_offsets_are_tighter() -> None:
    rewind = plan_rewind(BATCHES, POSITIONS, WindowSpec.parse("10 seconds"), delay_ms=10_000,
                         offsets_for_floor={A0: 23, A1: None, B0: 1})
    assert rewind is not None and rewind.offsets == {A0: 23, A1: 40, B0: 1}
    assert rewind.records_reread == 17 + 0 + 3


def test_no_watermark_recorded_is_none_and_an_underivable_delay_is_refused() -> None:
    assert plan_rewind([BatchFigures(0, None, None, _ranges(a0=(0, 1)))], {A0: 1}, WindowSpec.parse("1 minute"),
                       delay_ms=None) is None
    with pytest.raises(StatefulRestartRefused, match="watermark_delay"):
        plan_rewind([BatchFigures(0, from_ms(0), at(3), _ranges(a0=(0, 1)))], {A0: 1},
                    WindowSpec.parse("1 minute"), delay_ms=None, pipeline="p")


@pytest.mark.parametrize("argv, fragment", [
    (["resolve", "p", "--topic", "t", "--window", "ten minutes"], "window"),
    (["resolve", "p", "--topic", "t", "--window", "10s", "--slide", "20s"], "slide"),
    (["resolve", "p", "--topic", "t", "--window", "10s", "--watermark-delay", "0s"], "--watermark-delay"),
    (["resolve", "p", "--topic", "t", "--slide", "5s"], "--window"),
])
def test_cli_bad_window_options_exit_2_before_connecting(argv: list[str], fragment: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from offset_ledger.cli.main import main

    with pytest.raises(SystemExit) as info:
        main([*argv, "--dsn", "postgresql+psycopg2://nobody@127.0.0.1:1/none", "--bootstrap-servers", "127.0.0.1:1"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err


def test_a_pruned_start_of_history_is_refused_not_started_later() -> None:
    # Batches 0 and 1 were pruned: batch 2 is the oldest the ledger has, and it is needed.
    with pytest.raises(StatefulRestartRefused, match="batches 0-1 are not in the ledger"):
        plan_rewind(BATCHES[2:], POSITIONS, WindowSpec.parse("10 seconds"), delay_ms=10_000)
    # Pruned below a batch known to end under the floor: that batch proves nothing earlier is needed.
    rewind = plan_rewind(BATCHES[1:], POSITIONS, WindowSpec.parse("10 seconds"), delay_ms=10_000)
    assert rewind is not None and rewind.first_batch_id == 2


def test_a_missing_batch_between_the_needed_ones_is_refused() -> None:
    with pytest.raises(StatefulRestartRefused, match=r"lacks batch\(es\) 1-1"):
        plan_rewind([BATCHES[0], BATCHES[2], BATCHES[3]], POSITIONS, WindowSpec.parse("10 seconds"), delay_ms=10_000)


def test_a_batch_of_unknown_event_time_is_read_again_rather_than_skipped() -> None:
    # Batch 1 was read back from the checkpoint (no eventTime): it may hold open windows' records.
    unknown = BatchFigures(1, None, None, _ranges(a0=(10, 20), a1=(10, 20)))
    rewind = plan_rewind([BATCHES[0], unknown, *BATCHES[2:]], POSITIONS, WindowSpec.parse("10 seconds"),
                         delay_ms=10_000)
    assert rewind is not None and rewind.first_batch_id == 1
    assert rewind.offsets[A0] == 10 and rewind.offsets[A1] == 10


def test_a_stored_floor_is_never_lowered() -> None:
    # The batches after a stateful restart say little (all below the floor were dropped): the floor holds.
    later = [BatchFigures(0, from_ms(0), None, _ranges(a0=(40, 41), a1=(40, 41)))]
    rewind = plan_rewind(later, {A0: 41, A1: 41}, WindowSpec.parse("10 seconds"), delay_ms=10_000,
                         floor_at_least=at(20))
    assert rewind is not None and rewind.event_time_floor == at(20)
    assert rewind.offsets == {A0: 41, A1: 41} and rewind.first_batch_id is None
