"""kafka-consumer-groups' file formats, pure: ``--from-file`` CSV in, ``--export`` CSV out
(``--by-duration`` is parsed by the one duration grammar, ``offset_ledger.rules.durations``).

KCG exports ``topic,partition,offset`` lines without a header; ``--from-file`` reads those, and
also a first line that names the columns (what a spreadsheet adds). Offsets are next offsets to
read, exactly what KCG writes and what the ledger stores.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable

from offset_ledger.errors import InvalidInput
from offset_ledger.operate.inputs import check_topic
from offset_ledger.rules.model import TopicPartition
from offset_ledger.rules.resets import PartitionReset, parse_partition_key, validate_offset



def parse_offsets_csv(text: str, *, source: str) -> dict[TopicPartition, int]:
    """``topic,partition,offset`` lines (KCG's export; an optional header line) -> offsets."""
    out: dict[TopicPartition, int] = {}
    rows = [r for r in csv.reader(io.StringIO(text)) if any(cell.strip() for cell in r)]
    if rows and [c.strip().lower() for c in rows[0]][:2] == ["topic", "partition"]:
        rows = rows[1:]
    if not rows:
        raise InvalidInput(f"{source}: no offsets; expected lines of topic,partition,offset")
    for number, row in enumerate(rows, 1):
        if len(row) != 3:
            raise InvalidInput(f"{source}: row {number} has {len(row)} fields; expected topic,partition,offset",
                               row=number)
        topic, partition_text, offset_text = (c.strip() for c in row)
        check_topic(topic)
        partition = parse_partition_key(topic, partition_text)
        try:
            offset = int(offset_text)
        except ValueError:
            raise InvalidInput(f"{source}: row {number}: offset {offset_text[:40]!r} is not an integer",
                               row=number) from None
        tp = TopicPartition(topic, partition)
        if tp in out:
            raise InvalidInput(f"{source}: {topic}:{partition} appears twice", row=number)
        out[tp] = validate_offset(topic, partition, offset)
    return out


def export_csv(partitions: Iterable[PartitionReset]) -> str:
    """The plan's targets as KCG's export (``topic,partition,offset``, no header)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for p in sorted(partitions, key=lambda x: (x.topic, x.partition)):
        writer.writerow([p.topic, p.partition, p.target_next_offset])
    return buffer.getvalue()
