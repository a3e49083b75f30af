"""The operator actions' answers as every face names them: one writer per verb's outcome (failover,
import-checkpoint, replay, the restart preview, verify), built from the parts ``operate.answers`` writes.

Apart from ``answers`` because the verbs import ``answers`` (its values and ``iso_utc``) while these
writers read the verbs' result types: one module for both would need itself back.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from offset_ledger.operate.answers import (
    batch_ref_answer,
    failover_partition_answer,
    failover_problem_answer,
    finding_answer,
    iso_utc,
    move_cost_answer,
    reason_answer,
)

if TYPE_CHECKING:
    from offset_ledger.operate.adopt import AdoptResult
    from offset_ledger.operate.failover import FailoverResult
    from offset_ledger.operate.replay import ReplayRange
    from offset_ledger.operate.restart_preview import RestartPreview
    from offset_ledger.operate.verifying import VerifyReport
    from offset_ledger.rules.verify import BatchRef, Stretch


def failover_answer(r: FailoverResult) -> dict[str, Any]:
    """A failover (planned or carried out): where the pipeline starts on the target cluster."""
    return {"pipeline": r.pipeline, "consumerGroup": r.consumer_group, "sourceAlias": r.source_alias,
            "targetBootstrap": r.target_bootstrap, "targetClusterId": r.target_cluster_id,
            "dryRun": r.dry_run, "topics": r.topics, "topicMap": dict(r.plan.topic_map),
            "startingOffsets": r.starting_offsets, "checkpointLocation": r.checkpoint_location,
            "generation": r.generation, "rereadMax": r.reread_max,
            "partitions": [failover_partition_answer(p) for p in r.plan.partitions],
            "problems": [failover_problem_answer(p) for p in r.plan.problems],
            "findings": [finding_answer(f) for f in r.findings]}


def failover_json(r: FailoverResult) -> str:
    """The failover's answer as indented JSON (the CLI's ``-f json``)."""
    return json.dumps(failover_answer(r), indent=2, sort_keys=False)


def adopt_answer(r: AdoptResult) -> dict[str, Any]:
    """What an import of a checkpoint wrote (or would write)."""
    return {
        "pipeline": r.pipeline, "consumerGroup": r.consumer_group,
        "checkpointLocation": r.checkpoint_location, "checkpointRoot": r.checkpoint_root,
        "queryId": r.query_id, "committedBatchId": r.committed_batch_id,
        "plannedBatchIds": list(r.planned_batch_ids), "positions": r.starting_offsets,
        "sourcesUsed": list(r.sources_used), "skipped": list(r.skipped),
        "executed": r.executed, "generation": r.generation,
    }


def replay_answer(r: ReplayRange) -> dict[str, Any]:
    """The reader options of a replay, the batches they cover, what they lost and what the batches wrote."""
    return {
        "startingOffsets": r.starting_offsets, "endingOffsets": r.ending_offsets,
        "assign": r.assign, "records": r.records,
        "batches": [{"queryId": q, "batchId": b} for q, b in r.batches],
        "warnings": list(r.warnings), "lost": [dict(x) for x in r.lost],
        "retentionChecked": r.retention_checked,
        "outputs": [{"queryId": o["query_id"], "batchId": o["batch_id"], "sink": o["sink"], "target": o["target"],
                     "sequence": o["sequence"], "rowCount": o["row_count"], "tableVersion": o["table_version"]}
                    for o in r.outputs],
    }


def restart_preview_answer(r: RestartPreview) -> dict[str, Any]:
    """A restart as ``start_from_ledger`` would make it now (``written`` is always False)."""
    p = r.plan
    return {
        "pipeline": p.pipeline, "consumerGroup": p.consumer_group,
        "checkpoint": {"fresh": p.fresh_checkpoint, "reason": r.reason, "why": r.why,
                       "location": p.checkpoint_location, "generation": p.generation},
        "startingOffsets": {t: dict(parts) for t, parts in p.starting_offsets.items()},
        "eventTimeFloor": iso_utc(p.event_time_floor),
        "findings": [{"kind": f.kind, "topic": f.topic, "partition": f.partition, "message": f.message}
                     for f in p.findings],
        "pendingResets": list(r.pending_reset_ids),
        "cost": move_cost_answer(r.cost) if r.cost is not None else None,
        "policies": dict(p.policies),
        "written": False,
    }


def _batch(report: VerifyReport, ref: BatchRef | None) -> dict[str, Any] | None:
    return None if ref is None else batch_ref_answer(ref, report.generation_of(ref))


def stretch_answer(report: VerifyReport, s: Stretch) -> dict[str, Any]:
    """One stretch verify found: offsets read too few or too many times, why, and what borders it."""
    return {
        "topic": s.topic, "partition": s.partition, "incarnation": s.incarnation,
        "fromOffset": s.from_offset, "untilOffset": s.until_offset, "records": s.records, "kind": s.kind,
        "times": s.times, "explained": s.explained, "reasons": [reason_answer(r) for r in s.reasons],
        "before": _batch(report, s.before), "after": _batch(report, s.after),
        "batches": [_batch(report, b) for b in s.batches], "beyondPosition": s.beyond_position,
        "notes": report.notes(s),
    }


def verify_answer(report: VerifyReport) -> dict[str, Any]:
    """What verify found: the summary, every stretch, every partition swept (and sinks' gaps, if any)."""
    gaps = {"sinkGaps": [{"sink": g.sink, "topic": g.topic, "partition": g.partition, "fromOffset": g.from_offset,
                          "untilOffset": g.until_offset, "records": g.until_offset - g.from_offset,
                          "heldBy": list(g.held_by), "message": g.message()} for g in report.sink_gaps]} \
        if report.sink_gaps else {}
    return {
        "pipeline": report.pipeline, "consumerGroup": report.consumer_group, "topic": report.topic, "ok": report.ok,
        "summary": report.summary(), **gaps,
        "stretches": [stretch_answer(report, s) for s in report.stretches],
        "partitions": [{
            "topic": r.topic, "partition": r.partition, "incarnation": r.incarnation,
            "firstOffset": r.first_offset, "endOffset": r.end_offset, "position": r.position,
            "ranges": r.ranges, "unknownStarts": r.unknown_starts,
            "unexplained": sum(1 for s in r.stretches if not s.explained),
            "explained": sum(1 for s in r.stretches if s.explained),
            "context": [reason_answer(c)
                        for c in report.inputs.context.get((r.topic, r.partition, r.incarnation), ())],
        } for r in report.results],
    }
