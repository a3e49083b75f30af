"""Record timestamps at many (partition, offset) pairs from one Fetch per leader, reading only headers.

Time lag needs, for each pipeline's position, the timestamp of the first record at or after it:
~10,000 offsets on 1,000 partitions for a platform's scrape. kafka-python's consumer answers that
by decoding every record of the fetched batches in pure Python (keys, values, headers, a
``ConsumerRecord`` each: ~50,000 records for 10,000 timestamps, most of a cold ``/metrics``). Here
the same answer comes from a ``Fetch`` request per leader sent together (as ``kafka/snapshot.py``
does for ``ListOffsets``), and the returned record batches are walked by their headers: a batch
that ends before the wanted offset is skipped by its length, and inside the one that holds it only
each record's length, timestamp delta and offset delta are read until the offset is passed.

Anything this walk does not handle is left to the caller's consumer path (``unanswered``): a
partition error (an offset below the log-start: the consumer then resets to the earliest record),
a message format before v2, a compression codec kafka-python has no decoder for here, or a wanted
offset the fetched bytes did not reach after ``rounds`` fetches. So the answer is the consumer's, only
cheaper; it goes through kafka-python's connection manager (TLS, SASL, versions are the client's).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

from offset_ledger.kafka.snapshot import topic_layout
from offset_ledger.rules.model import TopicPartition

# Last non-flexible Fetch version (11): topics by name, and kafka-python's encoder is cheaper on it.
FIRST_FETCH_VERSION = 4
LAST_NON_FLEXIBLE_FETCH = 11
_BATCH_HEADER = struct.Struct(">qiiBIhiqqqhii")  # v2 record batch header, 61 bytes
_CONTROL = 0x20
_LOG_APPEND_TIME = 0x08


def record_times_by_fetch(
    manager: Any, wanted: Mapping[tuple[str, int], list[int]], *,
    max_wait_ms: int = 20, partition_max_bytes: int = 64 * 1024, rounds: int = 4,
) -> tuple[dict[tuple[TopicPartition, int], int], dict[tuple[str, int], list[int]]]:
    """(found, unanswered): timestamps of the first record at or after each wanted offset, and what is left.

    ``wanted``: (topic, partition) -> offsets, sorted ascending. One Metadata request for the
    leaders, then the Fetch rounds, on the client's I/O thread (``manager.run``).
    """
    return manager.run(_answer, manager, wanted, max_wait_ms, partition_max_bytes, rounds)


async def _answer(manager: Any, wanted: Mapping[tuple[str, int], list[int]], max_wait_ms: int,
                  partition_max_bytes: int,
                  rounds: int) -> tuple[dict[tuple[TopicPartition, int], int], dict[tuple[str, int], list[int]]]:
    layout = await topic_layout(manager, sorted({t for t, _ in wanted}))
    return await _fetch_rounds(manager, wanted, layout.leaders, max_wait_ms, partition_max_bytes, rounds)


async def _fetch_rounds(manager: Any, wanted: Mapping[tuple[str, int], list[int]],
                        leaders: Mapping[int, Mapping[str, list[int]]], max_wait_ms: int, partition_max_bytes: int,
                        rounds: int) -> tuple[dict[tuple[TopicPartition, int], int], dict[tuple[str, int], list[int]]]:
    from kafka.protocol.consumer import FetchRequest

    _Topic = FetchRequest.FetchTopic
    _Partition = _Topic.FetchPartition
    leader_of = {(t, p): node for node, by_topic in leaders.items() for t, parts in by_topic.items() for p in parts}
    todo = {key: list(offsets) for key, offsets in wanted.items() if offsets}
    unanswered: dict[tuple[str, int], list[int]] = {}
    for key in [k for k in todo if k not in leader_of]:
        unanswered[key] = todo.pop(key)
    found: dict[tuple[TopicPartition, int], int] = {}
    fetch_at = {key: offsets[0] for key, offsets in todo.items()}
    for _ in range(rounds):
        if not todo:
            break
        by_node: dict[int, dict[str, list[Any]]] = {}
        for (topic, part), offset in fetch_at.items():
            if (topic, part) in todo:
                by_node.setdefault(leader_of[(topic, part)], {}).setdefault(topic, []).append(
                    _Partition(partition=part, fetch_offset=offset, partition_max_bytes=partition_max_bytes))
        pending = []
        for node, by_topic in by_node.items():
            request = FetchRequest(
                replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=0x7FFFFFFF, isolation_level=0,
                session_id=0, session_epoch=-1,
                topics=[_Topic(topic=t, partitions=parts) for t, parts in by_topic.items()],
                forgotten_topics_data=[], rack_id="",
                min_version=FIRST_FETCH_VERSION, max_version=LAST_NON_FLEXIBLE_FETCH)
            pending.append(manager.send(request, node_id=node))
        for future in pending:
            response = await future
            for topic in response.responses:
                for p in topic.partitions:
                    key = (topic.topic, p.partition_index)
                    offsets = todo.get(key)
                    if offsets is None:
                        continue
                    if p.error_code != 0:
                        unanswered[key] = todo.pop(key)
                        continue
                    data = p.records or b""
                    tp = TopicPartition(*key)
                    left, resume = walk(data, offsets, lambda o, ts, tp=tp: found.__setitem__((tp, o), ts))
                    if resume is None:  # cannot be read here (format, codec): the consumer's turn
                        unanswered[key] = todo.pop(key)
                    elif not left:
                        del todo[key]
                    elif fetch_at[key] >= p.high_watermark:
                        todo.pop(key)  # at or past the log-end: no such record yet, unknown as before
                    elif resume <= fetch_at[key]:
                        unanswered[key] = todo.pop(key)  # no progress (a batch over the byte limit)
                    else:
                        todo[key] = left
                        fetch_at[key] = resume
    for key, offsets in todo.items():
        unanswered[key] = offsets
    return found, unanswered


def walk(data: bytes, offsets: list[int], found: Any) -> tuple[list[int], int | None]:
    """Walk v2 record batches in ``data``, calling ``found(offset, timestamp)`` for each wanted offset
    answered. Returns (offsets left, the offset to fetch from next), or (offsets, None) when a
    batch cannot be read here. ``offsets`` sorted ascending."""
    i = 0
    pos = 0
    n = len(data)
    resume = offsets[0]
    while i < len(offsets) and pos + _BATCH_HEADER.size <= n:
        (base, length, _epoch, magic, _crc, attrs, last_delta, first_ts, max_ts,
         _pid, _pepoch, _seq, count) = _BATCH_HEADER.unpack_from(data, pos)
        end = pos + 12 + length
        if magic != 2:
            return offsets[i:], None
        if end > n:
            break  # a partial batch at the end of the fetch: the next round starts at it
        last = base + last_delta
        if offsets[i] > last or attrs & _CONTROL or count == 0:
            pos = end
            resume = last + 1
            continue
        codec = attrs & 0x07
        body = data[pos + _BATCH_HEADER.size:end] if codec == 0 else _decompress(codec, data[pos + _BATCH_HEADER.size:end])
        if body is None:
            return offsets[i:], None
        log_append = attrs & _LOG_APPEND_TIME
        j = 0
        for _ in range(count):
            rec_len, j = _varint(body, j)
            start = j
            j += 1  # attributes
            ts_delta, j = _varint(body, j)
            off_delta, j = _varint(body, j)
            offset = base + off_delta
            while i < len(offsets) and offsets[i] <= offset:
                found(offsets[i], max_ts if log_append else first_ts + ts_delta)
                i += 1
            if i == len(offsets):
                break
            j = start + rec_len
        pos = end
        resume = last + 1
    return offsets[i:], resume


def _varint(buf: bytes, j: int) -> tuple[int, int]:
    """A zigzag varint (Kafka's record fields) at ``j``: (value, next position)."""
    shift = 0
    raw = 0
    while True:
        b = buf[j]
        j += 1
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            return (raw >> 1) ^ -(raw & 1), j
        shift += 7


def _decompress(codec: int, payload: bytes) -> bytes | None:
    from kafka import codec as kcodec

    try:
        if codec == 1:
            return kcodec.gzip_decode(payload)
        if codec == 2 and kcodec.has_snappy():
            return kcodec.snappy_decode(payload)
        if codec == 3 and kcodec.has_lz4():
            return kcodec.lz4f_decode(payload)
        if codec == 4 and kcodec.has_zstd():
            return kcodec.zstd_decode(payload)
    except Exception:  # noqa: BLE001 - an undecodable batch is the consumer's to report
        return None
    return None
