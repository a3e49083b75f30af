"""Runs and generations as the recorder sees them: a run's start, its checkpoint generation, its rows.

A collaborator of ``Recorder`` (``offset_ledger.ledger.recorder``): which generation a run is on
(``authority.match_generation``), the defaulted consumer group a run's own group takes over, and the
start a fresh run's first batch gets from its generation.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.engine import Connection

from offset_ledger.ledger import generations as gens
from offset_ledger.ledger.records import BatchRecord, Known, RunFacts, RunStart, Transaction, utc
from offset_ledger.ledger.tables import (
    checkpoint_generations,
    runs,
)
from offset_ledger.rules.authority import GenerationRef, claimed_by_other, match_generation, same_location
from offset_ledger.rules.liveness import INFERRED_RUN_PREFIXES

log = logging.getLogger("offset_ledger.ledger.recorder")


class RunBook:
    """The general path's bookkeeping of runs: ``insert`` the dialect's INSERT, ``known`` the recorder's cache."""

    def __init__(self, insert: Any, known: Known) -> None:
        self._insert = insert
        self.known = known

    def run_start(self, conn: Connection, rec: RunStart, txn: Transaction) -> None:
        generation_id = self._assign_generation(conn, rec.pipeline, rec.consumer_group, rec.query_id,
                                                rec.run_id, rec.checkpoint_location)
        row = {"run_id": rec.run_id, "query_id": rec.query_id, "pipeline": rec.pipeline,
               "consumer_group": rec.consumer_group, "query_name": rec.query_name,
               "app_version": rec.app_version, "checkpoint_location": rec.checkpoint_location,
               "started_at": utc(rec.started_at), "generation_id": generation_id}
        keys = ["query_name", "app_version", "checkpoint_location", "started_at", "generation_id"]
        if rec.beat_every_ms is not None:
            # Judged on the driver's beat from the start (its first beat counts from the start); the
            # heartbeat thread keeps beat_at fresh from then on.
            row.update(beat_every_ms=rec.beat_every_ms, beat_at=utc(rec.started_at))
            keys.append("beat_every_ms")
        stmt = self._insert(runs)
        # The start event is authoritative; a row made earlier from a batch only guessed these.
        stmt = stmt.on_conflict_do_update(
            index_elements=[runs.c.run_id], set_={k: stmt.excluded[k] for k in keys})
        conn.execute(stmt, [row])
        txn.runs[rec.run_id] = RunFacts(utc(rec.started_at), generation_id)

    def _assign_generation(self, conn: Connection, pipeline: str, group: str, query_id: str, run_id: str,
                           checkpoint_location: str | None) -> int | None:
        """The generation a new run is on (see ``authority.match_generation``); claims it for the query."""
        rows = conn.execute(select(checkpoint_generations.c.id, checkpoint_generations.c.location,
                                   checkpoint_generations.c.query_id)
                            .where(checkpoint_generations.c.pipeline == pipeline,
                                   checkpoint_generations.c.consumer_group == group)).all()
        if not rows and checkpoint_location:
            rows = self._adopt_defaulted_group(conn, pipeline, group, checkpoint_location)
        if not rows:
            return None
        seen = conn.execute(select(runs.c.run_id).where(runs.c.query_id == query_id, runs.c.run_id != run_id)
                            .limit(1)).first() is not None
        found = match_generation([GenerationRef(r.id, r.location, r.query_id) for r in rows],
                                 checkpoint_location=checkpoint_location, query_id=query_id,
                                 query_seen_before=seen)
        if found is None:
            return None
        if checkpoint_location and claimed_by_other(found, query_id):
            # Another query claimed the generation at this location: the checkpoint was re-created
            # in place (Spark keeps a query's id in its checkpoint). On the current generation that
            # is a new incarnation with its own generation; on an old one the run stays foreign.
            incarnation = gens.open_incarnation(conn, pipeline=pipeline, consumer_group=group, query_id=query_id,
                                                location=checkpoint_location)
            if incarnation is not None:
                self.known.generation_offsets.pop(incarnation, None)
                return incarnation
            return found.id
        if found.query_id is None:
            gens.claim_generation(conn, found.id, query_id)
        return found.id

    def _adopt_defaulted_group(self, conn: Connection, pipeline: str, group: str,
                               checkpoint_location: str) -> list[Any]:
        """A run reporting ``group`` on a generation the helper opened under a group it only defaulted:
        that group yields (``generations.adopt_defaulted_group``); the generations, now ``group``'s."""
        for g in gens.defaulted_generations(conn, pipeline, group):
            if same_location(checkpoint_location, g.location):
                gens.adopt_defaulted_group(conn, pipeline, g.consumer_group, group)
                self.known.latest.clear()
                return conn.execute(select(checkpoint_generations.c.id, checkpoint_generations.c.location,
                                           checkpoint_generations.c.query_id)
                                    .where(checkpoint_generations.c.pipeline == pipeline,
                                           checkpoint_generations.c.consumer_group == group)).all()
        return []

    def touch_run(self, conn: Connection, pipeline: str, group: str, query_id: str, run_id: str,
                   at: datetime, values: dict[str, Any], new_values: dict[str, Any] | None = None) -> None:
        """Update the run's row; make it when missing (from ``new_values``, default ``values``)."""
        done = conn.execute(update(runs).where(runs.c.run_id == run_id).values(**values))
        if done.rowcount == 0:
            # The listener was added after the query started: make the run row from what we know.
            stmt = self._insert(runs).on_conflict_do_nothing(index_elements=[runs.c.run_id])
            conn.execute(stmt, [{"run_id": run_id, "query_id": query_id, "pipeline": pipeline,
                                 "consumer_group": group, "started_at": utc(at), **(new_values or values)}])

    def end_query_runs(self, conn: Connection, query_id: str, run_id: str, at: datetime) -> None:
        """Spark reported run ``run_id`` of ``query_id`` ended: end the query's other records of it.

        The sink's and the watcher's runs of the query (they hear batches only, so nothing else would
        end them) whose last batch is not after the end; and earlier runs of the query silent since
        this run started (a SIGKILLed driver's: only one run writes a checkpoint at a time, and a live
        one posts an event at least every few seconds).
        """
        end = utc(at)
        if run_id.startswith(INFERRED_RUN_PREFIXES):
            return  # only Spark's own word ends other records (a restart's pass closes its own run only)
        started = select(runs.c.started_at).where(runs.c.run_id == run_id).scalar_subquery()
        heard = func.coalesce(runs.c.last_heartbeat_at, runs.c.started_at)
        inferred = or_(*(runs.c.run_id.like(f"{p}%") for p in INFERRED_RUN_PREFIXES))
        conn.execute(update(runs).where(
            runs.c.query_id == query_id, runs.c.run_id != run_id, runs.c.terminated_at.is_(None),
            or_(and_(inferred, heard <= end), and_(~inferred, runs.c.started_at < started, heard <= started)),
        ).values(terminated_at=end))

    def hear_duplicates(self, conn: Connection, dropped: list[BatchRecord]) -> None:
        """Runs whose batches another writer recorded first (the sink, in its own transaction) are
        alive all the same: their heartbeat and longest batch move, never backwards (a re-delivery)."""
        top = func.max if conn.dialect.name == "sqlite" else func.greatest
        last: dict[str, tuple[datetime, int | None]] = {}
        for rec in dropped:
            b = rec.batch
            at, longest = last.get(b.run_id, (utc(b.batch_time), b.duration_ms))
            last[b.run_id] = (max(at, utc(b.batch_time)), max(longest or 0, b.duration_ms or 0) or None)
        for run_id, (at, longest) in last.items():
            values: dict[str, Any] = {"last_heartbeat_at": func.coalesce(top(runs.c.last_heartbeat_at, at), at)}
            if longest is not None:
                values["max_batch_ms"] = func.coalesce(top(runs.c.max_batch_ms, longest), longest)
            conn.execute(update(runs).where(runs.c.run_id == run_id).values(**values))

    def ensure_runs(self, conn: Connection, recs: list[BatchRecord], txn: Transaction) -> None:
        """Know every run's start and generation (the position rules need them); make rows for unseen runs."""
        unknown = sorted({r.batch.run_id for r in recs} - set(self.known.runs) - set(txn.runs))
        if not unknown:
            return
        for r in conn.execute(select(runs.c.run_id, runs.c.started_at, runs.c.generation_id)
                              .where(runs.c.run_id.in_(unknown))):
            txn.runs[r.run_id] = RunFacts(utc(r.started_at), r.generation_id)
        missing: dict[str, dict[str, Any]] = {}
        for rec in recs:
            b = rec.batch
            if b.run_id in txn.runs or b.run_id in missing:
                continue
            # No start event (the listener came later, or lost it): no checkpoint location either.
            missing[b.run_id] = {"run_id": b.run_id, "query_id": b.query_id, "pipeline": rec.pipeline,
                                 "consumer_group": rec.consumer_group, "query_name": b.query_name,
                                 "started_at": utc(b.batch_time),
                                 "generation_id": self._assign_generation(conn, rec.pipeline, rec.consumer_group,
                                                                          b.query_id, b.run_id, None)}
        if missing:
            conn.execute(self._insert(runs).on_conflict_do_nothing(index_elements=[runs.c.run_id]),
                         list(missing.values()))
            for run_id, row in missing.items():
                txn.runs[run_id] = RunFacts(row["started_at"], row["generation_id"])

    def with_first_starts(self, conn: Connection, recs: list[BatchRecord], txn: Transaction) -> list[BatchRecord]:
        """Give ranges Spark reported without a start the start the run's generation resolved, where that
        is where Spark began: batch 0 of the query on a generation it claimed (a fresh checkpoint starts
        at the startingOffsets the plan resolved). The listener fills starts from the checkpoint first
        (``event_records.batch_starts``); anything else stays unknown (None), never assumed."""
        out = []
        for rec in recs:
            b = rec.batch
            gen_id = self.known.run(b.run_id, txn).generation_id
            if gen_id is None or b.batch_id != 0 or all(r.from_offset is not None for s in b.sources
                                                        for r in s.ranges):
                out.append(rec)
                continue
            starts = self._resolved_offsets(conn, gen_id)
            sources = tuple(
                replace(s, ranges=tuple(
                    replace(r, from_offset=starts.get((r.topic, r.partition))) if r.from_offset is None else r
                    for r in s.ranges))
                for s in b.sources)
            out.append(replace(rec, batch=replace(b, sources=sources)))
        return out

    def _resolved_offsets(self, conn: Connection, generation_id: int) -> dict[tuple[str, int], int]:
        cached = self.known.generation_offsets.get(generation_id)
        if cached is None:
            raw = conn.execute(select(checkpoint_generations.c.resolved_offsets)
                               .where(checkpoint_generations.c.id == generation_id)).scalar() or {}
            cached = {(t, int(p)): int(o) for t, parts in raw.items() for p, o in parts.items()}
            self.known.generation_offsets[generation_id] = cached
        return cached
