"""Retention against real Postgres (and the embedded SQLite file): what prune deletes and keeps."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, insert, select
from sqlalchemy.engine import Engine

from offset_ledger.cli.main import main
from offset_ledger.errors import InvalidDuration
from offset_ledger.ledger import tables as t
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.prune import prune
from offset_ledger.rules.durations import parse_duration
from tests.partitioned import upgrade_narrow

NOW = datetime.now(timezone.utc).replace(microsecond=0)


@pytest.fixture(autouse=True, params=["partitions", "narrow"])
def layout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test twice on PostgreSQL (0018): as ``db upgrade`` makes the partitions (a test's batches in one,
    the newest: prune deletes their rows), and with partitions of 3 batch ids (prune swaps the aged ones out)."""
    if request.param == "narrow":
        monkeypatch.setattr(sys.modules[__name__], "upgrade", upgrade_narrow)
    return str(request.param)


def _batch(conn, pipeline: str, query_id: str, batch_id: int, when: datetime,  # type: ignore[no-untyped-def]
           parts: dict[tuple[str, int], tuple[int, int]]) -> None:
    conn.execute(insert(t.batches).values(
        pipeline=pipeline, consumer_group=pipeline, query_id=query_id, run_id=f"r-{query_id}",
        batch_id=batch_id, batch_time=when, recorded_at=when,
        input_rows=sum(u - f for f, u in parts.values() if f is not None)))
    conn.execute(insert(t.batch_offsets), [
        dict(pipeline=pipeline, consumer_group=pipeline, query_id=query_id, batch_id=batch_id,
             source_index=0, topic=topic, partition=part, from_offset=frm, until_offset=until,
             batch_time=when)
        for (topic, part), (frm, until) in parts.items()])


def _position(conn, pipeline: str, topic: str, part: int, next_offset: int, query_id: str | None,  # type: ignore[no-untyped-def]
              batch_id: int | None, reset_id: int | None = None) -> None:
    conn.execute(insert(t.positions).values(
        pipeline=pipeline, consumer_group=pipeline, topic=topic, partition=part,
        next_offset=next_offset, updated_at=NOW, query_id=query_id, batch_id=batch_id,
        reset_id=reset_id))


def seed(engine: Engine) -> None:
    """Pipeline ``orders``: an old query q1 over partitions 0-2 (40..31 days ago), then q2 over 0-1
    (10..6 days ago) after partition 2 left the subscription. Pipeline ``billing``: all old.
    """
    with engine.begin() as conn:
        for b in range(10):  # q1: old; its batch 9 is partition 2's latest; a finding names batch 3
            _batch(conn, "orders", "q1", b, NOW - timedelta(days=40 - b),
                   {("orders", 0): (b * 10, b * 10 + 10), ("orders", 1): (b * 5, b * 5 + 5),
                    ("orders", 2): (b, b + 1)})
        for b in range(5):  # q2: recent
            _batch(conn, "orders", "q2", b, NOW - timedelta(days=10 - b),
                   {("orders", 0): (100 + b * 10, 110 + b * 10), ("orders", 1): (50 + b, 51 + b)})
        for b in range(6):  # billing: all old; its last batch holds the positions
            _batch(conn, "billing", "qb", b, NOW - timedelta(days=60 - b), {("invoices", 0): (b, b + 1)})
        _position(conn, "orders", "orders", 0, 150, "q2", 4)
        _position(conn, "orders", "orders", 1, 55, "q2", 4)
        _position(conn, "orders", "orders", 2, 10, "q1", 9)
        _position(conn, "billing", "invoices", 0, 0, None, None, reset_id=1)
        conn.execute(insert(t.findings).values(
            pipeline="orders", consumer_group="orders", kind="gap", topic="orders", partition=0,
            query_id="q1", batch_id=3, expected_offset=30, actual_offset=31, message="gap",
            created_at=NOW - timedelta(days=37)))
        conn.execute(insert(t.resets).values(
            id=1, pipeline="billing", consumer_group="billing", mode="earliest", actor="ops",
            reason="replay", dry_run=False, forced=False, created_at=NOW - timedelta(days=90),
            status="pending"))
        conn.execute(insert(t.reset_partitions).values(
            reset_id=1, topic="invoices", partition=0, before_next_offset=6, after_next_offset=0))


