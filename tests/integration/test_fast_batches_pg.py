"""Folded batches in one round trip on real Postgres: the same ledger as the general path, always.

A writer that fell behind hands the recorder several queued events at once. Plain batches of one
pipeline then go as one string (one EXECUTE of the prepared statement each); anything a rule must
explain aborts the string and the general path writes the lot. The oracle is the general path
itself: the same events, cut into the same record() calls, through a recorder with the one-round-
trip path switched off, must leave the same rows and say the same things. Hypothesis draws the
events (gaps, a zombie query ahead, re-deliveries, conflicting re-deliveries, batches out of order,
new partitions, pending resets between calls) and the cuts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import insert, select, update
from sqlalchemy.engine import Engine

from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.fast_batch import FastBatchPath
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.records import BatchRecord, RunStart
from offset_ledger.ledger.tables import (
    batch_offsets,
    batches,
    findings,
    positions,
    resets,
    runs,
)
from offset_ledger.rules.model import BatchOffsets, PartitionRange, SourceProgress
from tests.unit.ledger.test_recorder_sqlite import T0


@pytest.fixture(scope="module")
def engine(stack) -> Iterator[Engine]:  # type: ignore[no-untyped-def]
    from tests.integration.conftest import fresh_database

    with fresh_database(stack, "fast_batches_pg") as dsn:
        eng = make_engine(dsn)
        ensure_schema(eng)
        yield eng
        eng.dispose()


# ---------------------------------------------------------------------------- the events, as plain data

# ("start", query, run, minutes after T0) | ("batch", query, run, batch id, {(topic, part): (from, until)})
# | ("reset", partition, next offset) — a pending reset placed between two record() calls
Step = tuple


@st.composite
def scenarios(draw) -> tuple[list[list[Step]], list[Step]]:  # type: ignore[no-untyped-def]
    """Calls (each a list of events handed to one record()) and the resets placed after some calls."""
    events: list[Step] = [("start", "q1", "r1", -1)]
    ends = {("t", 0): 0, ("t", 1): 0}
    if draw(st.booleans()):
        ends[("u", 0)] = 0  # a query reading two topics: a batch's ranges are then two rows, not one
    batch_id = 0
    history: list[Step] = []
    zombie = False
    omitted = False  # the last batch did not read t-1
    script: list[str] = []  # kinds that must come next
    for _ in range(draw(st.integers(3, 14))):
        kind = script.pop(0) if script else draw(st.sampled_from(
            ["next"] * 5 + ["gap", "gap", "zombie", "redeliver", "conflict", "swap", "new_partition", "restart",
                            "omit", "rewind", "back_and_on", "back_and_on"]))
        if kind == "back_and_on":
            # t-1 left out, then read again from below where it last ended, then on past it: the
            # middle batch is a regression even when a later batch of the same call ends further.
            kind, script = "omit", ["rewind", "next", *script]
        if kind == "new_partition" and ("t", 2) not in ends:
            ends[("t", 2)] = 0
            kind = "next"
        if kind == "zombie" and not zombie:
            # Another query of the pipeline runs ahead on t-0: q1's later batches there regress.
            zombie = True
            ahead = ends[("t", 0)] + draw(st.integers(1, 8))
            events += [("start", "qz", "rz", -2),
                       ("batch", "qz", "rz", 0, {("t", 0): (None, ahead)}, (None, 0, None, None))]
            continue
        if kind == "redeliver" and history:
            events.append(draw(st.sampled_from(history)))
            continue
        if kind == "conflict" and history:
            old = draw(st.sampled_from(history))
            changed = {k: (f, u + 1) for k, (f, u) in old[4].items()}
            events.append(old[:4] + (changed,) + old[5:])
            continue
        if kind == "restart":
            # A new run of the query (same checkpoint): its batches go on from the same ends.
            run = f"r{len(events)}"
            events.append(("start", "q1", run, draw(st.integers(0, 80))))  # before or after a reset
        run = next(e[2] for e in reversed(events) if e[0] == "start" and e[1] == "q1")
        ranges = {}
        for key, end in ends.items():
            if kind == "omit" and key == ("t", 1) and batch_id > 0:
                continue  # a batch that did not read t-1: the next one's start there is not compared
            start = None if batch_id == 0 else end
            if kind == "gap" and key == ("t", 1) and batch_id > 0:
                start = end + draw(st.integers(1, 3))
            if kind == "rewind" and key == ("t", 1) and omitted:
                start = max(0, end - draw(st.integers(1, 4)))  # lower than where t-1 last ended
            until = (start or 0) + draw(st.integers(0, 6))
            ranges[key] = (start, until)
            ends[key] = until
        omitted = ("t", 1) not in ranges
        # What else a progress event carries: duration, a batch time that may even go back (a
        # clock step), watermark and state rows of a stateful query.
        extra = (draw(st.none() | st.integers(1, 900)), draw(st.integers(-90, 90)),
                 draw(st.none() | st.integers(0, 60)), draw(st.none() | st.integers(0, 10**6)))
        step = ("batch", "q1", run, batch_id, ranges, extra)
        batch_id += 1
        history.append(step)
        if kind == "swap" and len(events) >= 1 and events[-1][0] == "batch":
            events.insert(len(events) - 1, step)  # this batch arrives before the one before it
        else:
            events.append(step)
    # Cut into record() calls: runs of 1-6 events.
    calls: list[list[Step]] = []
    i = 0
    while i < len(events):
        n = draw(st.integers(1, 6))
        calls.append(events[i:i + n])
        i += n
    resets_after = draw(st.lists(st.tuples(st.integers(0, len(calls) - 1), st.integers(0, 1), st.integers(0, 30)),
                                 max_size=2, unique_by=lambda r: r[0]))
    return calls, resets_after


def _record(prefix: str, step: Step) -> RunStart | BatchRecord:
    pipeline = f"{prefix}-orders"
    if step[0] == "start":
        _, query, run, minutes = step
        return RunStart(pipeline, pipeline, f"{prefix}-{query}", f"{prefix}-{run}", "orders",
                        T0 + timedelta(minutes=minutes), app_version="1")
    _, query, run, batch_id, ranges, *extra = step
    duration_ms, seconds, watermark, state_rows = extra[0] if extra else (None, 0, None, None)
    parts = tuple(PartitionRange(t, p, f, u) for (t, p), (f, u) in sorted(ranges.items()))
    at = T0 + timedelta(minutes=30 + batch_id, seconds=seconds)
    return BatchRecord(pipeline, pipeline, BatchOffsets(
        f"{prefix}-{query}", f"{prefix}-{run}", "orders", batch_id, at,
        sum(u - (f or 0) for f, u in ranges.values()),
        (SourceProgress(0, "KafkaV2[Subscribe[t]]", parts, sum(u - (f or 0) for f, u in ranges.values())),),
        duration_ms=duration_ms,
        watermark=None if watermark is None else at - timedelta(minutes=watermark),
        event_time_min=None if watermark is None else at - timedelta(minutes=watermark + 5),
        event_time_max=None if watermark is None else at,
        state_rows_total=state_rows, state_rows_updated=None if state_rows is None else state_rows // 3,
        state_rows_dropped_by_watermark=None if state_rows is None else state_rows % 7))


def _place_reset(engine: Engine, prefix: str, partition: int, offset: int, at_minutes: int) -> None:
    pipeline = f"{prefix}-orders"
    with engine.begin() as conn:
        reset_id = conn.execute(insert(resets).values(
            pipeline=pipeline, consumer_group=pipeline, mode="offsets", actor="ops", dry_run=False, forced=True,
            created_at=T0 + timedelta(minutes=at_minutes), status="pending").returning(resets.c.id)).scalar_one()
        conn.execute(update(positions).where(positions.c.pipeline == pipeline, positions.c.partition == partition)
                     .values(next_offset=offset, reset_id=reset_id, updated_at=T0 + timedelta(minutes=at_minutes)))


def _tables(engine: Engine, prefix: str) -> dict:
    """The pipeline's rows with its prefix taken off (the two sides differ only by it)."""
    pipeline = f"{prefix}-orders"

    with engine.connect() as conn:
        # Reset ids are the server's; a message names one, so it is named by its order here.
        ids = conn.execute(select(resets.c.id).where(resets.c.pipeline == pipeline).order_by(resets.c.id)).scalars()
        nth = {str(reset_id): str(i) for i, reset_id in enumerate(ids)}

        def bare(value):  # type: ignore[no-untyped-def]
            if not isinstance(value, str):
                return value
            value = re.sub(r"reset (\d+)", lambda m: f"reset #{nth.get(m.group(1), m.group(1))}", value)
            return value.replace(f"{prefix}-", "")

        return {
            "batches": sorted((bare(r.query_id), r.batch_id, bare(r.run_id), r.input_rows, r.batch_time, r.watermark,
                               r.event_time_min, r.event_time_max, r.state_rows_total, r.state_rows_updated,
                               r.state_rows_dropped_by_watermark, r.source)
                              for r in conn.execute(select(batches).where(batches.c.pipeline == pipeline))),
            "offsets": sorted((bare(r.query_id), r.batch_id, r.topic, r.partition, r.from_offset, r.until_offset,
                               r.batch_time)
                              for r in conn.execute(select(batch_offsets).where(batch_offsets.c.pipeline == pipeline))),
            "positions": sorted((r.topic, r.partition, r.next_offset, bare(r.query_id), r.batch_id, r.reset_id is None)
                                for r in conn.execute(select(positions).where(positions.c.pipeline == pipeline))),
            "findings": [(r.kind, r.topic, r.partition, bare(r.query_id), r.batch_id, r.expected_offset,
                          r.actual_offset, bare(r.message))
                         for r in conn.execute(select(findings).where(findings.c.pipeline == pipeline)
                                               .order_by(findings.c.id))],
            "runs": sorted((bare(r.run_id), r.last_batch_id, r.last_heartbeat_at, r.max_batch_ms)
                           for r in conn.execute(select(runs).where(runs.c.pipeline == pipeline))),
        }


