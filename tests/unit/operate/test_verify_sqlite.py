"""``offset-ledger verify`` over a real (SQLite) ledger written by the recorder: what explains what,
and the command's formats and exit codes. The Postgres path (server-side cursor) runs in
tests/integration/test_verify.py and benchmarks/bench_verify.py."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import insert, update
from sqlalchemy.engine import Engine

from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.recorder import Recorder
from offset_ledger.ledger.tables import (
    batch_offsets,
    checkpoint_generations,
    findings,
    positions,
    reset_partitions,
    resets,
)
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.verifying import verify_pipeline
from tests.unit.cli.test_cli_toolbox import cli
from tests.unit.ledger.test_recorder_sqlite import T0, batch, rec, start
from offset_ledger.operate.action_answers import verify_answer


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Engine:
    for name in [k for k in os.environ if k.startswith("OFFSET_LEDGER_")]:
        monkeypatch.delenv(name)
    e = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    upgrade(e)
    return e


def _tiling(engine: Engine, *, query: str = "q1", run: str = "r1", first: int = 0, n: int = 5, step: int = 10,
            partitions: int = 2, at: timedelta = timedelta(0)) -> int:
    """n batches of `step` records per partition from `first`; returns where they end."""
    recorder = Recorder(engine)
    recorder.record([start(run=run, query=query, at=T0 + at - timedelta(minutes=1))])
    for b in range(n):
        ends = {("t", p): (first + b * step, first + (b + 1) * step) for p in range(partitions)}
        item = batch(b, ends, query=query, run=run)
        recorder.record([rec(item.__class__(**{**item.__dict__, "batch_time": T0 + at + timedelta(seconds=b)}))])
    return first + n * step


def _verify(engine: Engine, **kw):  # type: ignore[no-untyped-def]
    ops = Operations(engine)
    try:
        return verify_pipeline(ops, "orders", **kw)
    finally:
        ops.close()


def _reset(engine: Engine, reset_id: int, moves: dict[tuple[str, int], tuple[int, int]], *, actor: str = "alice",
           reason: str = "replay the incident", dry_run: bool = False) -> None:
    with engine.begin() as conn:
        conn.execute(insert(resets).values(id=reset_id, pipeline="orders", consumer_group="orders", mode="offsets",
                                           actor=actor, reason=reason, dry_run=dry_run, forced=False,
                                           created_at=T0 + timedelta(hours=1), status="pending"))
        conn.execute(insert(reset_partitions), [
            {"reset_id": reset_id, "topic": t, "partition": p, "before_next_offset": b, "after_next_offset": a}
            for (t, p), (b, a) in moves.items()])


def test_a_clean_history_verifies_and_a_hand_made_gap_and_overlap_are_exactly_reported(engine: Engine) -> None:
    _tiling(engine)
    report = _verify(engine)
    assert report.ok and report.stretches == [] and len(report.results) == 2
    assert [(r.first_offset, r.end_offset, r.position, r.ranges) for r in report.results] == [(0, 50, 50, 5)] * 2
    with engine.begin() as conn:
        conn.execute(update(batch_offsets).where(batch_offsets.c.batch_id == 2, batch_offsets.c.partition == 0)
                     .values(from_offset=23))  # [20, 23) read by nobody
        conn.execute(update(batch_offsets).where(batch_offsets.c.batch_id == 4, batch_offsets.c.partition == 1)
                     .values(from_offset=36))  # [36, 40) read twice
    report = _verify(engine)
    assert not report.ok
    got = [(s.topic, s.partition, s.from_offset, s.until_offset, s.kind, s.explained) for s in report.stretches]
    assert got == [("t", 0, 20, 23, "gap", False), ("t", 1, 36, 40, "overlap", False)]
    gap, overlap = report.stretches
    assert (gap.before.batch_id, gap.after.batch_id) == (1, 2)
    assert [b.batch_id for b in overlap.batches] == [3, 4]


def test_a_reset_explains_its_stretch_and_names_who_and_why(engine: Engine) -> None:
    end = _tiling(engine)  # 50
    _reset(engine, 1, {("t", 0): (end, 30), ("t", 1): (end, 70)})
    _reset(engine, 2, {("t", 0): (end, 0)}, dry_run=True)  # a dry run explains nothing
    # The next generation's query reads on from each reset position.
    recorder = Recorder(engine)
    recorder.record([start(run="r2", query="q2", at=T0 + timedelta(hours=2))])
    recorder.record([rec(batch(0, {("t", 0): (30, 60), ("t", 1): (70, 80)}, query="q2", run="r2"))])
    report = _verify(engine)
    assert report.ok, verify_answer(report)
    got = [(s.partition, s.from_offset, s.until_offset, s.kind, s.explained, [r.label() for r in s.reasons])
           for s in report.stretches]
    assert got == [(0, 30, 50, "overlap", True, ["reset 1 (offsets by alice: replay the incident)"]),
                   (1, 50, 70, "gap", True, ["reset 1 (offsets by alice: replay the incident)"])]


def test_a_foreign_run_accounts_for_what_it_read_again_and_data_loss_for_what_retention_took(engine: Engine) -> None:
    _tiling(engine, partitions=1)  # [0, 50)
    recorder = Recorder(engine)
    recorder.record([start(run="zombie", query="qz", at=T0 + timedelta(minutes=5))])
    recorder.record([rec(batch(3, {("t", 0): (10, 20)}, query="qz", run="zombie"))])
    with engine.begin() as conn:
        conn.execute(insert(findings).values(
            pipeline="orders", consumer_group="orders", kind="foreign_run", run_id="zombie", message="old checkpoint",
            created_at=T0 + timedelta(minutes=6)))
        gen = conn.execute(insert(checkpoint_generations).values(
            pipeline="orders", consumer_group="orders", generation=1, checkpoint_root="/ck", location="/ck/gen-1",
            reason="data_loss", created_at=T0 + timedelta(hours=1)).returning(checkpoint_generations.c.id)).scalar()
        conn.execute(insert(findings).values(
            pipeline="orders", consumer_group="orders", kind="data_loss", topic="t", partition=0, expected_offset=50,
            actual_offset=65, generation_id=gen, details={"kind": "below_log_start", "records_lost": 15},
            message="t/0: next offset 50 is below log-start 65, 15 records lost to retention",
            created_at=T0 + timedelta(hours=1)))
    recorder.record([start(run="r3", query="q3", at=T0 + timedelta(hours=2))])
    recorder.record([rec(batch(0, {("t", 0): (65, 70)}, query="q3", run="r3"))])
    report = _verify(engine)
    assert report.ok, verify_answer(report)
    got = [(s.from_offset, s.until_offset, s.kind, [r.kind for r in s.reasons]) for s in report.stretches]
    # The recorder itself saw the zombie end behind the position (a regression finding, the first on that run).
    assert got == [(10, 20, "overlap", ["regression"]), (50, 65, "gap", ["data_loss"])]


def test_a_recreated_topic_starts_a_new_incarnation(engine: Engine) -> None:
    _tiling(engine, partitions=1)  # old incarnation [0, 50)
    with engine.begin() as conn:
        g1 = conn.execute(insert(checkpoint_generations).values(
            pipeline="orders", consumer_group="orders", generation=1, checkpoint_root="/ck", location="/ck/gen-1",
            reason="first", created_at=T0 - timedelta(hours=1), topic_ids={"t": "OLD"}, query_id="q1")
            .returning(checkpoint_generations.c.id)).scalar()
        g2 = conn.execute(insert(checkpoint_generations).values(
            pipeline="orders", consumer_group="orders", generation=2, checkpoint_root="/ck", location="/ck/gen-2",
            reason="data_loss", created_at=T0 + timedelta(hours=1), topic_ids={"t": "NEW"}, query_id="q2")
            .returning(checkpoint_generations.c.id)).scalar()
        conn.execute(insert(findings).values(
            pipeline="orders", consumer_group="orders", kind="data_loss", topic="t", partition=0, expected_offset=50,
            actual_offset=0, generation_id=g2, details={"kind": "topic_recreated"}, message="t/0: re-created",
            created_at=T0 + timedelta(hours=1)))
        # The generation's baseline: the new incarnation's log-start (what create_generation writes).
        conn.execute(update(positions).values(next_offset=0, generation_id=g2, query_id=None, batch_id=None))
        assert g1
    recorder = Recorder(engine)
    recorder.record([start(run="r2", query="q2", at=T0 + timedelta(hours=2))])
    recorder.record([rec(batch(0, {("t", 0): (0, 8)}, query="q2", run="r2"))])
    report = _verify(engine)
    assert report.ok, json.dumps(verify_answer(report), default=str)
    assert [(r.incarnation, r.first_offset, r.end_offset, r.position) for r in report.results] == [
        (0, 0, 50, 50), (1, 0, 8, 8)]
    assert [c["kind"] for c in verify_answer(report)["partitions"][1]["context"]] == ["data_loss"]


def test_the_command_formats_and_exit_codes(engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    _tiling(engine)
    dsn = engine.url.render_as_string(hide_password=False)
    code, out, err = cli(["verify", "orders", "--dsn", dsn], capsys)
    assert code == 0, err
    assert "no gap and no overlap" in out and "2 partition(s), 10 ranges" in out
    with engine.begin() as conn:
        conn.execute(update(batch_offsets).where(batch_offsets.c.batch_id == 2, batch_offsets.c.partition == 0)
                     .values(from_offset=25))
    code, out, err = cli(["verify", "orders", "--dsn", dsn], capsys)
    assert code == 6
    assert "UNEXPLAINED" in out and "NOT accounted for" in out
    code, out, err = cli(["verify", "orders", "--dsn", dsn, "-f", "json"], capsys)
    assert code == 6 and "1 unexplained stretch" in err
    doc = json.loads(out)
    assert doc["ok"] is False and doc["summary"]["unexplainedGaps"] == 1
    (s,) = doc["stretches"]
    assert (s["topic"], s["partition"], s["fromOffset"], s["untilOffset"], s["kind"]) == ("t", 0, 20, 25, "gap")
    assert s["before"] == {"queryId": "q1", "batchId": 1, "generation": None}
    code, out, _ = cli(["verify", "orders", "--dsn", dsn, "-f", "csv"], capsys)
    assert code == 6 and out.splitlines()[0].startswith("status,topic,partition")
    code, _, err = cli(["verify", "nobody", "--dsn", dsn], capsys)
    assert code == 2 and "unknown pipeline" in err
    code, _, err = cli(["verify", "orders", "--dsn", dsn, "--topic", "bad topic!"], capsys)
    assert code == 2 and "invalid topic" in err
    code, _, err = cli(["verify", "orders", "--dsn", dsn, "-f", "yaml"], capsys)
    assert code == 2


def test_the_endpoint_answers_like_the_command_behind_the_same_token(engine: Engine) -> None:
    from fastapi.testclient import TestClient

    from offset_ledger.api import create_app

    _tiling(engine)
    with engine.begin() as conn:
        conn.execute(update(batch_offsets).where(batch_offsets.c.batch_id == 4, batch_offsets.c.partition == 1)
                     .values(from_offset=35))
    token = "a-long-enough-test-token-123"
    client = TestClient(create_app(operations=Operations(engine), api_token=token),
                        raise_server_exceptions=False, base_url="http://localhost")
    auth = {"Authorization": f"Bearer {token}"}
    assert client.get("/api/v1/pipelines/orders/verify").status_code == 401
    resp = client.get("/api/v1/pipelines/orders/verify", headers=auth)
    assert resp.status_code == 200
    doc = resp.json()
    assert doc["ok"] is False and doc["consumerGroup"] == "orders"
    assert [(s["partition"], s["fromOffset"], s["untilOffset"], s["kind"]) for s in doc["stretches"]] == [
        (1, 35, 40, "overlap")]
    assert client.get("/api/v1/pipelines/orders/verify?topic=t&unexplainedOnly=true", headers=auth).json()["ok"] is False
    other = client.get("/api/v1/pipelines/orders/verify?topic=other", headers=auth)  # a typo is no green answer
    assert other.status_code == 404 and other.json()["message"] == (
        "topic 'other' is not read by pipeline 'orders' (topics: t)"), other.text
    missing = client.get("/api/v1/pipelines/nobody/verify", headers=auth)
    assert missing.status_code == 404 and missing.json()["error"] == "UnknownPipeline"
    bad = client.get("/api/v1/pipelines/orders/verify?topic=bad%20topic", headers=auth)
    assert bad.status_code in (400, 422) and "error" in bad.json()
    group = client.get("/api/v1/pipelines/orders/verify?consumerGroup=other", headers=auth)
    assert group.status_code == 404 and "error" in group.json()
    assert "/api/v1/pipelines/{pipeline}/verify" in client.get("/openapi.json", headers=auth).json()["paths"]


def test_the_console_page_has_the_verify_section_and_its_script(engine: Engine) -> None:
    from fastapi.testclient import TestClient

    from offset_ledger.api import create_app

    client = TestClient(create_app(operations=Operations(engine), api_token=""), base_url="http://localhost")
    page = client.get("/pipelines/orders")
    assert page.status_code == 200
    assert 'id="verify-run"' in page.text and "/console/static/verify.js" in page.text
    script = client.get("/console/static/verify.js")
    assert script.status_code == 200 and "/verify" in script.text


def test_a_first_batch_recorded_without_its_start_begins_where_its_generation_resolved(engine: Engine) -> None:
    _tiling(engine, partitions=1)  # [0, 50)
    with engine.begin() as conn:
        conn.execute(insert(checkpoint_generations).values(
            pipeline="orders", consumer_group="orders", generation=1, checkpoint_root="/ck", location="/ck/gen-1",
            reason="requested", created_at=T0 + timedelta(hours=1), query_id="q2",
            resolved_offsets={"t": {"0": 45}}))
        # Batch 0 of q2 as an older recorder left it: no start. Its generation says 45: [45, 50) twice.
        conn.execute(insert(batch_offsets), [
            {"pipeline": "orders", "consumer_group": "orders", "query_id": "q2", "batch_id": b, "source_index": 0,
             "topic": "t", "partition": 0, "from_offset": f, "until_offset": u,
             "batch_time": T0 + timedelta(hours=2, seconds=b)}
            for b, f, u in ((0, None, 60), (1, 60, 70))])
        conn.execute(update(positions).values(next_offset=70))
    report = _verify(engine)
    got = [(s.from_offset, s.until_offset, s.kind, s.explained) for s in report.stretches]
    assert got == [(45, 50, "overlap", False)]
    assert report.results[0].unknown_starts == 0
    (s,) = verify_answer(report)["stretches"]
    assert {b["queryId"]: b["generation"] for b in s["batches"]} == {"q1": None, "q2": 1}


def test_a_stateful_rewind_explains_what_its_generation_reads_again(engine: Engine) -> None:
    _tiling(engine, partitions=1)  # [0, 50)
    with engine.begin() as conn:
        gen = conn.execute(insert(checkpoint_generations).values(
            pipeline="orders", consumer_group="orders", generation=1, checkpoint_root="/ck", location="/ck/gen-1",
            reason="requested", created_at=T0 + timedelta(hours=1), query_id="q2",
            resolved_offsets={"t": {"0": 40}}).returning(checkpoint_generations.c.id)).scalar()
        conn.execute(insert(findings).values(
            pipeline="orders", consumer_group="orders", kind="state_rewind", generation_id=gen,
            details={"offsets": {"t:0": 40}, "event_time_floor": "2026-11-22T11:50:00+00:00"},
            message="stateful restart of tumbling windows", created_at=T0 + timedelta(hours=1)))
        conn.execute(update(positions).values(next_offset=40, generation_id=gen, query_id=None, batch_id=None))
    recorder = Recorder(engine)
    recorder.record([start(run="r2", query="q2", at=T0 + timedelta(hours=2))])
    recorder.record([rec(batch(0, {("t", 0): (None, 55)}, query="q2", run="r2"))])
    report = _verify(engine)
    assert report.ok, json.dumps(verify_answer(report), default=str)
    (s,) = report.stretches
    assert (s.from_offset, s.until_offset, s.kind, [r.kind for r in s.reasons]) == (40, 50, "overlap", ["state_rewind"])


def _failback(engine: Engine, *, topic_id: str, back_at: int) -> None:
    """Generation 1 read t (id-t) to 50; generation 2 failed over to the backup's replica; generation 3 failed back."""
    with engine.begin() as conn:
        conn.execute(insert(checkpoint_generations).values(
            pipeline="orders", consumer_group="orders", generation=1, checkpoint_root="/ck", location="/ck/gen-1",
            reason="first", created_at=T0 - timedelta(hours=1), query_id="q1", topic_ids={"t": "id-t"},
            resolved_offsets={"t": {"0": 0}}))
        conn.execute(insert(checkpoint_generations).values(
            pipeline="orders", consumer_group="orders", generation=2, checkpoint_root="/ck", location="/ck/gen-2",
            reason="failover", created_at=T0 + timedelta(hours=1), topic_ids={"primary.t": "id-b"},
            resolved_offsets={"primary.t": {"0": 50}}))
        gen = conn.execute(insert(checkpoint_generations).values(
            pipeline="orders", consumer_group="orders", generation=3, checkpoint_root="/ck", location="/ck/gen-3",
            reason="failover", created_at=T0 + timedelta(hours=2), query_id="q3", topic_ids={"t": topic_id},
            resolved_offsets={"t": {"0": back_at}}).returning(checkpoint_generations.c.id)).scalar()
        conn.execute(insert(findings).values(
            pipeline="orders", consumer_group="orders", kind="failover", generation_id=gen,
            details={"reread_max": 55}, message="failed over from backup to primary:9092",
            created_at=T0 + timedelta(hours=2)))
        conn.execute(update(positions).values(next_offset=back_at, generation_id=gen, query_id=None, batch_id=None))
    recorder = Recorder(engine)
    recorder.record([start(run="r3", query="q3", at=T0 + timedelta(hours=3))])
    recorder.record([rec(batch(0, {("t", 0): (back_at, 55 + back_at)}, query="q3", run="r3"))])


