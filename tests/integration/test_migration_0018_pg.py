"""0018 (offset_ranges partitioned by batch_pk) on real PostgreSQL: a 0017 ledger that both earlier releases
wrote converts in place and back with every range and audit answer the same, both releases keep recording
on the partitioned table, and a team role granted before the migration keeps exactly its rights."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from sqlalchemy import func, insert, select, text
from sqlalchemy.engine import Engine, make_url
from typer.testing import CliRunner

from offset_ledger.ledger.engine import current_revision, downgrade, head_revision, make_engine, permission_denied, upgrade
from offset_ledger.ledger.tables import batches, offset_ranges
from tests.previous_release import COMPACT_RELEASE, extract, record_with_previous_release, run_documented
from tests.unit.ledger.test_migration_0016_sqlite import _history_ranges, _ranges, _stretch_kinds


def _kind(engine: Engine) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("SELECT relkind FROM pg_class WHERE oid = 'offset_ranges'::regclass")).scalar())


def _partitions(engine: Engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(  # type: ignore[misc]
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i JOIN pg_class c "
            "ON c.oid = i.inhrelid WHERE i.inhparent = 'offset_ranges'::regclass ORDER BY c.relname"))]


def test_0018_partitions_a_0017_ledger_both_ways_and_both_releases_keep_recording(
        pg_dsn: str, tmp_path: Path) -> None:
    compact = extract(tmp_path / "compact", COMPACT_RELEASE)
    older = extract(tmp_path / "older")
    engine = make_engine(pg_dsn)
    try:
        upgrade(engine, "0017")
        recorded = record_with_previous_release(compact, pg_dsn, "orders", "q-a")["ranges"]
        recorded += record_with_previous_release(older, pg_dsn, "orders", "q-b")["ranges"]
        with engine.connect() as conn:
            before = run_documented(conn)
            rows_before = conn.execute(select(func.count()).select_from(offset_ranges)).scalar()
        ranges = _ranges(engine)
        assert ranges == sorted(tuple(r) for r in recorded) and len(ranges) == 2 * 7 * 252
        assert sum(len(v) for v in before.values() if isinstance(v, list)) > 0  # the comparison is not vacuous
        assert _kind(engine) == "r"

        upgrade(engine)
        assert current_revision(engine) == head_revision()
        assert _kind(engine) == "p"
        parts = dict(_partitions(engine))
        with engine.connect() as conn:
            last = conn.execute(select(func.max(batches.c.id))).scalar_one()
        bound = int(parts["offset_ranges_p0"].split("TO ('")[1].rstrip("')"))
        assert parts["offset_ranges_p0"].startswith("FOR VALUES FROM (MINVALUE)") and last < bound <= last + 20
        assert parts["offset_ranges_default"] == "DEFAULT" and len(parts) == 1 + 8 + 1, parts  # p0, 8 ahead, DEFAULT
        assert _ranges(engine) == ranges == _history_ranges(engine, "orders")
        with engine.connect() as conn:
            assert run_documented(conn) == before
            assert conn.execute(select(func.count()).select_from(offset_ranges)).scalar() == rows_before
            assert conn.execute(text("SELECT count(*) FROM ONLY offset_ranges_p0")).scalar() == rows_before

        # Both earlier releases record on the partitioned table: new batches go to the next partition.
        more = record_with_previous_release(compact, pg_dsn, "payments", "q-c")
        assert [o[:2] for o in more["outcomes"]] == [[1, 0], [1, 0], [1, 0], [1, 0], [3, 0]]
        assert more["general_path_calls"] == [0]  # the rest on its one-statement paths
        more_old = record_with_previous_release(older, pg_dsn, "refunds", "q-d")
        assert [o[:2] for o in more_old["outcomes"]] == [[1, 0], [1, 0], [1, 0], [1, 0], [3, 0]]
        ranges = sorted([*ranges, *(tuple(r) for r in more["ranges"] + more_old["ranges"])])
        assert _ranges(engine) == ranges
        assert _history_ranges(engine, "payments") == sorted(tuple(r) for r in more["ranges"])
        assert _history_ranges(engine, "refunds") == sorted(tuple(r) for r in more_old["ranges"])
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM ONLY offset_ranges_p0")).scalar() == rows_before
            assert conn.execute(text("SELECT count(*) FROM offset_ranges_default")).scalar() == 0
        for pipeline in ("payments", "refunds"):
            assert _stretch_kinds(engine, pipeline) <= {"read", "unknown_start"}, _stretch_kinds(engine, pipeline)

        downgrade(engine, "0017")
        assert _kind(engine) == "r"
        assert _ranges(engine) == ranges
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM batch_offsets")).scalar() == 0
        upgrade(engine)
        assert _kind(engine) == "p" and _ranges(engine) == ranges
    finally:
        engine.dispose()


@pytest.fixture
def role(pg_dsn: str):  # type: ignore[no-untyped-def]
    name = f"team_a_{uuid.uuid4().hex[:8]}"
    yield name
    engine = make_engine(pg_dsn)
    with engine.begin() as conn:
        if conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": name}).first():
            conn.execute(text(f'DROP OWNED BY "{name}"'))
            conn.execute(text(f'DROP ROLE "{name}"'))
    engine.dispose()


def test_a_team_role_granted_before_0018_keeps_its_rights_and_scope(pg_dsn: str, role: str) -> None:
    from offset_ledger.cli.main import app

    admin = make_engine(pg_dsn)
    try:
        upgrade(admin, "0017")
        result = CliRunner().invoke(app, ["db", "grant", "--role", role, "--pipelines", "team-a-*", "--dsn", pg_dsn,
                                          "--execute"])
        assert result.exit_code == 0, result.output
        t = text("SELECT now()")
        with admin.begin() as conn:
            conn.execute(text(f"ALTER ROLE \"{role}\" PASSWORD 'pw'"))
            now = conn.execute(t).scalar()
            ids = {}
            for pipeline in ("team-a-orders", "team-b-pay"):
                ids[pipeline] = conn.execute(insert(batches).values(
                    pipeline=pipeline, consumer_group=pipeline, query_id=f"q-{pipeline}", run_id="r", batch_id=0,
                    batch_time=now, recorded_at=now, input_rows=0).returning(batches.c.id)).scalar_one()
        upgrade(admin)  # the owner's db upgrade; no grant is re-run
        assert _kind(admin) == "p"
        url = make_url(pg_dsn).set(username=role, password="pw")
        team = make_engine(url.render_as_string(hide_password=False), create=False)
        try:
            row = {"source_index": 0, "topic": "t", "partitions": [0], "from_offsets": [0], "until_offsets": [5]}
            with team.begin() as conn:  # its own pipeline's batch: written through the parent
                conn.execute(insert(offset_ranges).values(batch_pk=ids["team-a-orders"], **row))
            with pytest.raises(Exception) as refused:  # another team's: refused by the AFTER trigger
                with team.begin() as conn:
                    conn.execute(insert(offset_ranges).values(batch_pk=ids["team-b-pay"], **row))
            assert permission_denied(refused.value), refused.value
            with admin.begin() as conn:
                conn.execute(insert(offset_ranges).values(batch_pk=ids["team-b-pay"], **row))
            with team.connect() as conn:  # and it reads only its own rows
                seen = conn.execute(select(offset_ranges.c.batch_pk)).scalars().all()
            assert seen == [ids["team-a-orders"]]
        finally:
            team.dispose()
    finally:
        admin.dispose()