class _Counter:
    def __init__(self) -> None:
        self.folded = 0  # calls of more than one batch the one-round-trip path wrote
        self.single = 0
        self.single_topic = 0  # of ``single``: batches that read one topic (their own statement)
        self.refused = 0


def _replay(engine: Engine, prefix: str, calls, resets_after, *, fast: bool) -> list:  # type: ignore[no-untyped-def]
    recorder = Recorder(engine)
    if not fast:
        recorder._fast = None
    said = []
    for i, call in enumerate(calls):
        out = recorder.record([_record(prefix, step) for step in call])
        said.append((out.batches_written, out.duplicates,
                     [(f.kind, f.topic, f.partition) for f in out.findings],
                     [(m.topic, m.partition, m.next_offset) for m in out.moved]))
        for after, partition, offset in resets_after:
            if after == i:
                _place_reset(engine, prefix, partition, offset, 40 + i)
    recorder.close()
    return said


@pytest.fixture
def counting(monkeypatch) -> _Counter:  # type: ignore[no-untyped-def]
    """Counts what the one-round-trip path did: folded several batches, wrote one, or refused."""
    seen = _Counter()
    record_fast = FastBatchPath.record

    def spy(self, conn, recs, txn):  # type: ignore[no-untyped-def]
        out = record_fast(self, conn, recs, txn)
        if out is None:
            seen.refused += 1
        elif len(recs) > 1:
            seen.folded += 1
        else:
            seen.single += 1
            seen.single_topic += len({r.topic for s in recs[0].batch.sources for r in s.ranges}) == 1
        return out

    monkeypatch.setattr(FastBatchPath, "record", spy)
    return seen


