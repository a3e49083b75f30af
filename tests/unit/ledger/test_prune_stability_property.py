"""Verify is stable under prune (issue 33, case 5), over a real SQLite ledger, with hypothesis.

A history is drawn the way the ledger holds one: queries and runs, batches on two partitions that
tile, skip (with the recorder's ``gap`` finding naming the batch, which prune then keeps), re-read,
start unknown (a fresh checkpoint's first batch), a second source reading the same partition,
resets, a run a finding flags (a zombie: ``foreign_run``). A prune at any cutoff, with any pipeline
filter the command accepts, must leave verify's answer exactly as it was: every stretch (kind,
partition, offsets, times, explained), not only the unexplained ones. The stretches are also checked
against a record-level oracle (how often each offset was read) wherever every start is known. And a
restart's reconcile of the last query's checkpoint after the prune backfills nothing and reports no
batch missing: the pruned batches are pruned, not missed.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, func, insert, select
from sqlalchemy.engine import Engine

from offset_ledger.capture.reconcile import reconcile
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.prune import prune
from offset_ledger.ledger.tables import (
    batch_offsets,
    batches,
    findings,
    positions,
    pruned_ranges,
    reset_partitions,
    resets,
)
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.verifying import verify_pipeline
from tests.unit.rules.test_checkpoint import DictFiles, _commit, _offsets

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
P, G, TOPIC = "orders", "orders", "t"


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    engine = make_engine(f"sqlite:///{Path(tmp_path_factory.mktemp('prune')) / 'ledger.db'}")
    upgrade(engine)
    return engine


def _clear(engine: Engine) -> None:
    with engine.begin() as conn:
        for table in (pruned_ranges, reset_partitions, resets, findings, positions, batch_offsets, batches):
            conn.execute(delete(table))


@st.composite
def histories(draw):  # type: ignore[no-untyped-def]
    """(batches, offsets, findings, resets, positions) rows, and the last query's batches' ends."""
    pos = {0: draw(st.integers(0, 20)), 1: draw(st.integers(0, 20))}
    query, run, batch_id, step = 0, 0, 0, 0
    b_rows, o_rows, f_rows, r_rows, ends = [], [], [], [], {}
    fresh = draw(st.booleans())  # the first batch of the query: its start unknown?
    for _ in range(draw(st.integers(1, 14))):
        action = draw(st.sampled_from(["batch"] * 6 + ["restart", "new_run", "reset", "zombie"]))
        if action == "restart":
            query, run, batch_id, fresh = query + 1, run + 1, 0, draw(st.booleans())
            continue
        if action == "new_run":
            run += 1
            continue
        if action == "reset":
            p = draw(st.integers(0, 1))
            after = max(0, pos[p] + draw(st.integers(-15, 15)))
            r_rows.append((len(r_rows) + 1, p, pos[p], after))
            pos[p] = after
            continue
        step += 1
        at = T0 + timedelta(seconds=step)
        q, r = f"q{query}", f"r{run}"
        if action == "zombie":  # another run of an old query re-reads, and a finding flags it
            q, r = f"z{step}", f"zr{step}"
            f_rows.append({"kind": "foreign_run", "run_id": r, "message": "zombie"})
        b_rows.append({"query_id": q, "run_id": r, "batch_id": batch_id if action != "zombie" else 0,
                       "batch_time": at})
        for p in (0, 1):
            n = draw(st.integers(0, 6))
            shape = draw(st.sampled_from(["tile"] * 5 + ["skip", "reread"]))
            start: int | None = pos[p]
            if action == "zombie":
                start = max(0, pos[p] - draw(st.integers(1, 10)))
            elif shape == "skip":
                start = pos[p] + draw(st.integers(1, 5))
                if batch_id > 0:  # the recorder's finding names the batch: prune keeps it
                    f_rows.append({"kind": "gap", "topic": TOPIC, "partition": p, "query_id": q, "batch_id": batch_id,
                                   "expected_offset": pos[p], "actual_offset": start, "message": "gap"})
            elif shape == "reread":
                start = max(0, pos[p] - draw(st.integers(1, 5)))
            until = start + n
            if action != "zombie":
                pos[p] = until
            if batch_id == 0 and fresh and action != "zombie":
                start = None
            o_rows.append({"query_id": q, "batch_id": b_rows[-1]["batch_id"], "source_index": 0, "partition": p,
                           "from_offset": start, "until_offset": until, "batch_time": at})
            if p == 0 and action != "zombie" and draw(st.integers(0, 9)) == 0:  # a second source, same partition
                o_rows.append({**o_rows[-1], "source_index": 1})
        if action != "zombie":
            ends[(q, batch_id)] = (pos[0], pos[1])
            batch_id += 1
    last = f"q{query}"
    last_ends = {b: e for (q, b), e in ends.items() if q == last}
    return b_rows, o_rows, f_rows, r_rows, pos, last, last_ends


def _write(engine: Engine, h) -> None:  # type: ignore[no-untyped-def]
    b_rows, o_rows, f_rows, r_rows, pos, _, _ = h
    with engine.begin() as conn:
        if b_rows:
            conn.execute(insert(batches), [{"pipeline": P, "consumer_group": G, "recorded_at": r["batch_time"],
                                            "input_rows": 0, **r} for r in b_rows])
        if o_rows:
            conn.execute(insert(batch_offsets), [{"pipeline": P, "consumer_group": G, "topic": TOPIC, **r}
                                                 for r in o_rows])
        for f in f_rows:
            conn.execute(insert(findings).values(pipeline=P, consumer_group=G, created_at=T0, **f))
        for reset_id, p, before, after in r_rows:
            conn.execute(insert(resets).values(id=reset_id, pipeline=P, consumer_group=G, mode="offsets", actor="a",
                                               dry_run=False, forced=False, created_at=T0, status="done"))
            conn.execute(insert(reset_partitions).values(reset_id=reset_id, topic=TOPIC, partition=p,
                                                         before_next_offset=before, after_next_offset=after))
        conn.execute(insert(positions), [{"pipeline": P, "consumer_group": G, "topic": TOPIC, "partition": p,
                                          "next_offset": o, "updated_at": T0} for p, o in pos.items()])


def _stretches(engine: Engine) -> list[tuple]:
    ops = Operations(engine)
    try:
        report = verify_pipeline(ops, P)
    finally:
        ops.close()
    return [(s.kind, s.partition, s.from_offset, s.until_offset, s.times, s.explained) for s in report.stretches]


def _oracle(h) -> dict[int, Counter]:  # type: ignore[no-untyped-def]
    """Per partition: how many times each offset was read, from the first start to the position."""
    _, o_rows, f_rows, r_rows, pos, _, _ = h
    reads: dict[int, Counter] = {0: Counter(), 1: Counter()}
    for r in o_rows:
        reads[r["partition"]].update(range(r["from_offset"], r["until_offset"]))
    return reads


def _unexplained_offsets(stretches: list[tuple]) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {0: set(), 1: set()}
    for kind, p, a, b, _, explained in stretches:
        if not explained:
            out[p].update(range(a, b))
    return out


def _checkpoint(last: str, last_ends: dict[int, tuple[int, int]]) -> DictFiles:
    files: dict[str, str | bytes] = {"metadata": json.dumps({"id": last})}
    for b, (e0, e1) in last_ends.items():
        files[f"offsets/{b}"] = _offsets(json.dumps({TOPIC: {"0": e0, "1": e1}}))
        files[f"commits/{b}"] = _commit()
    return DictFiles(files)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(h=histories(), cut=st.integers(0, 16), only=st.sampled_from([None, P, "other"]))
def test_verify_and_reconcile_are_stable_under_any_prune(ledger: Engine, h, cut: int, only) -> None:  # type: ignore[no-untyped-def]
    _clear(ledger)
    _write(ledger, h)
    before = _stretches(ledger)
    _, o_rows, f_rows, r_rows, pos, last, last_ends = h
    if all(r["from_offset"] is not None for r in o_rows) and not r_rows and not any(
            f["kind"] == "foreign_run" for f in f_rows):
        # Record-level oracle: unexplained = read other than once, between the first start and the position.
        reads = _oracle(h)
        for p in (0, 1):
            starts = [r["from_offset"] for r in o_rows if r["partition"] == p]
            if not starts:
                continue
            want = {o for o in range(min(starts), max(pos[p], max(reads[p], default=0) + 1))
                    if reads[p][o] != (1 if o < pos[p] else 0)}
            assert _unexplained_offsets(before)[p] == want, (p, before)
    report = prune(ledger, timedelta(seconds=1), pipeline=only, now=T0 + timedelta(seconds=cut + 1), execute=True)
    after = _stretches(ledger)
    assert after == before, f"prune changed verify's answer (deleted {report.batch_offsets.deleted} ranges): {h} {cut=} {only=}"

    with ledger.connect() as conn:
        kept = conn.execute(select(func.count()).select_from(batches)).scalar_one()
    if last_ends:
        result = reconcile(ledger, "/ckpt", pipeline=P, consumer_group=G, files=_checkpoint(last, last_ends),
                           now=T0 + timedelta(days=1))
        assert result.backfilled == () and result.findings == (), result
        with ledger.connect() as conn:
            assert conn.execute(select(func.count()).select_from(batches)).scalar_one() == kept


@pytest.mark.long
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(h=histories(), cut=st.integers(0, 16), only=st.sampled_from([None, P, "other"]))
def test_verify_and_reconcile_are_stable_under_any_prune_long(ledger: Engine, h, cut: int, only) -> None:  # type: ignore[no-untyped-def]
    test_verify_and_reconcile_are_stable_under_any_prune.hypothesis.inner_test(ledger, h, cut, only)  # type: ignore[attr-defined]