def batch_keys(engine: Engine, table=t.batches) -> set[tuple[str, str, int]]:  # type: ignore[no-untyped-def]
    with engine.connect() as conn:
        rows = conn.execute(select(table.c.pipeline, table.c.query_id, table.c.batch_id).distinct())
        return {(r.pipeline, r.query_id, r.batch_id) for r in rows}


def counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        # batch_offsets: the per-partition view v_batch_offsets (0016)
        return {name: conn.execute(select(func.count()).select_from(tab)).scalar_one()
                for name, tab in (("batches", t.batches), ("batch_offsets", t.batch_offsets),
                                  ("positions", t.positions), ("findings", t.findings), ("resets", t.resets),
                                  ("reset_partitions", t.reset_partitions))}


KEPT_AFTER_30D = (
    {("orders", "q1", 3), ("orders", "q1", 9), ("billing", "qb", 5)}
    | {("orders", "q2", b) for b in range(5)}
)


@pytest.fixture
def pg_engine(pg_dsn: str):  # type: ignore[no-untyped-def]
    engine = make_engine(pg_dsn)
    upgrade(engine)
    seed(engine)
    yield engine
    engine.dispose()


def test_dry_run_counts_and_deletes_nothing(pg_engine: Engine) -> None:
    before = counts(pg_engine)
    report = prune(pg_engine, timedelta(days=30), now=NOW)
    assert counts(pg_engine) == before and not report.executed
    # Old: q1's 10 batches (30 rows) and billing's 6 (6 rows); kept: q1/3, q1/9 and qb/5.
    assert (report.batches.older, report.batches.kept, report.batches.deleted) == (16, 3, 13)
    assert (report.batch_offsets.older, report.batch_offsets.kept, report.batch_offsets.deleted) == (36, 7, 29)


def test_execute_keeps_positions_resets_findings_and_latest_batches(pg_engine: Engine, layout: str) -> None:
    before = counts(pg_engine)
    dry = prune(pg_engine, timedelta(days=30), now=NOW)
    seen: list[tuple[str, int, int]] = []
    report = prune(pg_engine, timedelta(days=30), now=NOW, execute=True, chunk_size=4,
                   progress=lambda table, done, total: seen.append((table, done, total)))
    assert report.batches == dry.batches and report.batch_offsets == dry.batch_offsets
    assert batch_keys(pg_engine) == KEPT_AFTER_30D
    assert batch_keys(pg_engine, t.batch_offsets) == KEPT_AFTER_30D
    after = counts(pg_engine)
    assert after["batches"] == before["batches"] - 13
    assert after["batch_offsets"] == before["batch_offsets"] - 29
    for name in ("positions", "findings", "resets", "reset_partitions"):
        assert after[name] == before[name]
    # Kept batches are whole: q1/9 still has all three partitions.
    with pg_engine.connect() as conn:
        parts = conn.execute(select(t.batch_offsets.c.partition).where(
            t.batch_offsets.c.query_id == "q1", t.batch_offsets.c.batch_id == 9)).scalars().all()
    assert sorted(parts) == [0, 1, 2]
    # Chunks of 4 rows, one transaction each, progress after each (a swapped partition: one, whatever its rows).
    bo_progress = [done for table, done, _ in seen if table == "batch_offsets"]
    assert len(bo_progress) >= (9 if layout == "partitions" else 4) and bo_progress == sorted(bo_progress) and bo_progress[-1] == 29
    # A second run has nothing left to do.
    again = prune(pg_engine, timedelta(days=30), now=NOW, execute=True)
    assert again.batches.deleted == 0 and again.batch_offsets.deleted == 0


def test_pipeline_filter_touches_only_that_pipeline(pg_engine: Engine) -> None:
    report = prune(pg_engine, timedelta(days=30), now=NOW, execute=True, pipeline="billing")
    assert report.batches.deleted == 5
    keys = batch_keys(pg_engine)
    assert {k for k in keys if k[0] == "billing"} == {("billing", "qb", 5)}
    assert len([k for k in keys if k[0] == "orders"]) == 15