def test_folded_batches_leave_what_the_general_path_leaves(engine: Engine, counting: _Counter) -> None:
    examples = iter(range(10**6))  # every example (shrinking included) writes pipelines of its own

    @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(scenario=scenarios())
    def check(scenario) -> None:  # type: ignore[no-untyped-def]
        calls, resets_after = scenario
        n = next(examples)
        fast_said = _replay(engine, f"f{n}", calls, resets_after, fast=True)
        general_said = _replay(engine, f"g{n}", calls, resets_after, fast=False)
        assert fast_said == general_said
        assert _tables(engine, f"f{n}") == _tables(engine, f"g{n}")

    check()
    # The property held over all the ways the path can go, not just the general one: folded, one batch
    # of one topic, one batch of two, refused.
    assert (counting.folded > 0 and counting.single > counting.single_topic > 0
            and counting.refused > 0), vars(counting)


@pytest.mark.parametrize("cut", [1, 2], ids=["one-call", "after-a-committed-batch"])
def test_a_regression_inside_a_call_is_reported_though_its_last_batch_ends_past_it(
        engine: Engine, counting: _Counter, cut: int) -> None:
    """t-1 read to 20, left out, read again from 15 to 18 (behind), then on to 22: the general path
    reports the regression of the batch ending at 18; folding it with the one ending at 22 (with or
    without the batch that read to 20 in the same call) must not hide it."""
    t0, t1 = ("t", 0), ("t", 1)
    later = [("batch", "q1", "r1", 1, {t0: (5, 6), t1: (10, 20)}),
             ("batch", "q1", "r1", 2, {t0: (6, 7)}),
             ("batch", "q1", "r1", 3, {t0: (7, 8), t1: (15, 18)}),
             ("batch", "q1", "r1", 4, {t0: (8, 9), t1: (18, 22)})]
    calls = [[("start", "q1", "r1", -1), ("batch", "q1", "r1", 0, {t0: (None, 5), t1: (None, 10)})],
             *([later] if cut == 1 else [later[:1], later[1:]])]
    fast_said = _replay(engine, f"back{cut}-f", calls, [], fast=True)
    assert fast_said == _replay(engine, f"back{cut}-g", calls, [], fast=False)
    assert fast_said[-1][2] == [("regression", "t", 1)]
    assert _tables(engine, f"back{cut}-f") == _tables(engine, f"back{cut}-g")