def test_failing_back_onto_the_same_topic_explains_its_reread_and_never_a_skip(engine: Engine) -> None:
    _tiling(engine, partitions=1)  # [0, 50) on t
    _failback(engine, topic_id="id-t", back_at=0)
    report = _verify(engine)
    assert report.ok, json.dumps(verify_answer(report), default=str)
    (s,) = report.stretches
    assert (s.from_offset, s.until_offset, s.kind, [r.kind for r in s.reasons]) == (0, 50, "overlap", ["failover"])


def test_a_failover_start_past_what_was_read_stays_an_unexplained_gap(engine: Engine) -> None:
    _tiling(engine, partitions=1)
    _failback(engine, topic_id="id-t", back_at=60)
    report = _verify(engine)
    assert not report.ok
    (s,) = report.stretches
    assert (s.from_offset, s.until_offset, s.kind, s.explained) == (50, 60, "gap", False)


def test_a_start_nobody_knows_is_an_unknown_stretch_and_exit_6(engine: Engine, capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    """A query with no generation (started by hand) whose batch 0 reported no start and left no
    readable ``sources/<n>/0``: the offsets from the previous end to its end are unknown, not read once."""
    _tiling(engine, partitions=1)  # [0, 50)
    with engine.begin() as conn:
        conn.execute(insert(batch_offsets), [
            {"pipeline": "orders", "consumer_group": "orders", "query_id": "9f1c2b7e-hand", "batch_id": b,
             "source_index": 0, "topic": "t", "partition": 0, "from_offset": f, "until_offset": u,
             "batch_time": T0 + timedelta(hours=2, seconds=b)}
            for b, f, u in ((0, None, 60), (1, 60, 70))])
        conn.execute(update(positions).values(next_offset=70))
    report = _verify(engine)
    assert not report.ok and report.results[0].unknown_starts == 1
    (s,) = verify_answer(report)["stretches"]
    assert (s["kind"], s["fromOffset"], s["untilOffset"], s["records"], s["explained"]) == ("unknown", 50, 60, 10, False)
    assert s["before"]["batchId"] == 4 and [b["queryId"] for b in s["batches"]] == ["9f1c2b7e-hand"]
    assert verify_answer(report)["summary"]["unknown"] == 1
    code, out, err = cli(["verify", "orders", "--no-truncate", "--dsn", str(engine.url)], capsys)
    print(out, err)  # the docs' transcript (docs/operations.md)
    assert code == 6, (out, err)
    assert "UNEXPLAINED" in out and " unknown " in out and "start unknown: batch 0 of 9f1c2b7e" in out
    assert "1 unexplained (0 gap(s), 0 overlap(s), 1 unknown start(s)): NOT accounted for" in out
    assert err.strip() == ("offset-ledger: error: pipeline 'orders': 1 unexplained stretch(es) (0 gap(s), "
                           "0 overlap(s), 1 unknown start(s))")
