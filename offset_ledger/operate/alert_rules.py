"""Prometheus alert and recording rules over ``/metrics`` (``api.metrics``), built from the thresholds a team
chooses (issue 52). Pure: ``rules_document(Thresholds(...))`` returns the rules file's data,
``render_yaml`` its text; ``offset-ledger alerts --format prometheus`` prints it and the package ships
the defaults as ``offset_ledger/operate/prometheus-rules.yml`` (``SHIPPED``). docs/alerting.md explains each rule.

The rules page on what the ledger *knows*, not on silence: a pipeline is presumed crashed when its state
is ``stale`` (its driver's heartbeat stopped with no termination reported, ``rules.liveness``), never
because no batch came for N minutes (a slow trigger is ``running`` throughout); lag pages when it stayed
above its threshold for a whole window (``min_over_time``), so one batch's normal spike never does.
Every alert keeps its series' ``pipeline`` and ``consumer_group`` (and ``topic``, ``partition`` where the
series is per partition), so Alertmanager routes it to the team that owns the pipeline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from datetime import timedelta
from pathlib import Path
from typing import Any

from offset_ledger.errors import InvalidInput
from offset_ledger.rules.durations import parse_duration

#: The rules file the package ships (the defaults of ``Thresholds``).
SHIPPED = Path(__file__).with_name("prometheus-rules.yml")
#: Finding kinds that are stretches verify reports as unexplained (``ledger.recorder``'s findings).
STRETCH_KINDS = "gap|regression"
#: Where each rule's runbook section lives unless ``runbook_base`` says otherwise.
DEFAULT_RUNBOOK = "docs/alerting.md"


@dataclass(frozen=True)
class Thresholds:
    """What a team chooses; every duration is a ``timedelta``, ``lag_seconds`` a number of seconds."""

    headroom_warn: timedelta = timedelta(hours=6)      # headroom below this: warning
    headroom_critical: timedelta = timedelta(hours=1)  # headroom below this: critical
    headroom_for: timedelta = timedelta(minutes=5)     # how long it must stay below first
    lag_seconds: float = 900.0                         # lag in seconds above this ...
    lag_for: timedelta = timedelta(minutes=10)         # ... for this whole window (min_over_time)
    crash_for: timedelta = timedelta(minutes=1)        # state stale this long before paging
    lost_window: timedelta = timedelta(minutes=15)     # records lost (or a gap, a regression) within this
    ledger_for: timedelta = timedelta(minutes=5)       # listener failing / spilling this long
    reset_window: timedelta = timedelta(hours=1)       # a reset executed within this: info
    runbook_base: str = DEFAULT_RUNBOOK

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, timedelta) and value <= timedelta(0):
                raise InvalidInput(f"--{f.name.replace('_', '-')} must be longer than zero, not {value}")
        if not self.lag_seconds > 0:
            raise InvalidInput(f"--lag-seconds must be a number of seconds above zero, not {self.lag_seconds}")
        if self.headroom_critical >= self.headroom_warn:
            raise InvalidInput(f"--headroom-critical ({_prom(self.headroom_critical)}) must be shorter than "
                               f"--headroom-warn ({_prom(self.headroom_warn)})")
        if not self.runbook_base or any(c.isspace() for c in self.runbook_base):
            raise InvalidInput(f"--runbook-base must be a URL or path without spaces, not {self.runbook_base!r}")


def parse_thresholds(**given: str | None) -> Thresholds:
    """``Thresholds`` from option strings (durations in ``rules.durations``' grammar; ``lag_seconds``
    a duration or a bare number of seconds); None keeps the default. InvalidInput/InvalidDuration, one line."""
    kw: dict[str, Any] = {}
    for name, text in given.items():
        if text is None:
            continue
        option = f"--{name.replace('_', '-')}"
        if name == "runbook_base":
            kw[name] = text
        elif name == "lag_seconds":
            try:
                kw[name] = float(text)
            except ValueError:
                kw[name] = parse_duration(text, option).total_seconds()
        else:
            kw[name] = parse_duration(text, option)
    return Thresholds(**kw)


def _prom(d: timedelta) -> str:
    """A Prometheus duration (``1h30m``, ``90s``, ``500ms``)."""
    ms = int(round(d.total_seconds() * 1000))
    out = ""
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        if ms >= size:
            out += f"{ms // size}{unit}"
            ms %= size
    return out or "0s"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


# Why each alert exists, what to run, and where its section is (docs/alerting.md's anchors).
_GROUP = "{{ $labels.pipeline }} --consumer-group {{ $labels.consumer_group }}"


def rules_document(t: Thresholds = Thresholds()) -> dict[str, Any]:
    """The rules file's data: one recording group and one alerting group."""
    rb = t.runbook_base

    def alert(name: str, expr: str, for_: timedelta | None, severity: str, summary: str, description: str,
              anchor: str, command: str) -> dict[str, Any]:
        rule: dict[str, Any] = {"alert": name, "expr": expr}
        if for_ is not None:
            rule["for"] = _prom(for_)
        rule["labels"] = {"severity": severity}
        rule["annotations"] = {"summary": summary, "description": description,
                               "runbook_url": f"{rb}#{anchor}", "command": command}
        return rule

    warn, crit = t.headroom_warn.total_seconds(), t.headroom_critical.total_seconds()
    lag_window = _prom(t.lag_for)
    recording = [
        {"record": "offset_ledger:lag_seconds:max",
         "expr": "max by (pipeline, consumer_group, topic) (offset_ledger_lag_seconds)"},
        {"record": "offset_ledger:lag_records:sum",
         "expr": "sum by (pipeline, consumer_group, topic) (offset_ledger_lag_records)"},
        {"record": "offset_ledger:retention_headroom_seconds:min",
         "expr": "min by (pipeline, consumer_group, topic) (offset_ledger_retention_headroom_seconds)"},
        {"record": "offset_ledger:records_lost:sum",
         "expr": "sum by (pipeline, consumer_group, topic) (offset_ledger_records_lost_total)"},
    ]
    alerts = [
        alert("OffsetLedgerRetentionHeadroomCritical",
              f"offset_ledger_retention_headroom_seconds < {_num(crit)}", t.headroom_for, "critical",
              "{{ $labels.pipeline }}: retention may delete unread records of {{ $labels.topic }}-"
              "{{ $labels.partition }} within " + _prom(t.headroom_critical),
              "Retention may delete the segment holding the pipeline's position in {{ $value | humanizeDuration }}; "
              "records it has not read yet would be lost.",
              "retention-headroom", f"offset-ledger lag {_GROUP}"),
        alert("OffsetLedgerRetentionHeadroomLow",
              f"offset_ledger_retention_headroom_seconds < {_num(warn)} "
              f"and offset_ledger_retention_headroom_seconds >= {_num(crit)}", t.headroom_for, "warning",
              "{{ $labels.pipeline }}: retention may delete unread records of {{ $labels.topic }}-"
              "{{ $labels.partition }} within " + _prom(t.headroom_warn),
              "Retention may delete the segment holding the pipeline's position in {{ $value | humanizeDuration }}.",
              "retention-headroom", f"offset-ledger lag {_GROUP}"),
        # A counter that first appears already above zero has no increase(): the `unless ... offset` half
        # pages on a partition whose first loss Prometheus has not seen before.
        alert("OffsetLedgerRecordsLost",
              f"increase(offset_ledger_records_lost_total[{_prom(t.lost_window)}]) > 0 "
              f"or (offset_ledger_records_lost_total > 0 unless offset_ledger_records_lost_total "
              f"offset {_prom(t.lost_window)})", None, "critical",
              "{{ $labels.pipeline }}: records of {{ $labels.topic }}-{{ $labels.partition }} were lost unread",
              "The pipeline's batches never read some offsets (deleted before they were fetched, "
              "failOnDataLoss=false).",
              "records-lost", f"offset-ledger verify {_GROUP}"),
        # A gap (a batch started past where the one before ended) or a regression (before it, no reset to
        # explain it) is a stretch verify reports as unexplained; the same new-series half as above.
        alert("OffsetLedgerUnexplainedStretch",
              f'increase(offset_ledger_findings{{kind=~"{STRETCH_KINDS}"}}[{_prom(t.lost_window)}]) > 0 '
              f'or (offset_ledger_findings{{kind=~"{STRETCH_KINDS}"}} > 0 unless offset_ledger_findings'
              f'{{kind=~"{STRETCH_KINDS}"}} offset {_prom(t.lost_window)})', None, "warning",
              "{{ $labels.pipeline }}: a recorded batch left a {{ $labels.kind }} in its offsets",
              "A batch started past (gap) or before (regression) where the previous one ended, with no reset "
              "to explain it: records skipped or read twice.",
              "unexplained-stretch", f"offset-ledger verify {_GROUP}"),
        alert("OffsetLedgerPipelinePresumedCrashed",
              'offset_ledger_pipeline_state{state="stale"} == 1', t.crash_for, "critical",
              "{{ $labels.pipeline }}: driver heartbeat stopped, no termination reported (presumed crashed)",
              "The run the pipeline's state rests on stopped beating for 3 heartbeat periods and Spark reported "
              "no termination. A slow trigger keeps beating and never fires this.",
              "pipeline-presumed-crashed", "offset-ledger pipelines --no-lag"),
        alert("OffsetLedgerLagHigh",
              f"min_over_time(offset_ledger:lag_seconds:max[{lag_window}]) > {_num(t.lag_seconds)} "
              f"and (offset_ledger:lag_seconds:max offset {lag_window}) > {_num(t.lag_seconds)}",
              None, "warning",
              "{{ $labels.pipeline }}: {{ $labels.topic }} more than " + _num(t.lag_seconds)
              + " s behind for " + lag_window,
              "The record at the pipeline's position has been older than the threshold for the whole window "
              "(a batch's normal spike does not fire this); now {{ $value | humanizeDuration }}.",
              "lag-high", f"offset-ledger lag {_GROUP}"),
        alert("OffsetLedgerLedgerWritesFailing",
              f"increase(offset_ledger_listener_failed_total[{_prom(t.ledger_for)}]) > 0 "
              "or offset_ledger_listener_healthy == 0", t.ledger_for, "warning",
              "{{ $labels.pipeline }}: listener {{ $labels.listener_id }} on {{ $labels.host }} cannot write "
              "the ledger",
              "The listener reports errors or events it could not record.",
              "ledger-writes-failing", "offset-ledger pipelines --no-lag"),
        alert("OffsetLedgerSpoolGrowing",
              f"increase(offset_ledger_listener_spilled_total[{_prom(t.ledger_for)}]) > 0", None, "warning",
              "{{ $labels.pipeline }}: listener {{ $labels.listener_id }} is spilling events to its spool",
              "The ledger did not take the listener's writes in time; the events wait in the spool and are "
              "replayed when it answers.",
              "ledger-writes-failing", "offset-ledger pipelines --no-lag"),
        alert("OffsetLedgerResetPending",
              "offset_ledger_resets_pending > 0", None, "info",
              "{{ $labels.pipeline }}: an executed reset waits for the next restart",
              "The next restart starts from the reset's positions.",
              "reset-pending-or-executed", f"offset-ledger resets {_GROUP}"),
        alert("OffsetLedgerResetExecuted",
              f"time() - offset_ledger_last_reset_timestamp_seconds < {_num(t.reset_window.total_seconds())}",
              None, "info",
              "{{ $labels.pipeline }}: a reset was executed within the last " + _prom(t.reset_window),
              "Someone moved the pipeline's positions.",
              "reset-pending-or-executed", f"offset-ledger resets {_GROUP}"),
    ]
    return {"groups": [{"name": "offset-ledger.recording", "rules": recording},
                       {"name": "offset-ledger.alerts", "rules": alerts}]}


def render_yaml(doc: dict[str, Any]) -> str:
    """The document as YAML (block style; every string double-quoted, which YAML reads as JSON strings)."""
    out: list[str] = ["# Generated by offset-ledger alerts --format prometheus (offset_ledger/operate/alert_rules.py);"
                      " docs/alerting.md."]

    def emit(value: Any, indent: int, first_prefix: str | None = None) -> None:
        pad = " " * indent
        if isinstance(value, dict):
            for i, (k, v) in enumerate(value.items()):
                lead = first_prefix if (i == 0 and first_prefix is not None) else pad
                if isinstance(v, (dict, list)):
                    out.append(f"{lead}{k}:")
                    emit(v, indent + 2)
                else:
                    out.append(f"{lead}{k}: {json.dumps(v, ensure_ascii=False)}")
        elif isinstance(value, list):
            for item in value:
                emit(item, indent + 2, pad + "- ")
        else:  # pragma: no cover - the document holds only the shapes above
            raise TypeError(type(value))

    emit(doc, 0)
    return "\n".join(out) + "\n"
