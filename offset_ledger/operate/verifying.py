"""``verify_pipeline``: has this pipeline read every record exactly once? (the verb behind
``offset-ledger verify`` and ``GET /api/v1/pipelines/{pipeline}/verify``).

Reads the ledger (``offset_ledger.ledger.verify_reads``: explanations, then the history as an
ordered stream from a server-side cursor, in one consistent snapshot), sweeps it with the pure rule
(``offset_ledger.rules.verify``) and names what borders each stretch (batches, their generations, the
recorder's own gap findings).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.ledger.sink_store import sink_held_ranges
from offset_ledger.ledger.verify_reads import VerifyInputs, read_inputs
from offset_ledger.ledger.verify_rows import merged, pruned_rows, stream_rows, tagged, unknown_start_rows
from offset_ledger.operate.inputs import check_topic
from offset_ledger.operate.known import require_topics
from offset_ledger.operate.operations import resolve_group
from offset_ledger.operate.verify_loss import attach, loss_stretches
from offset_ledger.rules.sink_ahead import SinkGap, sink_gaps
from offset_ledger.rules.verify import BatchRef, PartitionResult, Stretch, sort_key, summarize, verify_ranges

if TYPE_CHECKING:
    from offset_ledger.operate.operations import Operations


@dataclass
class VerifyReport:
    """The outcome: every partition swept, every stretch found, and how long it took."""

    pipeline: str
    consumer_group: str
    results: list[PartitionResult]
    inputs: VerifyInputs
    seconds: float
    topic: str | None = None
    #: loss stretches: (topic, partition, from) -> what ``operate.verify_loss`` found
    loss_notes: dict[tuple[str, int, int], str] = field(default_factory=dict)
    #: per sink: offsets another sink committed and it lacks (``rules.sink_ahead.sink_gaps``)
    sink_gaps: list[SinkGap] = field(default_factory=list)

    @property
    def stretches(self) -> list[Stretch]:
        return [s for r in self.results for s in r.stretches]

    @property
    def ok(self) -> bool:
        return all(s.explained for s in self.stretches) and not self.sink_gaps

    def generation_of(self, ref: BatchRef) -> int | None:
        """The checkpoint generation the batch's query ran in (None: not known to the ledger)."""
        return self.inputs.generation_of_query.get(ref.query_id)

    def notes(self, s: Stretch) -> list[str]:
        """What the ledger adds about a stretch (the recorder's own findings, pruned batches, ...)."""
        notes = []
        if s.kind == "loss" or (s.kind == "unknown" and s.before is None
                                and (s.topic, s.partition, s.from_offset) in self.loss_notes):
            note = self.loss_notes.get((s.topic, s.partition, s.from_offset))  # a row count unknown: issue 47
            return [note] if note else []
        if s.kind == "unknown":
            return ["the batch reported no start and its checkpoint's sources/<n>/0 was not read: whether it "
                    "began at the previous end (read once), later (a skip) or earlier (read twice) is unknown"]
        if s.kind == "gap":
            expected = self.inputs.gap_findings.get((s.topic, s.partition, s.from_offset, s.until_offset))
            if expected is not None:
                notes.append(f"the recorder saw it too: gap finding {expected}")
            b, a = s.before, s.after
            if b is not None and a is not None and b.query_id == a.query_id and a.batch_id > b.batch_id + 1:
                notes.append(f"batches {b.batch_id + 1}-{a.batch_id - 1} of query {b.query_id} are not in the "
                             "ledger (pruned, or never recorded)")
            if a is None:
                notes.append("between the last batch and the current position")
        else:
            found = self.inputs.gap_findings.get((s.topic, s.partition, s.until_offset, s.from_offset))
            if found is not None:
                notes.append(f"the recorder saw it too: gap finding {found}")
            if s.beyond_position:
                notes.append("at or after the current position: read already, and to be read again")
        return notes

    def summary(self) -> dict[str, Any]:
        counts: dict[str, Any] = {**summarize(self.results), "seconds": round(self.seconds, 3)}
        if self.sink_gaps:  # each an unexplained stretch of its own sink's output
            counts["unexplained"] += len(self.sink_gaps)
            counts["sinkGaps"] = len(self.sink_gaps)
        return counts

    def table_rows(self) -> list[dict[str, Any]]:
        """One row per stretch, for the table and CSV formats."""
        out = []
        for s in self.stretches:
            if s.kind == "unknown" and s.before is None and (s.topic, s.partition, s.from_offset) in self.loss_notes:
                borders = "read by " + ", ".join(_label(self, b) for b in s.batches)  # a row count unknown
            elif s.kind == "unknown":
                borders = (f"after {_label(self, s.before)}; " if s.before else "") + \
                    "start unknown: " + ", ".join(_label(self, b) for b in s.batches)
            elif s.kind == "gap":
                around = [f"after {_label(self, s.before)}" if s.before else None,
                          f"before {_label(self, s.after)}" if s.after else "before the position"]
                borders = "; ".join(x for x in around if x)
            else:
                borders = "read by " + ", ".join(_label(self, b) for b in s.batches)
            out.append({
                "status": "explained" if s.explained else "UNEXPLAINED", "topic": s.topic,
                "partition": s.partition, "incarnation": s.incarnation, "fromOffset": s.from_offset,
                "untilOffset": s.until_offset, "records": s.records, "kind": s.kind, "times": s.times,
                "explanation": "; ".join(r.label() for r in s.reasons) or None, "borders": borders,
                "notes": "; ".join(self.notes(s)) or None,
            })
        for g in self.sink_gaps:
            out.append({
                "status": "UNEXPLAINED", "topic": g.topic, "partition": g.partition, "incarnation": 0,
                "fromOffset": g.from_offset, "untilOffset": g.until_offset, "records": g.until_offset - g.from_offset,
                "kind": "sink_gap", "times": 0, "explanation": None,
                "borders": f"sink {g.sink} lacks it; held by {', '.join(g.held_by)}", "notes": g.message(),
            })
        return out


