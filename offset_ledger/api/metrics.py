"""Prometheus text exposition (format 0.0.4) of a MetricsSnapshot, written by hand (no dependency)."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timezone
from operator import attrgetter
from typing import get_args

from offset_ledger.operate.answers import MetricsSnapshot, PartitionLag, PipelineSummary
from offset_ledger.rules.liveness import PipelineState
from offset_ledger.rules.status import STATES

#: The running states every face shows (offset_ledger.rules.liveness), in its order.
PIPELINE_STATES: tuple[str, ...] = get_args(PipelineState)


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: object) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in labels.items()) + "}"


def _aware(value: datetime) -> datetime:
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


def render_metrics(snap: MetricsSnapshot) -> str:
    """The /metrics body."""
    out: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float | str]]) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            # repr, not :g (six digits): a Unix time or a day's seconds must keep every digit.
            out.append(f"{name}{labels} {value!r}" if isinstance(value, float) else f"{name}{labels} {value}")

    # The four labels of a partition series, built once per row for the five per-partition families,
    # and each sample written straight into the output (building the labels per sample, and a
    # (labels, value) tuple for each, was most of the render: 10,000 partitions make 50,000 samples).
    esc: dict[object, str] = {}

    def cached(value: object) -> str:
        got = esc.get(value)
        if got is None:
            got = esc[value] = _label(value)
        return got

    rows = [(f'{{pipeline="{cached(p)}",consumer_group="{cached(g)}",topic="{cached(x.topic)}",'
             f'partition="{cached(x.partition)}"}}', x) for p, g, x in snap.partitions]

    def per_partition(name: str, kind: str, help_text: str, value: Callable[[PartitionLag], float | None]) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        for labels, x in rows:
            v = value(x)
            if v is not None:
                if isinstance(v, float):
                    out.append(f"{name}{labels} +Inf" if v == math.inf else f"{name}{labels} {v:g}")
                else:
                    out.append(f"{name}{labels} {v}")

    per_partition("offset_ledger_position_next_offset", "gauge",
                  "Next offset the pipeline will read per partition (ledger position).", attrgetter("next_offset"))
    per_partition("offset_ledger_log_end_offset", "gauge", "Log-end offset of the partition (next offset to be written).",
                  attrgetter("log_end_offset"))
    per_partition("offset_ledger_lag_records", "gauge", "Log-end offset minus the pipeline's next offset.",
                  attrgetter("lag"))
    per_partition("offset_ledger_lag_seconds", "gauge",
                  "Age in seconds of the record at the pipeline's position (its Kafka timestamp); 0 when caught up.",
                  lambda x: None if x.lag_seconds is None else float(x.lag_seconds))
    per_partition("offset_ledger_retention_headroom_seconds", "gauge",
                  "Seconds until retention may delete the segment holding the pipeline's position (an estimate, the "
                  "earliest bound; see offset_ledger.rules.retention); 0 when due or records were lost, +Inf when "
                  "nothing unread can be deleted; absent when unknown or the topic is compacted.",
                  lambda x: None if x.headroom is None or x.headroom.status is None
                  else math.inf if x.headroom.seconds is None else float(round(x.headroom.seconds, 3)))
    per_partition("offset_ledger_group_drift_records", "gauge",
                  "Kafka consumer group's committed offset minus the ledger position (groups that committed any).",
                  attrgetter("drift"))
    family("offset_ledger_status", "gauge",
           "1 for the pipeline's current status (OK, LAGGING, STALLED, STOPPED, REWOUND, ERR; see offset_ledger.rules.status), "
           "0 for the others.",
           [(_labels(pipeline=s.pipeline, consumer_group=s.consumer_group, state=state),
             1 if s.status == state else 0)
            for s in snap.pipelines if s.status is not None for state in STATES])
    family("offset_ledger_records_lost_total", "counter",
           "Records the pipeline's batches never read (fewer rows than offsets spanned, not explained by compaction "
           "or transaction markers): deleted before they were fetched, with failOnDataLoss=false.",
           [(_labels(pipeline=p, consumer_group=g, topic=t, partition=n), lost)
            for p, g, t, n, lost in snap.records_lost])
    family("offset_ledger_seconds_since_last_batch", "gauge",
           "Seconds since the pipeline's last committed batch.",
           [(_labels(pipeline=s.pipeline, consumer_group=s.consumer_group),
             round((snap.now - _aware(s.last_batch_time)).total_seconds(), 3))
            for s in snap.pipelines if s.last_batch_time is not None])
    family("offset_ledger_last_batch_id", "gauge",
           "Id of the pipeline's newest committed batch (changes() counts batches; a new checkpoint starts again).",
           [(_labels(pipeline=s.pipeline, consumer_group=s.consumer_group), s.last_batch_id)
            for s in snap.pipelines if s.last_batch_id is not None])
    family("offset_ledger_pipeline_running", "gauge", "1 when the pipeline has an active run, else 0.",
           [(_labels(pipeline=s.pipeline, consumer_group=s.consumer_group), 1 if s.active_run_ids else 0)
            for s in snap.pipelines])
    family("offset_ledger_foreign_runs", "gauge",
           "Active runs of the pipeline not on its current checkpoint generation (their batches move no position).",
           [(_labels(pipeline=s.pipeline, consumer_group=s.consumer_group), len(s.foreign_run_ids))
            for s in snap.pipelines])
    # A listener serves one pipeline; its consumer_group is that pipeline's group when it records one
    # (empty when it records several), so Alertmanager routes a listener's alerts with its pipeline's.
    groups: dict[str, set[str]] = {}
    for summary in snap.pipelines:
        groups.setdefault(summary.pipeline, set()).add(summary.consumer_group)

    def listener_labels(r: dict) -> str:  # type: ignore[type-arg]
        gs = groups.get(r["pipeline"] or "", set())
        return _labels(listener_id=r["listener_id"], pipeline=r["pipeline"] or "",
                       consumer_group=next(iter(gs)) if len(gs) == 1 else "", host=r["host"] or "")

    listener_rows = [(listener_labels(r), r) for r in snap.listeners]
    for counter in ("queued", "written", "retried", "spilled", "failed"):
        family(f"offset_ledger_listener_{counter}_total", "counter",
               f"Events {counter} by the listener (cumulative, as last reported).",
               [(labels, int(r[counter] or 0)) for labels, r in listener_rows])
    family("offset_ledger_listener_seconds_since_report", "gauge", "Seconds since the listener last reported health.",
           [(labels, round((snap.now - _aware(r["reported_at"])).total_seconds(), 3)) for labels, r in listener_rows])
    family("offset_ledger_listener_healthy", "gauge", "1 when the listener's last report has no error, else 0.",
           [(labels, 0 if r["last_error"] else 1) for labels, r in listener_rows])
    family("offset_ledger_pipeline_state", "gauge",
           "1 for the pipeline's running state (running, uncertain, stale, stopped; see offset_ledger.rules.liveness "
           "and docs/operations.md#is-it-running), 0 for the others. stale: its driver's heartbeat stopped with no "
           "termination reported (presumed crashed).",
           [(_labels(pipeline=s.pipeline, consumer_group=s.consumer_group, state=state), 1 if s.state == state else 0)
            for s in snap.pipelines for state in PIPELINE_STATES])
    family("offset_ledger_driver_heartbeat_age_seconds", "gauge",
           "Seconds since the driver heartbeat of the run the pipeline's state rests on (running or stale runs "
           "with a heartbeat only; the run is presumed crashed past 3 heartbeat periods).",
           [(_labels(pipeline=s.pipeline, consumer_group=s.consumer_group),
             round(max(0.0, (snap.now - _aware(s.last_event_at)).total_seconds()), 3))
            for s in snap.pipelines if _beats(s)])
    resets = {(p, g): (n, at) for p, g, n, at in snap.resets}
    family("offset_ledger_resets_pending", "gauge",
           "Executed resets not yet applied by a restart (the next restart starts from their positions).",
           [(_labels(pipeline=s.pipeline, consumer_group=s.consumer_group),
             resets.get((s.pipeline, s.consumer_group), (0, None))[0]) for s in snap.pipelines])
    family("offset_ledger_last_reset_timestamp_seconds", "gauge",
           "Unix time of the pipeline's newest executed reset (dry runs excluded); absent when none was executed.",
           [(_labels(pipeline=p, consumer_group=g), round(_aware(at).timestamp(), 3))
            for p, g, _, at in snap.resets if at is not None])
    family("offset_ledger_findings", "gauge",
           "Findings recorded per kind (a repeated finding counts once; pruning removes old ones).",
           [(_labels(pipeline=p, consumer_group=g, kind=k), n) for p, g, k, n in snap.findings])
    if snap.kafka_up is not None:
        family("offset_ledger_kafka_up", "gauge", "1 when the Kafka cluster answered this scrape.",
               [("", 1 if snap.kafka_up else 0)])
    return "\n".join(out) + "\n"


def _beats(s: PipelineSummary) -> bool:
    """Whether the run the pipeline's state rests on is judged on its driver's heartbeat."""
    if s.state not in ("running", "stale") or s.last_event_at is None or s.state_run_id is None:
        return False
    return any(r.heartbeat and s.state_run_id in (r.run_id, r.follows) for r in s.runs)
