"""What operators type, checked and parsed: names, topics, timestamps, history cursors, reset scopes.

Every function raises ``InvalidInput`` (HTTP 400, CLI exit 2) with a specific message and never
touches the ledger or Kafka.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from offset_ledger.errors import InvalidInput
from offset_ledger.operate.answers import iso_utc
from offset_ledger.rules.resets import ResetRequest, parse_offsets_body

MAX_NAME = 255
#: The largest value a BIGINT column holds: numbers from input are checked against it before SQL.
MAX_BIGINT = 2**63 - 1
# Every page size, everywhere: the CLI's --limit (history, findings, resets), the API's limit, the
# console's pages. One constant, so no command refuses what another (or the docs) accepts.
MAX_LIMIT = 1000


def check_limit(limit: int, name: str = "limit") -> int:
    """``limit`` in 1..MAX_LIMIT, refused under ``name`` (the CLI says ``--limit``)."""
    if isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"{name} must be between 1 and {MAX_LIMIT}, not {limit}", limit=limit)
    return limit
# Kafka's own rule for topic names (kafka.common.internals.Topic): legal characters, at most 249,
# and not "." or ".." (spelled without a lookahead: it is also the API's JSON-schema pattern).
_TOPIC_NAME = re.compile(r"^([a-zA-Z0-9_-]|[a-zA-Z0-9._-][a-zA-Z0-9_-]|[a-zA-Z0-9_-]\.|[a-zA-Z0-9._-]{3,249})$")
#: The same rules as JSON-schema patterns, for the API's parameters (documented, and checked there first).
NAME_PATTERN = r"^[^\x00-\x1f\x7f]{1,255}$"
TOPIC_PATTERN = _TOPIC_NAME.pattern
# Control characters, and lone surrogates (valid in JSON, not storable as UTF-8).
_CONTROL = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


def check_name(kind: str, value: str) -> str:
    """A pipeline or consumer group name from user input: 1-255 characters, no control characters."""
    if not value or len(value) > MAX_NAME or _CONTROL.search(value):
        raise InvalidInput(f"invalid {kind} name {value[:80]!r}", **{kind.replace(' ', '_'): value[:80]})
    return value


def check_topic(value: str) -> str:
    """A topic name from user input, by Kafka's rules (letters, digits, '.', '_', '-'; at most 249)."""
    if not _TOPIC_NAME.match(value):
        raise InvalidInput(f"invalid topic name {value[:80]!r}: Kafka topics use letters, digits, '.', '_', '-'",
                           topic=value[:80])
    return value


def parse_timestamp(text: str | int) -> datetime:
    """ISO 8601 (naive means UTC) or epoch milliseconds -> an aware UTC datetime."""
    if isinstance(text, bool):
        raise InvalidInput(f"invalid timestamp {text!r}")
    if isinstance(text, int) or (isinstance(text, str) and re.fullmatch(r"-?\d{1,16}", text.strip())):
        ms = int(text)
        if ms < 0:
            raise InvalidInput(f"invalid timestamp {text!r}: epoch milliseconds must be >= 0")
        try:
            return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
        except (OverflowError, OSError, ValueError) as exc:
            raise InvalidInput(f"invalid timestamp {text!r}") from exc
    try:
        value = datetime.fromisoformat(str(text).strip().replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidInput(f"invalid timestamp {text!r}: use ISO 8601 (2024-05-01T12:00:00Z) or epoch ms",
                           timestamp=str(text)[:80]) from exc
    try:
        value = value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    except (OverflowError, ValueError) as exc:
        raise InvalidInput(f"invalid timestamp {text!r}") from exc
    if value.year < 1970:
        # Kafka reads timestamps -1 and -2 as "latest"/"earliest": never send a pre-epoch time.
        raise InvalidInput(f"invalid timestamp {text!r}: before 1970", timestamp=str(text)[:80])
    return value


def to_epoch_ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


def encode_cursor(batch_time: datetime, row_id: int) -> str:
    raw = json.dumps([iso_utc(batch_time), row_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, int]:
    """The opaque history cursor -> (batch_time, id); InvalidInput when it was not ours."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        t, i = json.loads(raw)
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= MAX_BIGINT:
            raise ValueError("id")
        return datetime.fromisoformat(t), i
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError) as exc:
        raise InvalidInput(f"invalid cursor {cursor[:80]!r}", cursor=cursor[:80]) from exc


def check_reason(reason: str | None, *, dry_run: bool) -> str | None:
    """The reason of a reset: at most 10,000 characters, and required (not blank) when it executes."""
    if reason is not None and len(reason) > 10_000:
        raise InvalidInput("reason is longer than 10000 characters")
    if not dry_run and not (reason and reason.strip()):
        raise InvalidInput('an executed reset needs a reason (--reason TEXT / "reason"); it is kept in the audit trail')
    return reason


def audit_actor(authenticated: str | None, claimed: str | None, default: str) -> str:
    """Who a reset is audited as: the authenticated token's name, the caller's claim only as detail.

    ``ci-bot`` claiming ``alice`` is ``ci-bot (alice)``. Without authentication (a loopback server
    with no token) there is no identity to check, and the claim (or ``default``) is all there is.
    """
    if claimed is not None:
        check_name("actor", claimed)
    if authenticated is None:
        return claimed or default
    if not claimed or claimed == authenticated:
        return authenticated
    room = MAX_NAME - len(authenticated) - 3
    return f"{authenticated} ({claimed[:room]})"


def request_from_legacy_body(body: Any) -> ResetRequest:
    """The legacy resetOffsetOfPartitions body -> an ``offsets`` request naming every partition."""
    offsets = parse_offsets_body(body)
    return ResetRequest(mode="offsets", offsets=offsets, out_of_range="refuse", require_all_partitions=True)


def scope_from_specs(specs: Sequence[str]) -> dict[str, tuple[int, ...] | None] | None:
    """CLI ``--topic T[:p,...]`` values -> a reset scope."""
    if not specs:
        return None
    scope: dict[str, tuple[int, ...] | None] = {}
    for spec in specs:
        topic, _, parts = spec.partition(":")
        check_topic(topic)
        if not parts:
            scope[topic] = None
            continue
        try:
            numbers = tuple(sorted({int(x) for x in parts.split(",") if x.strip() != ""}))
        except ValueError as exc:
            raise InvalidInput(f"invalid --topic {spec!r}: use TOPIC or TOPIC:0,1,2", topic=topic) from exc
        if not numbers or any(n < 0 for n in numbers):
            raise InvalidInput(f"invalid --topic {spec!r}: use TOPIC or TOPIC:0,1,2", topic=topic)
        scope[topic] = numbers
    return scope