def test_short_cutoff_keeps_latest_and_referenced_batches(pg_engine: Engine) -> None:
    prune(pg_engine, timedelta(hours=1), now=NOW, execute=True)
    # Everything is older than an hour: only the latest batch per partition, the batches that
    # placed positions and the one a finding names survive.
    assert batch_keys(pg_engine) == {("orders", "q1", 3), ("orders", "q1", 9), ("orders", "q2", 4),
                                     ("billing", "qb", 5)}


def test_cli_dry_run_then_execute(pg_engine: Engine, pg_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    main(["prune", "--older-than", "30d", "--dsn", pg_dsn])  # returns normally: exit code 0
    out = capsys.readouterr().out
    assert "would delete" in out and "dry run" in out and " 29 " in out.replace(",", "")
    assert counts(pg_engine)["batch_offsets"] == 36 + 10
    main(["prune", "--older-than", "720h", "--execute", "--dsn", pg_dsn])
    assert "deleted" in capsys.readouterr().out
    assert batch_keys(pg_engine) == KEPT_AFTER_30D


@pytest.mark.parametrize("bad", ["30", "30x", "-1d", "0d", "d", "1.5 fortnights", "", "P1Y"])
def test_cli_bad_duration_is_one_line_exit_2(bad: str, pg_engine: Engine, pg_dsn: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    before = counts(pg_engine)
    with pytest.raises(SystemExit) as exit_info:
        main(["prune", f"--older-than={bad}", "--execute", "--dsn", pg_dsn])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"invalid --older-than {bad!r}" in err
    assert counts(pg_engine) == before


def test_parse_duration() -> None:
    assert parse_duration("30d") == timedelta(days=30)
    assert parse_duration("12h") == timedelta(hours=12)
    assert parse_duration("90m") == timedelta(minutes=90)
    with pytest.raises(InvalidDuration):
        parse_duration("12y")


def test_prune_on_the_embedded_sqlite_ledger(tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    upgrade(engine)
    seed(engine)
    report = prune(engine, timedelta(days=30), now=NOW, execute=True, chunk_size=5)
    assert report.batch_offsets.deleted == 29
    assert batch_keys(engine) == KEPT_AFTER_30D


def test_verify_after_prune_on_postgres_gives_the_same_answer_and_keeps_the_hole(pg_dsn: str) -> None:
    """The SQLite test of tests/unit/ledger/test_prune_verify_sqlite.py on Postgres (server-side cursors)."""
    from tests.unit.ledger.test_prune_verify_sqlite import _stretches, history_with_a_hole
    from tests.unit.ledger.test_recorder_sqlite import T0

    pg_engine = make_engine(pg_dsn)
    upgrade(pg_engine)
    history_with_a_hole(pg_engine)
    assert _stretches(pg_engine) == [(0, 50, 60, "gap", False, [])]
    report = prune(pg_engine, timedelta(seconds=1), now=T0 + timedelta(seconds=8), execute=True)
    assert (report.batch_offsets.deleted, report.islands) == (11, 5)
    assert _stretches(pg_engine) == [(0, 50, 60, "gap", False, [])]
    pg_engine.dispose()


# -- issue 33, case 5: verify and a restart's reconcile are stable under prune, on real Postgres --------


def _verify(engine: Engine) -> list[tuple]:
    from offset_ledger.operate.operations import Operations
    from offset_ledger.operate.verifying import verify_pipeline

    ops = Operations(engine)
    try:
        report = verify_pipeline(ops, "orders")
    finally:
        ops.close()
    return [(s.partition, s.from_offset, s.until_offset, s.kind, s.times, s.explained) for s in report.stretches]


def _history(conn, start_of_q1: int | None, gap_at: int | None = None) -> None:  # type: ignore[no-untyped-def]
    """q1: batches 0-3 of 10 records on partition 0 (old); q2 from offset 40: batch 0 (start as given),
    batches 1-7 (old; batch 1 named by a finding, the first with ``gap_at``: skipped 5 records), batch 8 recent."""
    at = NOW - timedelta(days=40)
    for b in range(4):
        _batch(conn, "orders", "q1", b, at + timedelta(minutes=b), {("orders", 0): (b * 10, b * 10 + 10)})
    end = 40
    for b in range(9):
        when = NOW - timedelta(hours=1) if b == 8 else at + timedelta(minutes=10 + b)
        frm: int | None = end
        if b == 0:
            frm = start_of_q1
        elif b == gap_at:
            frm = end + 5
        _batch(conn, "orders", "q2", b, when, {("orders", 0): (frm, (frm if frm is not None else end) + 10)})
        end = (frm if frm is not None else end) + 10
        if b == gap_at:
            conn.execute(insert(t.findings).values(
                pipeline="orders", consumer_group="orders", kind="gap", topic="orders", partition=0, query_id="q2",
                batch_id=b, expected_offset=frm - 5, actual_offset=frm, message="gap", created_at=when))
    conn.execute(insert(t.findings).values(pipeline="orders", consumer_group="orders", kind="regression",
                                           query_id="q2", batch_id=1, message="names batch 1", created_at=at))
    _position(conn, "orders", "orders", 0, end, "q2", 8)


def test_a_pruned_first_batch_without_a_reported_start_stays_read(pg_dsn: str) -> None:
    """(a) q2's batch 0 was recorded without a start (no generation resolved it, no sources/<n>/0):
    verify says its [40, 50) is unknown (it no longer takes it to continue the history), and the same
    after the prune. 0009 recorded its island from the batch's end: a false gap [40, 50) after it."""
    engine = make_engine(pg_dsn)
    upgrade(engine)
    unknown = [(0, 40, 50, "unknown", 1, False)]
    try:
        with engine.begin() as conn:
            _history(conn, start_of_q1=None)
        assert _verify(engine) == unknown
        report = prune(engine, timedelta(days=1), now=NOW, execute=True)
        assert report.batch_offsets.deleted == 11  # q1 0-3, q2 0 and 2-7 (q2 1 is named, q2 8 recent)
        assert _verify(engine) == unknown
        with engine.connect() as conn:
            first = conn.execute(select(t.pruned_ranges.c.from_offset, t.pruned_ranges.c.first_until_offset)
                                 .where(t.pruned_ranges.c.query_id == "q2", t.pruned_ranges.c.from_batch_id == 0)).one()
        assert tuple(first) == (None, 50)  # the start stays unknown; the batch's end is kept
    finally:
        engine.dispose()


def test_a_gap_older_than_the_first_kept_range_is_still_a_gap(pg_dsn: str) -> None:
    """(b) A recorder gap finding on q1's batch 2: the skipped [60, 65) is older than every kept range
    but the named batch itself. Before: "gap"; 0009: "ok" after the prune (the sweep began at the first
    kept range). Now the same gap, with the recorder's finding in its notes."""
    engine = make_engine(pg_dsn)
    upgrade(engine)
    try:
        with engine.begin() as conn:
            _history(conn, start_of_q1=40, gap_at=2)
            # The gap's batch is named (kept); every batch before it is pruned but q2/1 (named too): drop that name.
            conn.execute(t.findings.delete().where(t.findings.c.kind == "regression"))
        before = _verify(engine)
        assert before == [(0, 60, 65, "gap", 1, False)]
        prune(engine, timedelta(days=1), now=NOW, execute=True)
        with engine.connect() as conn:
            kept = sorted(conn.execute(select(t.batches.c.query_id, t.batches.c.batch_id)).all())
        assert [tuple(k) for k in kept] == [("q2", 2), ("q2", 8)]
        assert _verify(engine) == before
    finally:
        engine.dispose()


def test_a_restart_after_a_prune_that_kept_an_old_batch_backfills_nothing(pg_dsn: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """(c) The restart's reconcile (``operate.restart.reconcile_current``) reads q2's real checkpoint files.
    Prune kept q2's batch 1 (a finding names it) and deleted 2-7: 0009 took them for missed batches,
    "the ledger lacked 6 batches", and re-inserted them."""
    import json

    from offset_ledger.operate.restart import CheckpointTruth, reconcile_current
    from offset_ledger.rules.restart_options import GroupRef, PipelineRef
    from tests.unit.rules.test_checkpoint import _commit, _offsets

    location = tmp_path / "checkpoint" / "1"
    for sub in ("offsets", "commits"):
        (location / sub).mkdir(parents=True)
    (location / "metadata").write_text(json.dumps({"id": "q2"}))
    for b in range(9):  # as Spark writes them: offsets/<n> the batch's end, commits/<n> once committed
        (location / "offsets" / str(b)).write_text(_offsets(json.dumps({"orders": {"0": 50 + b * 10}})))
        (location / "commits" / str(b)).write_text(_commit())
    engine = make_engine(pg_dsn)
    upgrade(engine)
    try:
        with engine.begin() as conn:
            _history(conn, start_of_q1=40)
            conn.execute(insert(t.checkpoint_generations).values(
                pipeline="orders", consumer_group="orders", generation=1, checkpoint_root=str(tmp_path / "checkpoint"),
                location=str(location), reason="first", created_at=NOW - timedelta(days=41), query_id="q2",
                resolved_offsets={"orders": {"0": 40}}))
        same = CheckpointTruth(GroupRef("orders", "orders", named=True))  # no finding; the same incarnation
        assert reconcile_current(engine, PipelineRef("orders", "orders")) == same  # the ledger has every batch
        prune(engine, timedelta(days=1), now=NOW, execute=True)
        before = batch_keys(engine)
        assert {k for k in before if k[1] == "q2"} == {("orders", "q2", 1), ("orders", "q2", 8)}
        assert reconcile_current(engine, PipelineRef("orders", "orders")) == same
        assert batch_keys(engine) == before
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(t.findings)
                                .where(t.findings.c.kind == "backfilled")).scalar_one() == 0
        assert _verify(engine) == []
    finally:
        engine.dispose()


@pytest.mark.parametrize("seed", range(2))
def test_the_islands_postgres_records_are_the_rule_over_the_deleted_rows(pg_dsn: str, seed: int) -> None:
    from tests.unit.ledger.test_prune_verify_sqlite import recorded_equals_the_rule
    from tests.unit.ledger.test_recorder_sqlite import T0

    engine = make_engine(pg_dsn)
    upgrade(engine)
    try:
        recorded_equals_the_rule(engine, T0 + timedelta(seconds=40), seed)
    finally:
        engine.dispose()


_ISLAND_COLUMNS = ("pipeline", "consumer_group", "query_id", "topic", "partition", "from_batch_id", "until_batch_id",
                   "from_offset", "until_offset", "batches", "first_batch_time", "first_until_offset",
                   "last_batch_time", "run_id")


def _random_fleet_history(engine: Engine, rnd, ends_before_starts: bool) -> None:  # type: ignore[no-untyped-def]
    """Two pipelines x three queries x 30 batches, 40..10 h ago and a few recent, on topics ``a`` (always) and
    ``b`` (mostly), written as the recorder does (compact ``offset_ranges`` rows), with at random: holes,
    overlaps, resets to offset 0, unreported starts, a new run within a query, a partition leaving or joining
    or the list in another order, a second source reading ``a``, a finding that keeps an old batch, and
    (``ends_before_starts``) a range ending before its start."""
    with engine.begin() as conn:
        for pipeline in ("p0", "p1"):
            for q in range(3):
                query, run, nxt = f"{pipeline}-q{q}", 0, {}
                for b in range(30):
                    when = NOW - timedelta(hours=40 - b) if b < 27 else NOW - timedelta(minutes=30 - b)
                    run += rnd.random() < 0.1
                    pk = conn.execute(insert(t.batches).values(
                        pipeline=pipeline, consumer_group=pipeline, query_id=query, run_id=f"{query}-r{run}",
                        batch_id=b, batch_time=when, recorded_at=when, input_rows=0,
                    ).returning(t.batches.c.id)).scalar_one()
                    if rnd.random() < 0.05:
                        conn.execute(insert(t.findings).values(
                            pipeline=pipeline, consumer_group=pipeline, kind="gap", query_id=query, batch_id=b,
                            message="kept", created_at=NOW))
                    reads = [(0, "a")] + [(1, "a")] * (rnd.random() < 0.1) + [(0, "b")] * (rnd.random() < 0.8)
                    for source, topic in reads:
                        parts = [0, 1, 2, 3]
                        roll = rnd.random()
                        if roll < 0.1:
                            parts.remove(rnd.choice(parts))
                        elif roll < 0.15:
                            parts.append(4)
                        elif roll < 0.2:
                            parts.reverse()
                        froms, untils = [], []
                        for p in parts:
                            start: int | None = nxt.get((topic, p), 100 * q)
                            roll = rnd.random()
                            if roll < 0.06:
                                start += rnd.randint(1, 5)  # a hole
                            elif roll < 0.1:
                                start -= rnd.randint(1, 3)  # an overlap
                            elif roll < 0.13:
                                start = 0  # a reset back to the start
                            elif roll < 0.17:
                                start = None  # not reported
                            until = (nxt.get((topic, p), 100 * q) if start is None else start) + rnd.randint(0, 6)
                            if ends_before_starts and start is not None and rnd.random() < 0.05:
                                until = start - rnd.randint(1, 4)
                            froms.append(start)
                            untils.append(until)
                            nxt[(topic, p)] = until
                        conn.execute(insert(t.offset_ranges).values(
                            batch_pk=pk, source_index=source, topic=topic, partitions=parts, from_offsets=froms,
                            until_offsets=untils))


def _in_order(rows) -> list[tuple[object, ...]]:  # type: ignore[no-untyped-def]
    return sorted((tuple(r) for r in rows), key=lambda r: [(v is None, v if v is not None else 0) for v in r])


def _islands_recorded(engine: Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return _in_order(conn.execute(select(*(t.pruned_ranges.c[c] for c in _ISLAND_COLUMNS))))


@pytest.mark.parametrize("seed", range(3))
def test_compact_islands_are_the_rule_over_a_random_fleet_history(pg_dsn: str, seed: int) -> None:
    """Oracle: the islands prune writes from the compact rows are ``rules.pruned.islands`` over the
    partition-offsets it deletes, every column, through resets, runs, partition lists and sources changing."""
    import random

    from offset_ledger.rules.pruned import DeletedRange, islands

    engine = make_engine(pg_dsn)
    upgrade(engine)
    try:
        _random_fleet_history(engine, random.Random(seed), ends_before_starts=False)
        bo = t.batch_offsets
        with engine.connect() as conn:
            before = conn.execute(select(*bo.c, t.batches.c.run_id).join_from(bo, t.batches, (
                t.batches.c.query_id == bo.c.query_id) & (t.batches.c.batch_id == bo.c.batch_id))).all()
        report = prune(engine, timedelta(hours=12), now=NOW, execute=True)
        with engine.connect() as conn:
            left = {tuple(r) for r in conn.execute(select(bo.c.query_id, bo.c.batch_id))}
        doomed = sorted((r for r in before if (r.query_id, r.batch_id) not in left),
                        key=lambda r: (r.pipeline, r.consumer_group, r.query_id, r.topic, r.partition, r.batch_id,
                                       r.source_index))
        want = _in_order(
            tuple(getattr(i, c) for c in _ISLAND_COLUMNS)
            for i in islands(DeletedRange(r.pipeline, r.consumer_group, r.query_id, r.topic, r.partition, r.batch_id,
                                          r.from_offset, r.until_offset, r.batch_time, r.source_index, r.run_id)
                             for r in doomed))
        got = _islands_recorded(engine)
        assert got == want and report.islands == len(want)
        assert len(doomed) > 500 and len(want) > 100 and report.batches.kept > 0  # the history exercised the rule
    finally:
        engine.dispose()


@pytest.mark.parametrize("seed", range(3))
def test_compact_islands_are_the_per_partition_offset_statements(pg_dsn: str, seed: int) -> None:
    """The compact statement writes exactly what the per partition-offset one wrote before it, also where
    a range ends before its start (there both take the least start, not the rule's first one)."""
    import random

    from offset_ledger.ledger.prune_record import record_pruned

    engine = make_engine(pg_dsn)
    upgrade(engine)
    try:
        rnd = random.Random(seed)
        _random_fleet_history(engine, rnd, ends_before_starts=True)
        with engine.connect() as conn:
            keep = {i for i in conn.execute(select(t.batches.c.id)).scalars() if rnd.random() < 0.1}
        got = {}
        for per_partition_offset in (True, False):
            with engine.begin() as conn:
                n = record_pruned(conn, NOW - timedelta(hours=12), None, keep, NOW,
                                  per_partition_offset=per_partition_offset)
            got[per_partition_offset] = _islands_recorded(engine)
            assert n == len(got[per_partition_offset]) > 100
            with engine.begin() as conn:
                conn.execute(t.pruned_ranges.delete())
        assert got[False] == got[True]
    finally:
        engine.dispose()
