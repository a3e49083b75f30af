"""What ``offset-ledger verify`` reads: the range rows as an ordered stream, and what explains them.

The history (``batch_offsets``) is never loaded: it is streamed from a server-side cursor
(``stream_results`` / ``yield_per``) ordered by (topic, partition, from_offset, until_offset) and
swept by ``offset_ledger.rules.verify.verify_ranges``, which keeps only the ranges open at the current
offset. Everything else read here is small: generations, runs, resets, findings, positions, and the
ranges whose start Spark did not report (a fresh checkpoint's first batch, recorded before the
recorder filled it in).

Explanations, by source (``docs/operations.md`` has the table):

- executed resets (``reset_partitions``: before -> after) skip or re-read the stretch between;
- ``data_loss`` findings of a restart that clamped to log-start (``expected_offset`` -> ``actual_offset``)
  skip the records retention deleted; ``topic_recreated`` / ``above_log_end`` ones, and a Kafka topic
  id that changed between two generations, start a new incarnation of the topic's partitions (its
  offsets are never compared with the old ones; the old one ends where that finding says it stood);
- a ``state_rewind`` finding re-reads from its rewound offsets up to where the history stood before
  its generation; a ``sink_behind`` one from where the sink furthest behind stopped up to the
  position its restart moved back from (the sinks that held it skipped it); a
  ``checkpoint_adopted`` import moves each partition from there to the imported
  offsets;
- ``foreign_run``, ``regression``, ``pending_reset``, ``shared_position`` and ``reset_overtaken``
  findings account for the extra reads of the run they name (every partition for ``foreign_run``,
  the finding's partition for the others).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from offset_ledger.ledger.tables import (
    batch_offsets,
    batches,
    checkpoint_generations,
    findings,
    positions,
    pruned_ranges,
    reset_partitions,
    resets,
    runs,
    sink_batches,
    sinks,
)
from offset_ledger.rules.read_shortfall import READ_SHORTFALL, ROWS_UNKNOWN
from offset_ledger.rules.verify import (
    NEW_INCARNATION,
    RUN_FINDINGS,
    Explanation,
    Reason,
    move_explanation,
    reset_explanations,
)


def _utc(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)  # SQLite drops the zone; everything is written in UTC
    return value


@dataclass
class VerifyInputs:
    """Everything but the range rows: explanations, positions, incarnations, and names for the report."""

    explanations: list[Explanation] = field(default_factory=list)
    positions: dict[tuple[str, int, int], int] = field(default_factory=dict)
    #: query id -> generation number (the generation its runs were on, or the one it claimed)
    generation_of_query: dict[str, int] = field(default_factory=dict)
    #: (query id, batch id) -> [(topic or None for every partition, partition, reason)]
    run_flags: dict[tuple[str, int], list[tuple[str | None, int | None, Reason]]] = field(default_factory=dict)
    #: (topic, partition) -> generation numbers that start a new incarnation
    boundaries: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    topic_boundaries: dict[str, list[int]] = field(default_factory=dict)
    #: gap findings the recorder stored: (topic, partition, expected, actual) -> finding id
    gap_findings: dict[tuple[str, int, int, int], int] = field(default_factory=dict)
    #: context per (topic, partition, incarnation): what started or ended it (new partition, re-created topic, ...)
    context: dict[tuple[str, int, int], list[Reason]] = field(default_factory=dict)
    #: first batch time of every query (only read when incarnations need it)
    query_started: dict[str, datetime] = field(default_factory=dict)
    generation_times: list[tuple[datetime, int]] = field(default_factory=list)
    #: ``data_loss`` findings of batches that read fewer rows than they spanned, or whose rows nobody
    #: counted (``rules.read_shortfall``: details.kind ``read_shortfall`` / ``rows_unknown``):
    #: (finding id, query id, batch id, details); ``operate.verify_loss`` decides what explains them
    shortfalls: list[tuple[int, str, int, dict[str, Any]]] = field(default_factory=list)

    def bounds(self, topic: str, partition: int) -> list[int]:
        found = self.boundaries.get((topic, partition))
        by_topic = self.topic_boundaries.get(topic)
        if not by_topic:
            return found or []
        return sorted(set(found or ()) | set(by_topic))

    def incarnation(self, topic: str, partition: int, generation: int) -> int:
        """Incarnations of the partition begun at or before ``generation``."""
        b = self.bounds(topic, partition)
        return bisect.bisect_right(b, generation) if b else 0

    def generation_at(self, at: datetime | None) -> int:
        """The newest generation created at or before ``at`` (0: before any)."""
        if at is None:
            return 0
        number = 0
        for created, gen in self.generation_times:
            if created <= at:
                number = max(number, gen)
        return number

    #: flagged batches (``run_flags``) of a pipeline with a transactional sink that no sink committed:
    #: their output never landed, so their reads are no coverage (``rules.verify``)
    unlanded: frozenset[tuple[str, int]] = frozenset()

    @property
    def needs_tagging(self) -> bool:
        return bool(self.run_flags or self.boundaries or self.topic_boundaries)


def _unlanded(conn: Connection, pipeline: str, group: str,
              flagged: dict[tuple[str, int], Any]) -> frozenset[tuple[str, int]]:
    """Flagged batches whose output the pipeline's sinks refused: it has a sink, and none committed them."""
    if conn.execute(select(sinks.c.sink).where(sinks.c.pipeline == pipeline, sinks.c.consumer_group == group)
                    .limit(1)).first() is None:
        return frozenset()  # no transactional sink: what a flagged run wrote went wherever it writes
    sb = sink_batches
    committed = {(r.query_id, int(r.batch_id)) for r in conn.execute(
        select(sb.c.query_id, sb.c.batch_id).where(sb.c.pipeline == pipeline, sb.c.consumer_group == group,
                                                   sb.c.query_id.in_(sorted({q for q, _ in flagged}))))}
    return frozenset(k for k in flagged if k not in committed)


