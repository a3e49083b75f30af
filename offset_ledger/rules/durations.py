"""One duration grammar for every option, variable and API field (issue 34, item 8).

Accepted, case-insensitive, always longer than zero:

- ISO 8601, what kafka-consumer-groups' ``--by-duration`` takes: ``PT30M``, ``P30D``, ``P1DT2H``,
  ``P2W``, ``PT0.5S``;
- a number and a unit, as operators and Spark write them: ``30m``, ``10min``, ``10 minutes``,
  ``12h``, ``30d``, ``500ms``, ``2w``, ``1.5h``, several parts (``1h30m``, ``1 minute 30 seconds``)
  and Spark's ``interval 5 minutes``.

Units: ms (msec, millisecond), s (sec, second), m (min, minute), h (hr, hour), d (day), w (week),
each with its plural. A bare number is refused: "30" means nothing without a unit.
"""

from __future__ import annotations

import re
from datetime import timedelta

from offset_ledger.errors import InvalidDuration

_UNIT_SECONDS = {
    **dict.fromkeys(("ms", "msec", "msecs", "millisecond", "milliseconds"), 0.001),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3_600),
    **dict.fromkeys(("d", "day", "days"), 86_400),
    **dict.fromkeys(("w", "wk", "wks", "week", "weeks"), 604_800),
}
_NUMBER = r"\d+(?:\.\d+)?"
_ISO = re.compile(
    rf"^P(?:(?P<w>{_NUMBER})W)?(?:(?P<d>{_NUMBER})D)?"
    rf"(?:T(?:(?P<h>{_NUMBER})H)?(?:(?P<m>{_NUMBER})M)?(?:(?P<s>{_NUMBER})S)?)?$")
_PART = re.compile(rf"\s*({_NUMBER})\s*([a-z]+)\s*")
_ISO_SECONDS = {"w": 604_800, "d": 86_400, "h": 3_600, "m": 60, "s": 1}

#: What every error says the grammar is.
GRAMMAR = "ISO 8601 (PT30M, P30D) or a number and unit (30m, 10min, 10 minutes, 12h, 30d)"


def parse_duration(text: str | int | float | timedelta, name: str = "duration") -> timedelta:
    """``text`` as a timedelta > 0; InvalidDuration naming ``name`` (the option, variable or field) otherwise.

    A timedelta passes as it is and a number is seconds (what Python callers hand in).
    """
    if isinstance(text, timedelta):
        value = text
    elif isinstance(text, (int, float)) and not isinstance(text, bool):
        value = timedelta(seconds=text)
    elif isinstance(text, str):
        value = _parse_text(text, name)
    else:
        raise InvalidDuration(repr(text), name)
    if value <= timedelta(0):
        raise InvalidDuration(str(text), name, "must be longer than zero")
    return value


def parse_duration_ms(text: str | int | float | timedelta, name: str = "duration") -> int:
    """``parse_duration`` in whole milliseconds (an int is milliseconds here, as Spark's APIs take them)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise InvalidDuration(str(text), name, "must be longer than zero")
        return text
    return round(parse_duration(text, name).total_seconds() * 1000)


def _parse_text(text: str, name: str) -> timedelta:
    raw = text.strip()
    iso = _ISO.match(raw.upper())
    if iso and raw.upper() not in ("P", "PT") and not raw.upper().endswith("T") and any(iso.groupdict().values()):
        return timedelta(seconds=sum(float(v) * _ISO_SECONDS[k] for k, v in iso.groupdict().items() if v))
    body = raw.lower()
    body = body[len("interval"):] if body.startswith("interval") else body
    parts = _PART.findall(body)
    if not parts or _PART.sub("", body) != "":
        raise InvalidDuration(text, name)
    seconds = 0.0
    for amount, unit in parts:
        if unit not in _UNIT_SECONDS:
            raise InvalidDuration(text, name, f"unknown unit {unit!r}; use {GRAMMAR}")
        seconds += float(amount) * _UNIT_SECONDS[unit]
    return timedelta(seconds=seconds)
