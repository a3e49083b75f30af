"""``offset-ledger plan``: the restart ``start_from_ledger`` would make, computed and written nowhere.

The same planning as the restart itself, called, not copied: ``restart.policies_in_effect`` (the
call's policies over the stored ones), ``restart_plan.read_inputs`` and ``compose`` (positions,
cluster, first run, data loss, stateful rewind), ``restart.generation_reason`` (fresh or resumed checkpoint, and why)
and ``move_cost.plan_cost`` (records re-read or skipped). What it leaves out is what writes: the
reconciliation with the old checkpoint (batches it committed that the ledger lacks are recorded
by ``start_from_ledger`` first; ``offset-ledger watch PIPELINE CHECKPOINT --once`` records them
now), the lock, and the generation row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from offset_ledger.ledger.generations import generation_location
from offset_ledger.operate.move_cost import plan_cost
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.restart import CheckpointTruth, generation_reason, policies_in_effect
from offset_ledger.operate.restart_plan import compose, read_inputs, resolve_ref
from offset_ledger.rules.model import Finding
from offset_ledger.rules.move_cost import MoveCost
from offset_ledger.rules.plan import RestartPlan
from offset_ledger.rules.policies import Policies
from offset_ledger.rules.restart_options import PipelineRef, RestartOptions

#: Why a fresh checkpoint generation, in an operator's words (``rules.resolver.GenerationReason``).
REASONS = {
    "first": "first run through the ledger: no checkpoint generation yet",
    "reset": "a pending reset takes effect only on an empty checkpoint",
    "data_loss": "positions fall outside the log (on_data_loss earliest): clamped offsets need an empty checkpoint",
    "checkpoint_lost": "the current generation's checkpoint is gone or empty",
    "checkpoint_recreated": "the current generation's checkpoint holds another query",
    "app_version": "app version changes from {current} to {new}",
    "checkpoint_root": "the checkpoint root changes from {current_root} to {new_root}",
    "requested": "a new checkpoint was asked for",
    "sink_ahead": "a sink's target holds output past the positions; the plan starts after it",
}

#: The id part of a fresh generation's directory, unknown until ``start_from_ledger`` writes it.
NEW_ID = "<new id>"


@dataclass(frozen=True)
class RestartPreview:
    """A restart as ``start_from_ledger`` would make it now; nothing of it was written."""

    plan: RestartPlan  # checkpoint_location, fresh_checkpoint and generation as the restart would set them
    reason: str | None  # GenerationReason of a fresh checkpoint; None: the current one is resumed
    why: str
    positions: Mapping[tuple[str, int], int]  # the ledger's positions the plan starts from
    pending_reset_ids: tuple[int, ...]
    cost: MoveCost | None  # on a fresh checkpoint: what starting there re-reads or skips


def preview_restart(ops: Operations, ref: PipelineRef, options: RestartOptions,
                    given: Policies = Policies()) -> RestartPreview:
    """What ``restart(ops, RestartRequest(ref, options, given))`` would answer now, read-only.

    Its planning, step by step as ``restart.plan_and_write`` takes it (a stored window rewinds an
    upgrade that opens a fresh generation anyway); the checkpoint is taken as the ledger knows it.
    """
    use, overrides = policies_in_effect(ops, ref.pipeline, given)
    window = use.window_spec()
    asked = given.window is not None
    group = resolve_ref(ops.engine, ref)
    truth = CheckpointTruth(group)  # not reconciled: reconciling records batches, and this writes nothing
    rewind = asked
    inputs = read_inputs(ops, group, options, use)
    cluster = inputs.cluster
    plan, ledger = compose(ops, inputs, use, window if rewind else None)
    if window is not None and not asked and not ledger.pending_reset_ids and generation_reason(
            plan, ledger, options, truth) not in (None, "first"):
        rewind = True
        plan, ledger = compose(ops, inputs, use, window)
    reason = generation_reason(plan, ledger, options, truth, new_checkpoint=rewind)
    current = ledger.generation
    positions = {(p.topic, p.partition): p.next_offset for p in ledger.positions}
    findings = (*overrides, *plan.findings)
    if reason is None:
        assert current is not None
        done = RestartPlan(plan.pipeline, plan.starting_offsets, current.location, findings, fresh_checkpoint=False,
                           generation=current.generation, consumer_group=plan.consumer_group,
                           event_time_floor=plan.event_time_floor, policies=use.as_dict())
        why = (f"resumes generation {current.generation}: same app version ({current.app_version or '-'}), same "
               "checkpoint root, no pending reset; Spark continues from the checkpoint and ignores startingOffsets")
        return RestartPreview(done, None, why, positions, ledger.pending_reset_ids, None)
    number = (current.generation if current is not None else 0) + 1
    location = generation_location(str(options.checkpoint_root), number, NEW_ID)
    cost = plan_cost(ops.kafka, plan.starting_offsets, ledger.positions, cluster.watermarks)
    findings = (*findings, *(  # as the restart reports the resets its generation consumes
        Finding("reset_consumed", f"pending reset {rid} applied through fresh checkpoint generation {number}",
                details={"reset_id": rid, "generation": number}) for rid in ledger.pending_reset_ids))
    done = RestartPlan(plan.pipeline, plan.starting_offsets, location, findings, fresh_checkpoint=True,
                       generation=number, consumer_group=plan.consumer_group, event_time_floor=plan.event_time_floor,
                       policies=use.as_dict(), cost=cost)
    why = REASONS.get(reason, reason).format(
        current=current.app_version if current is not None else None, new=options.app_version,
        current_root=current.checkpoint_root if current is not None else None, new_root=options.checkpoint_root)
    return RestartPreview(done, reason, why, positions, ledger.pending_reset_ids, cost)