def read_inputs(conn: Connection, pipeline: str, group: str, topic: str | None = None) -> VerifyInputs:
    """The small tables, turned into explanations, positions and incarnation boundaries."""
    out = VerifyInputs()
    g = checkpoint_generations
    gens = conn.execute(select(g.c.id, g.c.generation, g.c.created_at, g.c.reason, g.c.query_id, g.c.topic_ids,
                               g.c.resolved_offsets)
                        .where(g.c.pipeline == pipeline, g.c.consumer_group == group)
                        .order_by(g.c.generation)).all()
    number_of = {r.id: r.generation for r in gens}
    out.generation_times = [(_utc(r.created_at), r.generation) for r in gens]  # type: ignore[misc]
    for r in gens:
        if r.query_id:
            out.generation_of_query[r.query_id] = r.generation
    if number_of:
        for r in conn.execute(select(runs.c.query_id, runs.c.generation_id).distinct()
                              .where(runs.c.pipeline == pipeline, runs.c.consumer_group == group,
                                     runs.c.generation_id.in_(sorted(number_of)))):
            out.generation_of_query.setdefault(r.query_id, number_of[r.generation_id])
    # A topic whose Kafka id changed between two generations was re-created: a new incarnation.
    seen_ids: dict[str, str] = {}
    for r in gens:
        for t, tid in (r.topic_ids or {}).items():
            if t in seen_ids and seen_ids[t] != tid:
                out.topic_boundaries.setdefault(t, []).append(r.generation)
            seen_ids[t] = tid

    f = findings
    found = conn.execute(select(f.c.id, f.c.kind, f.c.topic, f.c.partition, f.c.expected_offset, f.c.actual_offset,
                                f.c.details, f.c.generation_id, f.c.run_id, f.c.message, f.c.query_id, f.c.batch_id)
                         .where(f.c.pipeline == pipeline, f.c.consumer_group == group).order_by(f.c.id)).all()
    # Runs of a checkpoint re-created in place (a job started by hand on a lost checkpoint): what they
    # read again is outside the ledger's control, so their ``regression`` findings explain nothing.
    recreated = [r.id for r in gens if r.reason == "checkpoint_recreated"]
    by_hand = set(conn.execute(select(runs.c.run_id).where(runs.c.generation_id.in_(recreated))).scalars()) \
        if recreated else set()
    ended: dict[tuple[str, int, int], int] = {}  # (topic, partition, generation) -> where the old incarnation stood
    for r in found:
        details = r.details or {}
        if r.kind == "data_loss" and details.get("kind") in NEW_INCARNATION and r.topic is not None \
                and r.partition is not None and r.generation_id in number_of:
            gen = number_of[r.generation_id]
            out.boundaries.setdefault((r.topic, r.partition), []).append(gen)
            if r.expected_offset is not None:
                ended[(r.topic, r.partition, gen)] = r.expected_offset
    for b in out.boundaries.values():
        b.sort()

    positions_now = {(r.topic, r.partition): r.next_offset for r in conn.execute(
        select(positions.c.topic, positions.c.partition, positions.c.next_offset)
        .where(positions.c.pipeline == pipeline, positions.c.consumer_group == group))}
    for (t, p), offset in positions_now.items():
        out.positions[(t, p, len(out.bounds(t, p)))] = offset
    for (t, p, gen), offset in ended.items():
        out.positions.setdefault((t, p, out.incarnation(t, p, gen) - 1), offset)

    rewinds: list[tuple[Any, int]] = []
    flagged_runs: dict[str, list[tuple[str | None, int | None, Reason]]] = {}
    foreign_from: dict[tuple[str, int | None], int] = {}  # (run id, finding id) -> its first foreign batch
    for r in found:
        details = r.details or {}
        gen = number_of.get(r.generation_id) if r.generation_id is not None else None
        if r.kind == "data_loss" and details.get("kind") in (READ_SHORTFALL, ROWS_UNKNOWN):
            if topic is None or any(x[0] == topic for x in details.get("ranges") or ()):
                out.shortfalls.append((r.id, r.query_id, r.batch_id, details))
            continue
        if r.kind == "data_loss":
            why = Reason("data_loss", r.id, _short(r.message))
            if details.get("kind") in NEW_INCARNATION:
                if r.topic is not None and r.partition is not None and gen is not None:
                    inc = out.incarnation(r.topic, r.partition, gen)
                    out.context.setdefault((r.topic, r.partition, inc), []).append(why)
                continue
            if r.topic is not None and r.partition is not None and r.expected_offset is not None \
                    and r.actual_offset is not None:
                e = move_explanation(r.topic, r.partition, r.expected_offset, r.actual_offset, why,
                                     out.incarnation(r.topic, r.partition, gen or 0))
                if e is not None:
                    out.explanations.append(e)
        elif r.kind == "state_rewind" and gen is not None:
            rewinds.append((r, gen))
        elif r.kind == "sink_behind" and gen is not None:
            # The restart started where the sink furthest behind stopped: the other sinks skipped what
            # they held (``rules.sink_ahead.sink_plan``), so that stretch is read again on purpose.
            why = Reason("sink_behind", r.id, _short(r.message))
            for m in details.get("moved") or ():
                e = move_explanation(str(m["topic"]), int(m["partition"]), m.get("position"), int(m["starts_at"]),
                                     why, out.incarnation(str(m["topic"]), int(m["partition"]), gen))
                if e is not None:
                    out.explanations.append(e)
        elif r.kind in RUN_FINDINGS and r.run_id and not (r.kind == "regression" and r.run_id in by_hand):
            flagged_runs.setdefault(r.run_id, []).append(
                (None if r.kind == "foreign_run" else r.topic, None if r.kind == "foreign_run" else r.partition,
                 Reason(r.kind, r.id, _short(r.message))))
            if r.kind == "foreign_run" and r.batch_id is not None:
                # A run becomes foreign when a newer generation opens under it (a zombie): the batches
                # it committed before, while it was the authority, are not explained by it.
                foreign_from[(r.run_id, r.id)] = r.batch_id
        elif r.kind == "gap" and r.topic is not None and r.partition is not None \
                and r.expected_offset is not None and r.actual_offset is not None:
            out.gap_findings[(r.topic, r.partition, r.expected_offset, r.actual_offset)] = r.id
        elif r.kind in ("new_partition", "removed_partition") and r.topic is not None and r.partition is not None:
            inc = out.incarnation(r.topic, r.partition, gen or 0)
            out.context.setdefault((r.topic, r.partition, inc), []).append(Reason(r.kind, r.id, _short(r.message)))

    # Restarts that moved positions on purpose: a stateful rewind, a checkpoint imported over history.
    adopted = [r for r in gens if r.reason == "adopted" and r.resolved_offsets]
    adoption_finding = {r.generation_id: r.id for r in found if r.kind == "checkpoint_adopted"}
    for r, gen in rewinds:
        created = next(x.created_at for x in gens if x.generation == gen)
        before = _ends_before(conn, pipeline, group, created, topic)
        floor = (r.details or {}).get("event_time_floor")
        why = Reason("state_rewind", r.id, f"stateful restart, event-time floor {floor}" if floor else "stateful restart")
        for key, offset in ((r.details or {}).get("offsets") or {}).items():
            t, _, p = str(key).rpartition(":")
            if not t or not p.isdigit():
                continue
            e = move_explanation(t, int(p), before.get((t, int(p))), int(offset), why,
                                 out.incarnation(t, int(p), gen))
            if e is not None:
                out.explanations.append(e)
    for r in adopted:
        before = _ends_before(conn, pipeline, group, r.created_at, topic)
        if not before:
            continue
        why = Reason("checkpoint_adopted", adoption_finding.get(r.id), f"checkpoint imported as generation {r.generation}")
        for t, parts in r.resolved_offsets.items():
            for p, offset in parts.items():
                e = move_explanation(t, int(p), before.get((t, int(p))), int(offset), why,
                                     out.incarnation(t, int(p), r.generation))
                if e is not None:
                    out.explanations.append(e)

    _failback_explanations(conn, pipeline, group, topic, gens, found, out)

    for reset in conn.execute(select(resets.c.id, resets.c.actor, resets.c.reason, resets.c.mode, resets.c.created_at)
                              .where(resets.c.pipeline == pipeline, resets.c.consumer_group == group,
                                     resets.c.dry_run.is_(False)).order_by(resets.c.id)).all():
        parts = conn.execute(select(reset_partitions.c.topic, reset_partitions.c.partition,
                                    reset_partitions.c.before_next_offset, reset_partitions.c.after_next_offset)
                             .where(reset_partitions.c.reset_id == reset.id)).all()
        at = out.generation_at(_utc(reset.created_at))
        incs = {(x.topic, x.partition): out.incarnation(x.topic, x.partition, at) for x in parts}
        out.explanations.extend(reset_explanations(reset.id, reset.actor, reset.reason, reset.mode,
                                                   [tuple(x) for x in parts], incs))  # type: ignore[misc]

    # History prune deleted is swept as reads (``verify_rows.pruned_rows``); only islands 0009 recorded,
    # which 0014 could not convert, still merely account for the gaps they cover.
    pr = pruned_ranges
    for r in conn.execute(select(pr.c.id, pr.c.query_id, pr.c.topic, pr.c.partition, pr.c.from_offset,
                                 pr.c.until_offset, pr.c.from_batch_id, pr.c.until_batch_id, pr.c.pruned_at,
                                 pr.c.first_batch_time)
                          .where(pr.c.pipeline == pipeline, pr.c.consumer_group == group,
                                 pr.c.counts_reads.is_(False), pr.c.from_offset.is_not(None),
                                 *([pr.c.topic == topic] if topic is not None else []))
                          .order_by(pr.c.id)):
        pruned_at = _utc(r.pruned_at)
        when = pruned_at.isoformat(timespec="seconds") if pruned_at is not None else "?"
        why = Reason("pruned", r.id, f"batches {r.from_batch_id}-{r.until_batch_id} of query {r.query_id}, "
                                     f"pruned {when}")
        gen = out.generation_of_query.get(r.query_id)
        if gen is None:
            gen = out.generation_at(_utc(r.first_batch_time))
        out.explanations.append(Explanation(r.topic, r.partition, r.from_offset, r.until_offset, "skip", why,
                                            out.incarnation(r.topic, r.partition, gen)))

    if flagged_runs:
        for r in conn.execute(select(batches.c.query_id, batches.c.batch_id, batches.c.run_id)
                              .where(batches.c.pipeline == pipeline, batches.c.consumer_group == group,
                                     batches.c.run_id.in_(sorted(flagged_runs)))):
            out.run_flags.setdefault((r.query_id, r.batch_id), []).extend(
                f for f in flagged_runs[r.run_id] if r.batch_id >= foreign_from.get((r.run_id, f[2].id), r.batch_id))
        # Pruned reads of a flagged run: under the batch ids their rows carry (``rules.pruned.island_reads``).
        for r in conn.execute(select(pruned_ranges.c.query_id, pruned_ranges.c.from_batch_id,
                                     pruned_ranges.c.until_batch_id, pruned_ranges.c.run_id).distinct()
                              .where(pruned_ranges.c.pipeline == pipeline, pruned_ranges.c.consumer_group == group,
                                     pruned_ranges.c.counts_reads.is_(True),
                                     pruned_ranges.c.run_id.in_(sorted(flagged_runs)))):
            for batch_id in {r.from_batch_id, r.until_batch_id}:
                out.run_flags.setdefault((r.query_id, batch_id), []).extend(
                    f for f in flagged_runs[r.run_id] if batch_id >= foreign_from.get((r.run_id, f[2].id), batch_id))
    if out.run_flags:
        out.unlanded = _unlanded(conn, pipeline, group, out.run_flags)
    if out.boundaries or out.topic_boundaries:
        out.query_started = {r.query_id: _utc(r.started) for r in conn.execute(  # type: ignore[misc]
            select(batches.c.query_id, func.min(batches.c.batch_time).label("started"))
            .where(batches.c.pipeline == pipeline, batches.c.consumer_group == group)
            .group_by(batches.c.query_id))}
        # A query whose first batches were pruned started when its first island did.
        for r in conn.execute(select(pruned_ranges.c.query_id, func.min(pruned_ranges.c.first_batch_time))
                              .where(pruned_ranges.c.pipeline == pipeline, pruned_ranges.c.consumer_group == group)
                              .group_by(pruned_ranges.c.query_id)):
            at = _utc(r[1])
            known = out.query_started.get(r.query_id)
            if at is not None and (known is None or at < known):
                out.query_started[r.query_id] = at
    if topic is not None:
        out.explanations = [e for e in out.explanations if e.topic == topic]
    return out


