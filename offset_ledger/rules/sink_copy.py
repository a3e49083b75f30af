"""Pure: rows as PostgreSQL ``COPY ... FROM STDIN`` text lines (the executors' staging format).

Text format, not CSV: ``\\N`` is NULL and nothing else is, so an empty string stays an empty string.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

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


def copy_line(values: Iterable[Any]) -> str:
    """One row as a COPY text line, newline included."""
    return "\t".join(copy_value(v) for v in values) + "\n"


def quote_ident(name: str) -> str:
    """A SQL identifier, quoted (``schema.table`` is split on its first dot and each part quoted)."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in name.split(".", 1))
