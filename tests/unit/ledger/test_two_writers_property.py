"""Issue 47: the ledger's verdicts hold on every path: two writers in any interleaving, mixed sources.

One query reads one or two Kafka sources (each its own topic, one or two partitions) and maybe a
non-Kafka source (``rate``) with any number of rows, placed anywhere in Spark's ``sources`` list.
Some Kafka sources lose records in some batches (retention deleted them before the batch fetched
them: fewer rows than offsets spanned). Two writers record the query's true batches: the listener
(Spark's progress JSON, parsed) and a transactional sink (the batch under its own run, rows = the
span), each in its own order, some batches late, some delivered twice, their calls interleaved.

The oracle is the true history: exactly one ``data_loss`` finding per (batch, Kafka source) that
read fewer rows than it spanned, with the records it missed, and no other finding: no regression,
no gap (there is none), no conflict; every batch once; positions at the true last batch's ends.

The pure part (progress JSON -> parse -> read_shortfalls) runs in memory; the recorder runs on
SQLite here and on Postgres in tests/integration/test_two_writers_property_pg.py (``check_history``).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select
from sqlalchemy.engine import Engine

from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.recorder import Recorder, record_in_transaction
from offset_ledger.ledger.records import BatchRecord, RunStart
from offset_ledger.ledger.tables import batches, findings, positions, runs
from offset_ledger.rules.progress import parse_progress
from offset_ledger.rules.read_shortfall import read_shortfalls

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)
RATE = "RateStreamV2[rowsPerSecond=10, rampUpTimeSeconds=0, numPartitions=default"


@dataclass(frozen=True)
class KafkaRead:
    """One Kafka source of one true batch: its ranges and the rows it really read."""

    topic: str
    ranges: tuple[tuple[int, int, int], ...]  # (partition, from, until)
    rows: int

    @property
    def spanned(self) -> int:
        return sum(u - f for _, f, u in self.ranges)


@dataclass(frozen=True)
class History:
    """A query's true batches: per batch, each source in Spark's order (a KafkaRead, or an int: rate rows)."""

    batches: tuple[tuple[KafkaRead | int, ...], ...]

    def progress(self, query: str, run: str, batch_id: int) -> str:
        """Spark's progress JSON of a batch (what the listener hears)."""
        sources: list[dict[str, Any]] = []
        for s in self.batches[batch_id]:
            if isinstance(s, int):
                sources.append({"description": RATE, "startOffset": batch_id * 100, "endOffset": batch_id * 100 + s,
                                "numInputRows": s})
                continue
            sources.append({"description": f"KafkaV2[Subscribe[{s.topic}]]",
                            "startOffset": {s.topic: {str(p): f for p, f, _ in s.ranges}},
                            "endOffset": {s.topic: {str(p): u for p, _, u in s.ranges}},
                            "numInputRows": s.rows})
        total = sum(s if isinstance(s, int) else s.rows for s in self.batches[batch_id])
        return json.dumps({"id": query, "runId": run, "name": "orders", "batchId": batch_id,
                           "timestamp": (T0 + timedelta(seconds=batch_id)).isoformat().replace("+00:00", "Z"),
                           "numInputRows": total, "sources": sources})

    def losses(self) -> set[tuple[int, int, int]]:
        """(batch id, source index, records missed) of every Kafka source that read fewer rows than it spanned."""
        return {(b, i, s.spanned - s.rows) for b, srcs in enumerate(self.batches) for i, s in enumerate(srcs)
                if isinstance(s, KafkaRead) and s.rows < s.spanned}

    def last_ends(self) -> dict[tuple[str, int], int]:
        return {(s.topic, p): u for s in self.batches[-1] if isinstance(s, KafkaRead) for p, _, u in s.ranges}


@st.composite
def histories(draw: st.DrawFn) -> History:
    kafka = [(f"t{i}", draw(st.integers(1, 2))) for i in range(draw(st.integers(1, 2)))]
    rate_at = draw(st.none() | st.integers(0, len(kafka)))  # where the rate source sits among the sources
    ends = {(t, p): draw(st.integers(0, 1000)) for t, n in kafka for p in range(n)}
    out = []
    for _ in range(draw(st.integers(2, 6))):
        sources: list[KafkaRead | int] = []
        for topic, n in kafka:
            ranges = []
            for p in range(n):
                step = draw(st.integers(0, 12))
                ranges.append((p, ends[(topic, p)], ends[(topic, p)] + step))
                ends[(topic, p)] += step
            read = KafkaRead(topic, tuple(ranges), 0)
            lost = draw(st.just(0) | st.integers(0, read.spanned))  # often none lost
            sources.append(replace(read, rows=read.spanned - lost))
        if rate_at is not None:
            sources.insert(rate_at, draw(st.integers(0, 80)))
        if sum(s if isinstance(s, int) else s.rows for s in sources) == 0:
            # A batch that read nothing at all and spans something is the replay of a batch the job
            # skipped when it is its run's first (``Recorder._shortfall_findings``): keep one row read.
            spanning = [i for i, s in enumerate(sources) if isinstance(s, KafkaRead) and s.spanned]
            if spanning:
                s = sources[spanning[0]]
                assert isinstance(s, KafkaRead)
                sources[spanning[0]] = replace(s, rows=1)
        out.append(tuple(sources))
    return History(tuple(out))


