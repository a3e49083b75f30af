"""Pure: a pipeline's restart policies, decided once and stored with it, and how a call overrides them.

An operator decides a pipeline's policies once (``offset-ledger policy set``); every restart then
applies them, so a deploy that forgets ``on_data_loss`` or ``window=`` cannot silently change
behaviour. An argument given in code overrides the stored value for that call, and the plan says so
(a ``policy_override`` finding). No I/O here: ``offset_ledger.ledger.policy_store`` stores them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timedelta, timezone
from typing import Any

from offset_ledger.errors import InvalidRestartOptions
from offset_ledger.rules.model import Finding, OnDataLoss
from offset_ledger.rules.restart_options import FirstRun, parse_first_run, parse_on_data_loss
from offset_ledger.rules.stateful import WindowSpec, parse_duration_ms

Duration = str | int | timedelta

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


@dataclass(frozen=True)
class Policies:
    """A pipeline's restart policies as one value, each checked when the value is built.

    Three uses, one type: the policies a call gives (None: not given), the ones stored with the
    pipeline (``stored``), and the ones a restart applies (``given.over(stored)``: the call's, else
    the stored, else ``DEFAULTS``). ``window_spec`` is the stateful window they describe.
    """

    first_run: object = None
    on_data_loss: OnDataLoss | None = None
    window: Duration | None = None
    slide: Duration | None = None
    watermark_delay: Duration | None = None
    event_time_is_kafka_timestamp: bool | None = None
    commit_to_kafka: bool | None = None

    def __post_init__(self) -> None:
        if self.first_run is not None:
            parse_first_run(self.first_run)
        if self.on_data_loss is not None:
            parse_on_data_loss(self.on_data_loss)
        for key in ("window", "slide", "watermark_delay"):
            value = getattr(self, key)
            if value is not None:
                parse_duration_ms(value, option=key)

    @classmethod
    def stored(cls, raw: Mapping[str, Any]) -> Policies:
        """The policies as the ledger stores them (``ledger.policy_store.current_policies``)."""
        return cls(**{key: raw[key] for key in POLICY_KEYS if key in raw})

    @property
    def first_run_policy(self) -> FirstRun:
        return parse_first_run("earliest" if self.first_run is None else self.first_run)

    def over(self, stored: Policies) -> tuple[Policies, tuple[Finding, ...]]:
        """(the policies a restart applies, one ``policy_override`` finding per given policy that differs
        from a stored one). ``self`` holds what the call gave."""
        out = {**DEFAULTS, **{k: v for k, v in asdict(stored).items() if v is not None}}
        overrides = []
        for key, value in asdict(self).items():
            if value is None:
                continue
            kept = getattr(stored, key)
            if kept is not None and kept != value:
                overrides.append(Finding(
                    "policy_override",
                    f"{key}={value!r} given for this restart overrides the pipeline's stored policy {kept!r} "
                    f"(offset-ledger policy set changes it for good)",
                    details={"policy": key, "given": value if isinstance(value, (str, int, bool)) else str(value),
                             "stored": kept}))
            out[key] = value
        if out["window"] is None and (self.slide is not None or self.watermark_delay is not None
                                      or self.event_time_is_kafka_timestamp):
            raise InvalidRestartOptions("slide, watermark_delay and event_time_is_kafka_timestamp need window",
                                        option="window")
        return Policies(**out), tuple(overrides)

    def window_spec(self) -> WindowSpec | None:
        """The stateful window these policies describe (None: not windowed)."""
        if self.window is None:
            return None
        return WindowSpec.parse(self.window, self.slide, self.watermark_delay, bool(self.event_time_is_kafka_timestamp))

    def as_dict(self) -> dict[str, Any]:
        """Every policy by name (``RestartPlan.policies``, what the faces show)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
