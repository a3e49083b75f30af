"""Pure: rows as PostgreSQL ``COPY ... FROM STDIN`` text lines (the executors' staging format).

Text format, not CSV: ``\\N`` is NULL and nothing else is, so an empty string stays an empty string.

Spark ``timestamp`` (an instant) columns arrive here as Spark's own microseconds since the epoch
(``unix_micros``), never as PySpark's datetimes: PySpark turns an instant into a *naive* datetime
in the Python worker's local time zone, so an executor in Europe/Berlin would hand over ``02:30``
for both 00:30Z and 01:30Z of 2026-10-25, and the COPY text would carry no offset. They are
written as UTC with an explicit ``+00:00``. ``timestamp_ntz`` columns are wall clock (PySpark
converts them without the local zone) and stay offset-free. A struct, array or map column holding
a ``timestamp`` arrives as the JSON text Spark rendered (``sinks.staging.NESTED_JSON``: instants in
UTC with their offset) and is written as the string it is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})


def copy_value(value: Any) -> str:
    """One value in COPY text format (already escaped)."""
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    if isinstance(value, (int, Decimal)):
        return str(value)
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "\\\\x" + bytes(value).hex()
    if isinstance(value, (dict, list, tuple)):
        # Spark's Row is a tuple with field names: a struct becomes a JSON object.
        as_dict = getattr(value, "asDict", None)
        doc = as_dict(recursive=True) if callable(as_dict) else value
        return json.dumps(doc, default=str, separators=(",", ":")).translate(_ESCAPES)
    return str(value).translate(_ESCAPES)


def copy_instant(micros: int | None) -> str:
    """A Spark ``timestamp`` given as microseconds since the epoch, as a UTC instant (``...+00:00``)."""
    if micros is None:
        return "\\N"
    return (_EPOCH + timedelta(microseconds=int(micros))).isoformat()


def copy_line(values: Iterable[Any], instants: frozenset[int] = frozenset()) -> str:
    """One row as a COPY text line, newline included; the fields at ``instants`` are epoch microseconds."""
    return "\t".join(copy_instant(v) if i in instants else copy_value(v) for i, v in enumerate(values)) + "\n"


def quote_ident(name: str) -> str:
    """A SQL identifier, quoted (``schema.table`` is split on its first dot and each part quoted)."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in name.split(".", 1))