def _label(report: VerifyReport, ref: BatchRef | None) -> str:
    if ref is None:
        return "-"
    generation = report.generation_of(ref)
    gen = f" (gen {generation})" if generation is not None else ""
    return f"batch {ref.batch_id} of {ref.query_id[:8]}{gen}"


def verify_pipeline(ops: Operations, pipeline: str, consumer_group: str | None = None, *,
                    topic: str | None = None) -> VerifyReport:
    """Sweep the pipeline's whole history (one consumer group: the named one, else its only one)."""
    if topic is not None:
        check_topic(topic)
    started = time.perf_counter()
    try:
        with ops.engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                # One snapshot for the explanations and the streamed history; a read-only transaction.
                conn = conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
            with conn.begin():
                group = resolve_group(conn, pipeline, consumer_group)
                if topic is not None:  # a typo would otherwise verify 0 partitions: "read exactly once"
                    require_topics(conn, pipeline, group, [topic])
                inputs = read_inputs(conn, pipeline, group, topic)
                # Pruned history is swept as the reads it was: a prune never changes the answer. On a
                # tie an unknown start goes first, as it did among the rows before they were pruned.
                side = sorted([*unknown_start_rows(conn, pipeline, group, topic),
                               *pruned_rows(conn, pipeline, group, topic)],
                              key=lambda r: (*sort_key(r), r.from_offset is not None))
                rows = tagged(merged(stream_rows(conn, pipeline, group, topic), side), inputs)
                results = list(verify_ranges(rows, inputs.explanations, inputs.positions))
                gaps = _sink_gaps(conn, pipeline, group, topic)
    except SQLAlchemyError as exc:
        raise translate_db_error(exc, "verifying the history") from exc
    loss_notes: dict[tuple[str, int, int], str] = {}
    if inputs.shortfalls:
        # Batches that read fewer rows than they spanned: Kafka says what explains them (after the snapshot).
        check = loss_stretches(inputs.shortfalls, ops.kafka if ops.has_kafka else None)
        attach(results, [s for _, s in check.stretches])
        loss_notes = check.notes
    return VerifyReport(pipeline, group, results, inputs, time.perf_counter() - started, topic, loss_notes, gaps)


def _sink_gaps(conn: Any, pipeline: str, group: str, topic: str | None) -> list[SinkGap]:
    """Each sink's output judged on its own: what another sink committed and it lacks, one partition at a time."""
    out: list[SinkGap] = []
    key: tuple[str, int] | None = None
    held: dict[str, list[tuple[int, int]]] = {}
    for r in sink_held_ranges(conn, pipeline, group, topic):
        if (r.topic, r.partition) != key:
            if key is not None:
                out += sink_gaps(key[0], key[1], held)
            key, held = (r.topic, r.partition), {}
        held.setdefault(r.sink, []).append((int(r.from_offset), int(r.until_offset)))
    if key is not None:
        out += sink_gaps(key[0], key[1], held)
    return out