def _order(draw: st.DrawFn, count: int) -> list[int]:
    """Every batch id at least once, mostly in order: some late (moved behind later ones), some twice."""
    order = list(range(count))
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.integers(0, count - 1))
        j = draw(st.integers(i, count - 1))
        order.insert(j, order.pop(i))  # batch order[i] arrives after the ones up to j: late
    for _ in range(draw(st.integers(0, 2))):
        order.insert(draw(st.integers(0, len(order))), draw(st.integers(0, count - 1)))  # a re-delivery
    return order


@st.composite
def cases(draw: st.DrawFn) -> tuple[History, list[tuple[str, list[int]]]]:
    """A history and the calls in order: ("listener", batch ids folded into one call) or ("sink", [id])."""
    history = draw(histories())
    count = len(history.batches)
    queues = {"listener": _order(draw, count), "sink": _order(draw, count)}
    calls: list[tuple[str, list[int]]] = []
    while queues["listener"] or queues["sink"]:
        writer = draw(st.sampled_from([w for w, q in queues.items() if q]))
        n = 1 if writer == "sink" else draw(st.integers(1, min(3, len(queues[writer]))))  # the sink: a batch a txn
        calls.append((writer, queues[writer][:n]))
        queues[writer] = queues[writer][n:]
    return history, calls


# ------------------------------------------------------------------ pure: the progress parse and the rule


@settings(max_examples=200, deadline=None)
@given(histories())
def test_each_kafka_source_is_judged_on_its_own_rows_whatever_the_other_sources_read(history: History) -> None:
    found = set()
    for b in range(len(history.batches)):
        for short in read_shortfalls(parse_progress(history.progress("q", "r", b))):
            assert short.source_index is not None and short.rows is not None and short.missing is not None
            found.add((b, short.source_index, short.missing))
    assert found == history.losses()


# ------------------------------------------------------------------ through the real recorder


_case = itertools.count()


def check_history(engine: Engine, history: History, calls: list[tuple[str, list[int]]]) -> None:
    """Record ``calls`` (listener: a Recorder over parsed progress; sink: its own transactions), then
    compare the ledger with the true history."""
    n = next(_case)
    pipeline, query, run, sink_run = f"p{n}", f"q{n}", f"r{n}", f"sink:q{n}"
    listener = Recorder(engine)
    listener.record([RunStart(pipeline, pipeline, query, run, "orders", T0)])
    with engine.begin() as conn:
        record_in_transaction(conn, [RunStart(pipeline, pipeline, query, sink_run, None, T0)], now=T0)
    for writer, ids in calls:
        parsed = [parse_progress(history.progress(query, run, b)) for b in ids]
        if writer == "listener":
            listener.record([BatchRecord(pipeline, pipeline, b) for b in parsed])
            continue
        # The sink's record: its run, rows = the offsets spanned (it counts none), recorded_by set.
        (b,) = parsed
        spanned = sum(r.until_offset - (r.from_offset or 0) for s in b.sources for r in s.ranges)
        copy = replace(b, run_id=sink_run, recorded_by="sink", input_rows=spanned,
                       sources=tuple(replace(s, input_rows=sum(r.until_offset - (r.from_offset or 0)
                                                               for r in s.ranges)) for s in b.sources))
        with engine.begin() as conn:
            record_in_transaction(conn, [BatchRecord(pipeline, pipeline, copy)], now=T0 + timedelta(minutes=1))
    listener.close()
    with engine.connect() as conn:
        rows = conn.execute(select(findings).where(findings.c.pipeline == pipeline).order_by(findings.c.id)).all()
        recorded = conn.execute(select(batches.c.batch_id).where(batches.c.query_id == query)).scalars().all()
        at = {(r.topic, r.partition): r.next_offset
              for r in conn.execute(select(positions).where(positions.c.pipeline == pipeline))}
        last = conn.execute(select(runs.c.last_batch_id).where(runs.c.run_id == run)).scalar()
    said = [(r.kind, r.batch_id, (r.details or {}).get("kind"), r.message) for r in rows]
    assert [s for s in said if s[0] != "data_loss"] == []  # no regression, no gap, no conflict
    assert all(r.run_id == run and r.details["kind"] == "read_shortfall" for r in rows), said
    assert {(r.batch_id, r.details["source_index"], r.details["missing"]) for r in rows} == history.losses()
    assert len(rows) == len(history.losses())
    assert sorted(recorded) == list(range(len(history.batches)))
    assert at == history.last_ends()
    first_writer: dict[int, str] = {}
    for w, ids in calls:
        for b in ids:
            first_writer.setdefault(b, w)
    mine = [b for b, w in first_writer.items() if w == "listener"]
    assert last == (max(mine) if mine else None)  # a run's last batch never goes back to a late one


@pytest.fixture(scope="module")
def shared_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path_factory.mktemp('two_writers') / 'ledger.db'}")
    ensure_schema(engine)
    yield engine
    engine.dispose()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases())
def test_two_writers_in_any_order_find_exactly_the_true_losses_on_sqlite(
        shared_sqlite: Engine, case: tuple[History, list[tuple[str, list[int]]]]) -> None:
    check_history(shared_sqlite, *case)