def _short(message: str | None) -> str:
    text = " ".join((message or "").split())
    return text if len(text) <= 160 else text[:157] + "..."


def _failback_explanations(conn: Connection, pipeline: str, group: str, topic: str | None, gens: Sequence[Any],
                           found: Sequence[Any], out: VerifyInputs) -> None:
    """Failing back onto a topic the pipeline read before re-reads it from the failover's start.

    Only where the failover generation's Kafka topic id is the one last recorded for that name (the
    original cluster's own topic; another cluster's topic is another incarnation anyway), and only
    re-reads: a failover never explains a skip. The ``failover`` finding states the bound.
    """
    finding_of = {r.generation_id: r.id for r in found if r.kind == "failover" and r.topic is None}
    last_ids: dict[str, str] = {}
    for r in gens:
        ids = r.topic_ids or {}
        same = {t for t, tid in ids.items() if last_ids.get(t) == tid}
        if r.reason == "failover" and r.resolved_offsets and same:
            before = _ends_before(conn, pipeline, group, r.created_at, topic)
            why = Reason("failover", finding_of.get(r.id), f"failed back as generation {r.generation}")
            for t, parts in r.resolved_offsets.items():
                for p, offset in (parts.items() if t in same else ()):
                    done = before.get((t, int(p)))
                    if done is not None and int(offset) < done:
                        e = move_explanation(t, int(p), done, int(offset), why, out.incarnation(t, int(p), r.generation))
                        if e is not None:
                            out.explanations.append(e)
        last_ids.update(ids)


def _ends_before(conn: Connection, pipeline: str, group: str, at: datetime,
                 topic: str | None) -> dict[tuple[str, int], int]:
    """Per partition, the furthest offset read by batches before ``at`` (where a restart found the history)."""
    b = batch_offsets
    stmt = (select(b.c.topic, b.c.partition, func.max(b.c.until_offset))
            .where(b.c.pipeline == pipeline, b.c.consumer_group == group, b.c.batch_time < at)
            .group_by(b.c.topic, b.c.partition))
    if topic is not None:
        stmt = stmt.where(b.c.topic == topic)
    ends = {(t, p): int(u) for t, p, u in conn.execute(stmt)}
    # Pruned history ended there too: the islands whose last batch ran before ``at`` (0014 records it).
    pr = pruned_ranges
    islands = (select(pr.c.topic, pr.c.partition, func.max(pr.c.until_offset))
               .where(pr.c.pipeline == pipeline, pr.c.consumer_group == group, pr.c.last_batch_time < at)
               .group_by(pr.c.topic, pr.c.partition))
    if topic is not None:
        islands = islands.where(pr.c.topic == topic)
    for t, p, u in conn.execute(islands):
        ends[(t, p)] = max(ends.get((t, p), int(u)), int(u))
    return ends
