"""Checkpoint generations and consumed resets on the embedded SQLite ledger (no services needed)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
from sqlalchemy import insert, select
from sqlalchemy.engine import Engine

from offset_ledger.ledger import generations as gens
from offset_ledger.ledger.engine import ensure_schema, make_engine
from offset_ledger.ledger.tables import checkpoint_generations, resets

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    eng = make_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    ensure_schema(eng)
    yield eng
    eng.dispose()


def _reset(engine: Engine, pipeline: str = "p", status: str = "pending", group: str | None = None) -> int:
    with engine.begin() as conn:
        return conn.execute(insert(resets).values(
            pipeline=pipeline, consumer_group=group or pipeline, mode="earliest", parameters={},
            actor="test", reason=None, dry_run=status == "dry_run", forced=False, created_at=T0,
            status=status,
        ).returning(resets.c.id)).scalar_one()


@pytest.mark.parametrize("root, expected", [
    ("/data/cp", "/data/cp/gen-3-abc"),
    ("/data/cp/", "/data/cp/gen-3-abc"),
    ("s3a://bucket/cp/orders", "s3a://bucket/cp/orders/gen-3-abc"),
    ("s3a://bucket", "s3a://bucket/gen-3-abc"),
    ("hdfs://nn:8020/cp/", "hdfs://nn:8020/cp/gen-3-abc"),
    ("abfss://c@acct.dfs.core.windows.net/cp", "abfss://c@acct.dfs.core.windows.net/cp/gen-3-abc"),
    ("/", "/gen-3-abc"),
    ("relative/cp", "relative/cp/gen-3-abc"),
])
def test_generation_location_joins_strings(root: str, expected: str) -> None:
    assert gens.generation_location(root, 3, "abc") == expected


def test_no_generation_before_the_first_restart(engine: Engine) -> None:
    with engine.connect() as conn:
        assert gens.current_generation(conn, "p", "p") is None
        assert gens.generations(conn, "p", "p") == []


def test_generations_number_up_with_unique_locations_and_record_what_was_chosen(engine: Engine) -> None:
    offsets = {"t": {"0": 12, "1": -2}}
    with engine.begin() as conn:
        g1, consumed = gens.create_generation(conn, gens.NewGeneration(
            pipeline="p", consumer_group="p", checkpoint_root="s3a://b/cp", app_version="1.0",
            reason="first", starting_offsets=offsets, now=T0))
    assert consumed == []
    with engine.begin() as conn:
        g2, _ = gens.create_generation(conn, gens.NewGeneration(
            pipeline="p", consumer_group="p", checkpoint_root="s3a://b/cp", app_version="2.0",
            reason="app_version", starting_offsets={"t": {"0": 20, "1": 3}}, now=T0))
    assert (g1.generation, g2.generation) == (1, 2)
    assert g1.location.startswith("s3a://b/cp/gen-1-") and g2.location.startswith("s3a://b/cp/gen-2-")
    assert g1.location != g2.location
    with engine.connect() as conn:
        current = gens.current_generation(conn, "p", "p")
        assert current == g2
        assert [g.generation for g in gens.generations(conn, "p", "p")] == [1, 2]
        stored = gens.generations(conn, "p", "p")[0]
    assert stored.starting_offsets == offsets
    assert stored.app_version == "1.0" and stored.reason == "first" and stored.checkpoint_root == "s3a://b/cp"


def test_generations_are_per_pipeline_and_consumer_group(engine: Engine) -> None:
    with engine.begin() as conn:
        gens.create_generation(conn, gens.NewGeneration(pipeline="p", consumer_group="g1", checkpoint_root="/cp",
                               app_version=None, reason="first", starting_offsets={}))
        g, _ = gens.create_generation(conn, gens.NewGeneration(
                                      pipeline="p", consumer_group="g2", checkpoint_root="/cp",
                                      app_version=None, reason="first", starting_offsets={}))
        assert g.generation == 1
        assert gens.current_generation(conn, "q", "q") is None


def test_pending_resets_are_found_and_consumed_with_the_generation(engine: Engine) -> None:
    first, second = _reset(engine), _reset(engine)
    _reset(engine, status="dry_run")
    _reset(engine, status="consumed")
    other = _reset(engine, pipeline="other")
    with engine.connect() as conn:
        pending = gens.pending_reset_ids(conn, "p", "p")
    assert pending == [first, second]
    with engine.begin() as conn:
        gen, consumed = gens.create_generation(conn, gens.NewGeneration(
            pipeline="p", consumer_group="p", checkpoint_root="/cp", app_version="1",
            reason="reset", starting_offsets={"t": {"0": 0}}, consume_reset_ids=pending, now=T0))
    assert consumed == [first, second]
    with engine.connect() as conn:
        rows = {r.id: r for r in conn.execute(select(resets))}
        assert gens.pending_reset_ids(conn, "p", "p") == []
        assert gens.pending_reset_ids(conn, "other", "other") == [other]
    for rid in (first, second):
        assert rows[rid].status == "consumed"
        assert rows[rid].consumed_by_generation == gen.id
        assert rows[rid].consumed_at is not None


def test_a_reset_consumed_meanwhile_is_not_consumed_twice(engine: Engine) -> None:
    rid = _reset(engine)
    with engine.begin() as conn:
        _, consumed = gens.create_generation(conn, gens.NewGeneration(
                                             pipeline="p", consumer_group="p", checkpoint_root="/cp",
                                             app_version=None, reason="reset", starting_offsets={},
                                             consume_reset_ids=[rid]))
    with engine.begin() as conn:
        g2, consumed_again = gens.create_generation(conn, gens.NewGeneration(
                                                    pipeline="p", consumer_group="p", checkpoint_root="/cp",
                                                    app_version=None, reason="reset", starting_offsets={},
                                                    consume_reset_ids=[rid]))
    assert consumed == [rid] and consumed_again == []
    with engine.connect() as conn:
        row = conn.execute(select(resets).where(resets.c.id == rid)).one()
    assert row.consumed_by_generation != g2.id


def test_a_failed_transaction_leaves_neither_generation_nor_consumed_reset(engine: Engine) -> None:
    rid = _reset(engine)
    with pytest.raises(RuntimeError):
        with engine.begin() as conn:
            gens.create_generation(conn, gens.NewGeneration(
                                   pipeline="p", consumer_group="p", checkpoint_root="/cp",
                                   app_version=None, reason="reset", starting_offsets={},
                                   consume_reset_ids=[rid]))
            raise RuntimeError("boom")
    with engine.connect() as conn:
        assert gens.pending_reset_ids(conn, "p", "p") == [rid]
        assert conn.execute(select(checkpoint_generations)).first() is None
