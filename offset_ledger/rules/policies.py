"""Pure: a pipeline's restart policies, decided once and stored with it, and how a call overrides them.

An operator decides a pipeline's policies once (``offset-ledger policy set``); every restart then
applies them, so a deploy that forgets ``on_data_loss`` or ``window=`` cannot silently change
behaviour. An argument given in code overrides the stored value for that call, and the plan says so
(a ``policy_override`` finding). No I/O here: ``offset_ledger.ledger.policy_store`` stores them.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from offset_ledger.errors import InvalidRestartOptions
from offset_ledger.rules.model import Finding
from offset_ledger.rules.resolver import parse_first_run, parse_on_data_loss
from offset_ledger.rules.stateful import WindowSpec, parse_duration_ms

#: The policies, in the order they are shown.
POLICY_KEYS = ("first_run", "on_data_loss", "window", "slide", "watermark_delay",
               "event_time_is_kafka_timestamp", "commit_to_kafka")
#: What a restart uses where neither the ledger nor the call says anything.
DEFAULTS: Mapping[str, Any] = {"first_run": None, "on_data_loss": "fail", "window": None, "slide": None,
                               "watermark_delay": None, "event_time_is_kafka_timestamp": False,
                               "commit_to_kafka": False}
_BOOLEANS = ("event_time_is_kafka_timestamp", "commit_to_kafka")


def check_policies(values: Mapping[str, Any]) -> dict[str, Any]:
    """Validated policy values, as stored (JSON-ready); a value of None removes that policy."""
    unknown = sorted(set(values) - set(POLICY_KEYS))
    if unknown:
        raise InvalidRestartOptions(f"unknown polic{'ies' if len(unknown) > 1 else 'y'} {', '.join(unknown)}; "
                                    f"known: {', '.join(POLICY_KEYS)}", option=unknown[0])
    out: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            out[key] = None
        elif key == "first_run":
            parse_first_run(value)
            out[key] = (value.astimezone(timezone.utc).isoformat() if isinstance(value, datetime) and value.tzinfo
                        else value.replace(tzinfo=timezone.utc).isoformat() if isinstance(value, datetime)
                        else value)
        elif key == "on_data_loss":
            out[key] = parse_on_data_loss(str(value))
        elif key in ("window", "slide", "watermark_delay"):
            parse_duration_ms(value, option=key)
            out[key] = str(value)
        elif key in _BOOLEANS:
            if not isinstance(value, bool):
                raise InvalidRestartOptions(f"{key} must be true or false, not {value!r}", option=key)
            out[key] = value
    return out


def merged(current: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """The policies after ``changes`` (checked): None removes one. A slide needs a window."""
    after = {k: v for k, v in {**current, **check_policies(changes)}.items() if v is not None}
    if "slide" in after and "window" not in after:
        raise InvalidRestartOptions("a slide policy needs a window policy", option="slide")
    if "window" in after:
        WindowSpec.parse(after["window"], after.get("slide"))
    return after


def effective(stored: Mapping[str, Any], given: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[Finding, ...]]:
    """(the values a restart uses, one ``policy_override`` finding per argument that differs from a stored one).

    ``given`` holds only the arguments the caller passed (None: not passed).
    """
    out = dict(DEFAULTS)
    out.update({k: v for k, v in stored.items() if k in DEFAULTS})
    overrides = []
    for key, value in given.items():
        if value is None:
            continue
        if key in stored and stored[key] != value:
            overrides.append(Finding(
                "policy_override",
                f"{key}={value!r} given for this restart overrides the pipeline's stored policy {stored[key]!r} "
                f"(offset-ledger policy set changes it for good)",
                details={"policy": key, "given": value if isinstance(value, (str, int, bool)) else str(value),
                         "stored": stored[key]}))
        out[key] = value
    return out, tuple(overrides)