def test_a_late_writer_folds_its_queue_into_one_round_trip(engine: Engine, counting: _Counter) -> None:
    """Twelve queued batches of 100 partitions: one call, one string, every row and position there."""
    before = counting.folded
    recorder = Recorder(engine)
    parts = {("t", p): (None, 10) for p in range(100)}
    steps = [("start", "q1", "r1", -1), ("batch", "q1", "r1", 0, parts)]
    recorder.record([_record("late", s) for s in steps])
    queued = [("batch", "q1", "r1", b, {("t", p): (10 * b, 10 * b + 10) for p in range(100)}) for b in range(1, 13)]
    out = recorder.record([_record("late", s) for s in queued])
    recorder.close()
    assert counting.folded == before + 1
    assert (out.batches_written, out.duplicates, out.findings) == (12, 0, ())
    assert [(m.topic, m.partition, m.next_offset) for m in out.moved] == [("t", p, 130) for p in range(100)]
    got = _tables(engine, "late")
    assert len(got["offsets"]) == 1300 and len(got["batches"]) == 13
    assert {(t, p, n) for t, p, n, *_ in got["positions"]} == {("t", p, 130) for p in range(100)}
    assert [run[:2] for run in got["runs"]] == [("r1", 12)] and got["findings"] == []


def test_two_queries_folding_into_one_pipeline_at_once_never_fail_and_keep_provenance(
        engine: Engine, counting: _Counter) -> None:
    """A zombie and the real query of one pipeline, each a writer folding its queue, at the same time.

    Their statements and the general path lock the same position rows; no call may fail (a deadlock
    would), every batch is recorded once, and every position names a recorded batch that ended it
    exactly there (or none moved it at all).
    """
    import random
    import threading

    parts = [("t", p) for p in range(20)]
    errors: list[BaseException] = []
    written: dict[str, int] = {}  # query -> batches it handed its recorder

    def writer(query: str, seed: int) -> None:
        rng = random.Random(seed)
        recorder = Recorder(engine)
        try:
            recorder.record([_record("race", ("start", query, f"run-{query}", -1)),
                             _record("race", ("batch", query, f"run-{query}", 0, {k: (None, 5) for k in parts}))])
            ends, batch_id = {k: 5 for k in parts}, 1
            for _ in range(25):
                steps = []
                for _ in range(rng.randint(1, 5)):
                    ranges = {k: (ends[k], ends[k] + rng.randint(0, 3)) for k in parts}
                    ends.update({k: u for k, (_, u) in ranges.items()})
                    steps.append(("batch", query, f"run-{query}", batch_id, ranges))
                    batch_id += 1
                recorder.record([_record("race", s) for s in steps])
            written[query] = batch_id
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            recorder.close()

    threads = [threading.Thread(target=writer, args=(q, i)) for i, q in enumerate(["q1", "qz"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    got = _tables(engine, "race")
    recorded = {(q, b) for q, b, *_ in got["batches"]}
    assert len(recorded) == len(got["batches"])  # once each
    assert recorded == {(q, b) for q, n in written.items() for b in range(n)}  # all of both
    ended = {(q, b, t, p): u for q, b, t, p, _, u, _ in got["offsets"]}
    for topic, partition, next_offset, query, batch_id, _ in got["positions"]:
        assert ended[(query, batch_id, topic, partition)] == next_offset
    assert counting.folded > 0


def test_the_general_path_and_the_one_statement_path_writing_the_same_batches_at_once_never_fail(
        engine: Engine, counting: _Counter) -> None:
    """The same query's batches written at once by two recorders: one by the general path only (a
    re-delivery, a watcher's replay), the other a listener on the one-statement path, which holds the
    pipeline lock exclusively. The general path takes that lock before it inserts a batch: one that
    inserted the batch first and then waited for the lock would deadlock with the statement waiting
    for that insert; and one that read the batch before its own while the statement was writing it
    took the one before that for the previous batch (a false gap: measured, 40 of 59 without the
    lock first); and one that judged a batch against the batch it last wrote itself, not the one
    before it in the ledger, found false gaps whenever the other had written that one. No call may
    fail (no deadlock), no finding, whatever the schedule (which of the two writes how many batches
    varies from run to run, and this one rarely shows the stale case: test_two_writers_gaps_pg
    forces the interleavings deterministically); every batch is
    recorded once and the positions end where the last batch ended."""
    import threading

    parts = [("t", p) for p in range(20)]
    steps: list[Step] = [("batch", "q1", "run-q1", 0, {k: (None, 5) for k in parts})]
    ends = {k: 5 for k in parts}
    for batch_id in range(1, 60):
        ranges = {k: (ends[k], ends[k] + 1 + (batch_id + k[1]) % 3) for k in parts}
        ends.update({k: u for k, (_, u) in ranges.items()})
        steps.append(("batch", "q1", "run-q1", batch_id, ranges))
    errors: list[BaseException] = []
    outcomes: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
    go = threading.Barrier(2)

    def writer(general_only: bool) -> None:
        recorder = Recorder(engine)
        if general_only:
            recorder._fast = None
        try:
            recorder.record([_record("same", ("start", "q1", "run-q1", -1)), _record("same", steps[0])])
            go.wait(30)
            for step in steps[1:]:
                out = recorder.record([_record("same", step)])
                outcomes[general_only].append((out.batches_written, out.duplicates))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            recorder.close()

    threads = [threading.Thread(target=writer, args=(general,)) for general in (True, False)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    got = _tables(engine, "same")
    assert [(q, b) for q, b, *_ in got["batches"]] == [("q1", b) for b in range(60)]  # once each
    assert {(t, p): n for t, p, n, *_ in got["positions"]} == ends
    assert sum(w for w, _ in outcomes[True] + outcomes[False]) == 59  # each batch written by one of them
    assert got["findings"] == []


def test_the_statement_runs_its_generic_plan_from_the_first_call_and_leaves_the_setting_alone(
        engine: Engine, counting: _Counter) -> None:
    """Postgres plans a prepared statement's first five executions afresh (custom plans: twice the write's
    cost, a lock on every index the planner looks at); the path asks for the generic plan from the first
    call, for this transaction only: the connection's other transactions keep the server's setting."""
    own = make_engine(str(engine.url.render_as_string(hide_password=False)), pool_size=1)
    try:
        with own.connect() as conn:
            default = conn.exec_driver_sql("SHOW plan_cache_mode").scalar_one()
        recorder = Recorder(own)
        parts = {**{("t", p): (None, 10) for p in range(8)}, ("u", 0): (None, 10)}
        recorder.record([_record("generic", s) for s in [("start", "q1", "r1", -1), ("batch", "q1", "r1", 0, parts)]])
        single_before, folded_before = counting.single, counting.folded

        def of_t(b: int) -> dict:
            return {("t", p): (10 * b, 10 * b + 10) for p in range(8)}

        for b in range(1, 8):  # seven one-batch calls of one topic, one of two, then a folded one
            recorder.record([_record("generic", ("batch", "q1", "r1", b, of_t(b)))])
        recorder.record([_record("generic", ("batch", "q1", "r1", 8, {**of_t(8), ("u", 0): (10, 20)}))])
        recorder.record([_record("generic", ("batch", "q1", "r1", b, of_t(b))) for b in range(9, 12)])
        recorder.close()
        assert (counting.single - single_before, counting.folded - folded_before) == (8, 1)
        with own.connect() as conn:  # the pool's one connection: the recorder's, with its prepared statements
            plans = dict(conn.exec_driver_sql(
                "SELECT name, ARRAY[generic_plans, custom_plans] FROM pg_prepared_statements").all())
            assert conn.exec_driver_sql("SHOW plan_cache_mode").scalar_one() == default
        assert plans == {"offset_ledger_record_topic_batch_v4": [7, 0], "offset_ledger_record_batch_v4": [1, 0],
                         "offset_ledger_record_batches_v4": [1, 0]}
    finally:
        own.dispose()
