"""The position rules on the general path: gaps, who may move a position, and the findings that say why not.

A collaborator of ``Recorder`` (``offset_ledger.ledger.recorder``); the rules themselves are pure
(``offset_ledger.rules.authority.decide``), this applies them to the rows read under the pipeline lock.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.engine import Connection

from offset_ledger.ledger import position_store
from offset_ledger.ledger.activity import run_is_active
from offset_ledger.ledger.bulk_write import BulkWriter
from offset_ledger.ledger.locks import share_pipelines
from offset_ledger.ledger.position_store import Placed
from offset_ledger.ledger.records import (
    BatchRecord,
    Known,
    MovedPosition,
    Ends,
    batch_ends,
    finding_row,
    gaps,
    HeldPosition,
    offset_rows,
    position_ends,
    position_starts,
    RunFacts,
    Transaction,
    utc,
)
from offset_ledger.ledger.tables import (
    batch_offsets,
    batches,
    checkpoint_generations,
    findings,
    positions,
    resets,
    runs,
)
from offset_ledger.rules.authority import PositionState, decide
from offset_ledger.rules.model import BatchOffsets

log = logging.getLogger("offset_ledger.ledger.recorder")


class PositionRules:
    """The general path's gap checks and position moves: ``bulk`` writes the positions, ``known`` is the
    recorder's committed knowledge (the latest batch per query, runs, foreign runs reported)."""

    def __init__(self, bulk: BulkWriter, known: Known) -> None:
        self.bulk = bulk
        self.known = known

    def find_gaps(self, conn: Connection, recs: list[BatchRecord], txn: Transaction) -> None:
        """``gap`` findings of ``recs`` (inserted already, in this transaction) against their neighbours.

        Only batch ids next to each other are compared: ``batch_id - 1`` before, and ``batch_id + 1``
        after when it is recorded already (the batch is *late*: another writer, or a spool replay,
        recorded the batches after it first). Where the neighbour is not recorded (yet) there is
        nothing to compare: batches of one query arrive in any order from its writers, and the one
        missing is judged against both sides when it lands. Nor is the recorder's cache
        (``known.latest``) the batch before unless it is ``batch_id - 1``: another writer of the query
        may have recorded later ones since; recorded batches never change, so a cached ``batch_id - 1``
        saves the read. Under the exclusive pipeline lock every batch another writer inserted is
        committed, so visible here; this transaction's own are visible too.
        """
        written = {(r.batch.query_id, r.batch.batch_id) for r in recs}
        for rec in recs:
            b = rec.batch
            previous = self._previous(conn, b.query_id, b.batch_id, txn)
            if previous is not None:
                self._gap_findings(rec, txn, previous)
            if (b.query_id, b.batch_id + 1) not in written:  # else that one's own check covers the pair
                self._next_gap_findings(conn, rec, txn)
            latest = txn.latest.get(b.query_id) or self.known.latest.get(b.query_id)
            if latest is None or latest[0] < b.batch_id:
                txn.latest[b.query_id] = (b.batch_id, batch_ends(b))

    def _previous(self, conn: Connection, query_id: str, batch_id: int, txn: Transaction) -> tuple[int, Ends] | None:
        """The recorded batch ``batch_id - 1`` of ``query_id``: its id and ends (None: not recorded)."""
        for known in (txn.latest.get(query_id), self.known.latest.get(query_id)):
            if known is not None and known[0] == batch_id - 1:
                return known
        return self._batch_before(conn, query_id, batch_id)

    def _next_gap_findings(self, conn: Connection, rec: BatchRecord, txn: Transaction) -> None:
        """A late batch against the recorded ``batch_id + 1``: a ``gap`` where that one does not start
        where this one ends (the finding is about this batch, which came last; ``next_batch_id`` names it)."""
        b = rec.batch
        rows = conn.execute(select(batch_offsets.c.source_index, batch_offsets.c.topic, batch_offsets.c.partition,
                                   batch_offsets.c.from_offset)
                            .where(batch_offsets.c.query_id == b.query_id,
                                   batch_offsets.c.batch_id == b.batch_id + 1)).all()
        ends = batch_ends(b)
        for r in sorted(rows, key=lambda x: (x.source_index, x.topic, x.partition)):
            expected = ends.get((r.source_index, r.topic, r.partition))
            if r.from_offset is None or expected is None or expected == r.from_offset:
                continue
            lost = r.from_offset - expected
            txn.findings.append(finding_row(
                rec, txn, "gap",
                f"batch {b.batch_id + 1} of {r.topic}-{r.partition} starts at {r.from_offset} "
                f"but batch {b.batch_id} (recorded after it) ended at {expected}",
                r.topic, r.partition, expected, r.from_offset,
                {"next_batch_id": b.batch_id + 1, "source_index": r.source_index,
                 "skipped_records" if lost > 0 else "reread_records": abs(lost)}))

    def _gap_findings(self, rec: BatchRecord, txn: Transaction, previous: tuple[int, Ends]) -> None:
        """``gap`` findings of ``rec`` against the ends of the batch before it."""
        b = rec.batch
        prev_id, prev_ends = previous
        for s, r, since, expected in gaps(b, prev_ends):
            lost = since - expected
            txn.findings.append(finding_row(
                rec, txn, "gap",
                f"batch {b.batch_id} of {r.topic}-{r.partition} starts at {r.from_offset} "
                f"but batch {prev_id} ended at {expected}",
                r.topic, r.partition, expected, r.from_offset,
                {"previous_batch_id": prev_id, "source_index": s.source_index,
                 "skipped_records" if lost > 0 else "reread_records": abs(lost)}))

    def move_positions(self, conn: Connection, recs: list[BatchRecord], txn: Transaction) -> None:
        groups: dict[tuple[str, str], set[str]] = {}
        for rec in recs:
            groups.setdefault((rec.pipeline, rec.consumer_group), set()).update(
                r.topic for s in rec.batch.sources for r in s.ranges)
        # Shared pipeline lock first: a reset or a restart (new generation) of these pipelines is
        # either committed before we read the generation and positions, or waits for us.
        share_pipelines(conn, groups)
        current: dict[tuple[str, str], dict[tuple[str, int], HeldPosition]] = {}
        generation: dict[tuple[str, str], int | None] = {}
        for (pipeline, group), topics in sorted(groups.items()):
            # The topics' rows locked first (FOR UPDATE, byte-wise topic order: every writer's): a
            # concurrent reset of these positions waits for us, and we for it. Then read through the
            # view, which a writer role may read but not lock.
            position_store.lock(conn, pipeline, group, topics)
            stmt = (select(positions.c.topic, positions.c.partition, positions.c.next_offset,
                           positions.c.updated_at, positions.c.reset_id, positions.c.query_id,
                           positions.c.batch_id, resets.c.status.label("reset_status"))
                    .select_from(positions.outerjoin(resets, resets.c.id == positions.c.reset_id))
                    .where(positions.c.pipeline == pipeline, positions.c.consumer_group == group,
                           positions.c.topic.in_(sorted(topics))))
            current[(pipeline, group)] = {
                (r.topic, r.partition): HeldPosition(r.next_offset, utc(r.updated_at), r.reset_id, r.query_id,
                                             r.batch_id, r.reset_status == "pending")
                for r in conn.execute(stmt)}
            generation[(pipeline, group)] = conn.execute(
                select(func.max(checkpoint_generations.c.id))
                .where(checkpoint_generations.c.pipeline == pipeline,
                       checkpoint_generations.c.consumer_group == group)).scalar()
        changed: dict[tuple[str, str], set[tuple[str, int]]] = {key: set() for key in current}
        active: dict[str, bool] = {}
        for rec in recs:
            b = rec.batch
            group_key = (rec.pipeline, rec.consumer_group)
            pos, moved = current[group_key], changed[group_key]
            run = self.known.run(b.run_id, txn)
            current_generation = generation[group_key]
            starts = position_starts(b)
            late: bool | None = None  # asked once per batch, and only of one behind its query's position
            for topic, partition, until_offset in position_ends(b):
                key = (topic, partition)
                cur = pos.get(key)
                if (cur is not None and cur.query_id == b.query_id and cur.batch_id is not None
                        and cur.batch_id > b.batch_id):
                    # A later batch of the same query moved the position already: this one is late (a
                    # writer's copy landing after another writer's next batch, a spool replay, a hole
                    # filled from the checkpoint), not a regression, as long as it is the history the
                    # ledger holds (its gaps with its neighbours are find_gaps' business). One whose
                    # recorded row differs (an ``other`` finding) is judged as before.
                    if late is None:
                        late = b.recorded_by is not None or self._recorded_as(conn, b)
                    if late:
                        continue
                other = cur.query_id if cur is not None and cur.query_id not in (None, b.query_id) else None
                if other is not None and current_generation is None and other not in active:
                    active[other] = self._query_active(conn, other, txn.now)
                verdict = decide(
                    None if cur is None else PositionState(cur.next_offset, cur.query_id, cur.updated_at,
                                                           cur.reset_pending),
                    until_offset, query_id=b.query_id, run_started_at=run.started_at,
                    run_generation_id=run.generation_id, current_generation_id=current_generation,
                    other_query_active=bool(other and active.get(other)), from_offset=starts.get(key))
                if verdict == "reset_overtaken":
                    assert cur is not None
                    txn.findings.append(self._kept_finding(rec, txn, verdict, cur, topic, partition, until_offset))
                if verdict in ("move", "reset_overtaken"):
                    if cur is None:
                        pos[key] = HeldPosition(until_offset, txn.now, None, b.query_id, b.batch_id)
                    else:
                        cur.next_offset, cur.updated_at, cur.reset_id, cur.query_id, cur.batch_id = (
                            until_offset, txn.now, None, b.query_id, b.batch_id)
                        cur.reset_pending = False
                    moved.add(key)
                elif verdict == "foreign_run":
                    assert current_generation is not None
                    self._foreign_finding(conn, rec, txn, run, current_generation)
                    break  # one finding per run and generation says it all; no partition moves
                elif verdict == "regression" and b.recorded_by is not None:
                    continue  # read back from the authoritative checkpoint: history, never a zombie
                else:
                    assert cur is not None
                    txn.findings.append(self._kept_finding(rec, txn, verdict, cur, topic, partition, until_offset))
        for (pipeline, group), pos in current.items():
            keys = sorted(changed[(pipeline, group)])
            if not keys:
                continue
            # One write per topic row (0024); a partition keeps the generation that placed it before.
            position_store.write(conn, pipeline, group, {
                k: Placed(pos[k].next_offset, pos[k].updated_at, pos[k].query_id, pos[k].batch_id, None)
                for k in keys}, keep_generation=True)
            txn.moved.extend(MovedPosition(pipeline, group, k[0], k[1], pos[k].next_offset) for k in keys)

    @staticmethod
    def _recorded_as(conn: Connection, b: BatchOffsets) -> bool:
        """Whether the ledger's row of (query, batch) has exactly ``b``'s ranges."""
        rows = conn.execute(select(batch_offsets.c.source_index, batch_offsets.c.topic, batch_offsets.c.partition,
                                   batch_offsets.c.from_offset, batch_offsets.c.until_offset)
                            .where(batch_offsets.c.query_id == b.query_id, batch_offsets.c.batch_id == b.batch_id))
        return sorted(tuple(r) for r in rows) == offset_rows(b)

    def _query_active(self, conn: Connection, query_id: str, now: datetime) -> bool:
        """Whether ``query_id`` has a run that counts as active (``ledger.activity``)."""
        rows = conn.execute(select(runs.c.run_id, runs.c.query_id, runs.c.started_at, runs.c.last_heartbeat_at,
                                   runs.c.terminated_at, runs.c.max_batch_ms, runs.c.max_gap_ms, runs.c.beat_at,
                                   runs.c.beat_every_ms)
                            .where(runs.c.query_id == query_id)).all()
        return run_is_active(rows, now=now)

    def _foreign_finding(self, conn: Connection, rec: BatchRecord, txn: Transaction, run: RunFacts, generation_id: int) -> None:
        """One ``foreign_run`` finding per run and current generation, however many batches it reports."""
        b = rec.batch
        key = (b.run_id, generation_id)
        if key in self.known.foreign_reported or key in txn.foreign_reported:
            return
        txn.foreign_reported.add(key)
        if conn.execute(select(findings.c.id).where(findings.c.kind == "foreign_run", findings.c.run_id == b.run_id,
                                                    findings.c.generation_id == generation_id).limit(1)).first():
            return
        location = conn.execute(select(runs.c.checkpoint_location).where(runs.c.run_id == b.run_id)).scalar()
        current = conn.execute(select(checkpoint_generations.c.generation, checkpoint_generations.c.location)
                               .where(checkpoint_generations.c.id == generation_id)).first()
        where = f"checkpoint {location}" if location else "an unknown checkpoint"
        row = finding_row(
            rec, txn, "foreign_run",
            f"run {b.run_id} of query {b.query_id} reports batches from {where}, not from the current "
            f"checkpoint generation {current.generation if current else '?'} "
            f"({current.location if current else '?'}); its batches are history, positions are kept",
            None, None, None, None,
            {"run_id": b.run_id, "checkpoint_location": location, "run_generation_id": run.generation_id,
             "current_generation": current.generation if current else None,
             "current_location": current.location if current else None})
        row["generation_id"] = generation_id
        txn.findings.append(row)

    def update_runs(self, conn: Connection, recs: list[BatchRecord]) -> None:
        last: dict[str, tuple[int, datetime, int | None]] = {}
        for rec in recs:
            b = rec.batch
            prev = last.get(b.run_id)
            longest = b.duration_ms if prev is None or prev[2] is None else max(prev[2], b.duration_ms or 0)
            last[b.run_id] = (max(prev[0], b.batch_id) if prev else b.batch_id,
                              max(prev[1], utc(b.batch_time)) if prev else utc(b.batch_time), longest)
        sqlite = conn.dialect.name == "sqlite"
        for run_id, (batch_id, at, longest) in last.items():
            # The last batch id never goes back: a late batch (a spool replay of the run's older
            # batches) is not the run's newest. (The one-statement path never writes a late one.)
            values: dict[str, Any] = {
                "last_batch_id": func.coalesce(func.max(runs.c.last_batch_id, batch_id) if sqlite
                                               else func.greatest(runs.c.last_batch_id, batch_id), batch_id),
                "last_heartbeat_at": at}
            if longest is not None:
                values["max_batch_ms"] = func.coalesce(
                    func.max(runs.c.max_batch_ms, longest) if conn.dialect.name == "sqlite"
                    else func.greatest(runs.c.max_batch_ms, longest), longest)
            conn.execute(update(runs).where(runs.c.run_id == run_id).values(**values))

    def _kept_finding(self, rec: BatchRecord, txn: Transaction, kind: str, cur: HeldPosition, topic: str, partition: int,
                      until_offset: int) -> dict[str, Any]:
        """The ``pending_reset``, ``shared_position`` or ``regression`` finding of a position ``rec`` did not
        move, or the ``reset_overtaken`` finding of one it moved past a pending reset."""
        b = rec.batch
        if kind == "reset_overtaken":
            return finding_row(
                rec, txn, kind,
                f"batch {b.batch_id} of query {b.query_id} moved {topic}-{partition} from {cur.next_offset}, "
                f"where pending reset {cur.reset_id} put it, to {until_offset} without starting there (a run "
                f"on the old checkpoint?); the reset stays pending until start_from_ledger applies it",
                topic, partition, cur.next_offset, until_offset,
                {"position_reset_id": cur.reset_id, "run_id": b.run_id})
        if kind == "pending_reset":
            return finding_row(
                rec, txn, kind,
                f"batch {b.batch_id} of query {b.query_id} ended {topic}-{partition} at {until_offset}, "
                f"but reset {cur.reset_id} is pending at {cur.next_offset}; position kept",
                topic, partition, cur.next_offset, until_offset,
                {"position_reset_id": cur.reset_id, "run_id": b.run_id})
        if kind == "shared_position":
            return finding_row(
                rec, txn, kind,
                f"batch {b.batch_id} of query {b.query_id} ended {topic}-{partition} at {until_offset}, but "
                f"query {cur.query_id}, still active, records the same partition of this pipeline; position "
                f"kept at {cur.next_offset} (give each query its own pipeline: pipeline= may map query names)",
                topic, partition, cur.next_offset, until_offset,
                {"position_query_id": cur.query_id, "position_batch_id": cur.batch_id, "run_id": b.run_id})
        return finding_row(
            rec, txn, kind,
            f"batch {b.batch_id} of query {b.query_id} ended {topic}-{partition} at {until_offset}, "
            f"behind the current position {cur.next_offset}; position kept",
            topic, partition, cur.next_offset, until_offset,
            {"position_query_id": cur.query_id, "position_batch_id": cur.batch_id,
             "position_reset_id": cur.reset_id, "run_id": b.run_id})

    @staticmethod
    def _batch_before(conn: Connection, query_id: str, batch_id: int) -> tuple[int, Ends] | None:
        """The recorded batch ``batch_id - 1`` of ``query_id`` with its ends, None when not recorded."""
        prev = batch_id - 1
        if conn.execute(select(batches.c.id).where(batches.c.query_id == query_id,
                                                   batches.c.batch_id == prev)).first() is None:
            return None
        rows = conn.execute(select(batch_offsets.c.source_index, batch_offsets.c.topic,
                                   batch_offsets.c.partition, batch_offsets.c.until_offset)
                            .where(batch_offsets.c.query_id == query_id, batch_offsets.c.batch_id == prev))
        return prev, {(r.source_index, r.topic, r.partition): r.until_offset for r in rows}
