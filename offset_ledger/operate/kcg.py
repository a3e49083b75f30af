"""kafka-consumer-groups' file formats and durations, pure: ``--from-file`` CSV in, ``--export`` CSV
out, ``--by-duration`` text to a timedelta.

KCG exports ``topic,partition,offset`` lines without a header; ``--from-file`` reads those, and
also a first line that names the columns (what a spreadsheet adds). Offsets are next offsets to
read, exactly what KCG writes and what the ledger stores.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable
from datetime import timedelta

from offset_ledger.errors import InvalidInput
from offset_ledger.rules.model import TopicPartition
from offset_ledger.rules.resets import PartitionReset, parse_partition_key, validate_offset

_ISO_DURATION = re.compile(
    r"^P(?:(?P<d>\d+(?:\.\d+)?)D)?(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?"
    r"(?:(?P<s>\d+(?:\.\d+)?)S)?)?$", re.IGNORECASE)
_SHORT_DURATION = re.compile(r"^(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[dhms])$", re.IGNORECASE)
_UNITS = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}


def parse_offsets_csv(text: str, *, source: str) -> dict[TopicPartition, int]:
    """``topic,partition,offset`` lines (KCG's export; an optional header line) -> offsets."""
    from offset_ledger.operate.inputs import check_topic

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


def parse_duration(text: str) -> timedelta:
    """``--by-duration``: KCG's ISO 8601 form (``PT10M``, ``P1DT2H``) or a short one (``10m``, ``2h``)."""
    raw = text.strip()
    found = _ISO_DURATION.match(raw)
    if found and raw.upper() not in ("P", "PT") and any(found.groupdict().values()):
        parts = {k: float(v) for k, v in found.groupdict().items() if v}
        value = timedelta(days=parts.get("d", 0), hours=parts.get("h", 0), minutes=parts.get("m", 0),
                          seconds=parts.get("s", 0))
    else:
        short = _SHORT_DURATION.match(raw)
        if not short:
            raise InvalidInput(f"invalid --by-duration {text[:40]!r}: use ISO 8601 (PT10M, P1DT2H) or 10m, 2h, 1d",
                               duration=text[:40])
        value = timedelta(**{_UNITS[short.group("unit").lower()]: float(short.group("n"))})
    if value <= timedelta(0):
        raise InvalidInput(f"invalid --by-duration {text[:40]!r}: must be longer than zero", duration=text[:40])
    return value
