"""``kafka.record_times.walk`` against kafka-python's own record decoding (the oracle) on built batches."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

from offset_ledger.kafka.record_times import walk


@st.composite
def log(draw):  # type: ignore[no-untyped-def]
    """Record batches as a broker returns them: base offsets set, some compressed (gzip), some with
    log-append time, some control batches, offsets with gaps (compaction), maybe cut short."""
    out = bytearray()
    base = draw(st.integers(0, 1000))
    for _ in range(draw(st.integers(0, 5))):
        codec = draw(st.sampled_from([0, 1]))
        control = draw(st.integers(0, 5)) == 0
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=control,
                                            producer_id=7 if control else -1, producer_epoch=0 if control else -1,
                                            base_sequence=-1, batch_size=1 << 20)
        delta = 0
        ts0 = draw(st.integers(1_600_000_000_000, 1_700_000_000_000))
        for _ in range(draw(st.integers(1, 8))):
            builder.append(delta, ts0 + draw(st.integers(-5_000, 5_000)), None,
                           b"v" * draw(st.integers(0, 300)), [])
            delta += draw(st.integers(1, 3))
        raw = builder.build()
        struct.pack_into(">q", raw, 0, base)  # the broker sets the base offset (outside the CRC)
        attrs = struct.unpack_from(">h", raw, 21)[0]
        if control:
            attrs |= 0x20
        if draw(st.booleans()):
            attrs |= 0x08  # log-append time: every record carries the batch's max timestamp
        struct.pack_into(">h", raw, 21, attrs)
        out += raw
        base += delta + draw(st.integers(0, 2))
    cut = draw(st.integers(0, len(out))) if draw(st.booleans()) else len(out)
    return bytes(out[:cut])


def oracle(data: bytes) -> tuple[list[tuple[int, int]], int | None]:
    """(offset, timestamp) of every data record in the complete batches, and the offset after them."""
    records = MemoryRecords(data)
    out, after = [], None
    while (batch := records.next_batch()) is not None:
        after = batch.base_offset + batch.last_offset_delta + 1
        if batch.is_control_batch:
            continue
        out += [(r.offset, r.timestamp) for r in batch]
    return out, after


@settings(max_examples=300, deadline=None)
@given(log(), st.lists(st.integers(0, 1100), min_size=1, max_size=12, unique=True))
def test_walk_answers_the_first_record_at_or_after_each_offset(data: bytes, wanted: list[int]) -> None:
    wanted.sort()
    records, after = oracle(data)
    found: dict[int, int] = {}
    left, resume = walk(data, wanted, found.__setitem__)
    expected = {}
    for o in wanted:
        hit = next((r for r in records if r[0] >= o), None)
        if hit is not None:
            expected[o] = hit[1]
    assert found == expected
    assert left == [o for o in wanted if o not in expected]
    if left:  # the next fetch starts after the last complete batch (or where this one started)
        assert resume == (after if after is not None else wanted[0])
