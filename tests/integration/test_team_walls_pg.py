"""The team walls hold on every path that brings a ledger to a revision (issue 48), on real PostgreSQL.

A ledger granted to two teams (``db grant``) is upgraded by the owner's ``db upgrade``, by the
automatic upgrade every writer runs at start (``engine.ensure_schema``: a listener, start_from_ledger,
a PostgresSink, watch), by a downgrade and up again, from this tree's revisions 0017+ and from the
released ledgers that had grants (0017 by f245580, 0019 by 1e8e3af); and an older ledger (0014 by
4cc5ce0) is upgraded, then granted. After each, the schema is read from ``pg_catalog`` (every table,
partition, view and sequence, not a hand list) and compared with what ``row_security`` promises:
row security and the four policies on every table, ``security_invoker`` on every view, exactly the
privileges ``GUARDED`` gives each team role and none on a partition. Then, as team A, every relation
with a ``pipeline`` column shows only team A's pipelines, where the owner sees both teams in it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, insert, text
from sqlalchemy.engine import Engine, make_url
from typer.testing import CliRunner

from offset_ledger.ledger.engine import downgrade, ensure_schema, head_revision, make_engine, upgrade
from offset_ledger.ledger.row_security import GUARDED
from offset_ledger.ledger.tables import (
    checkpoint_generations,
    findings,
    listener_health,
    pipeline_policies,
    pruned_ranges,
    reset_partitions,
    resets,
    sink_batches,
    sinks,
)
from tests.ops_seed import seed_pipeline
from tests.previous_release import COMPACT_RELEASE, LAST_RELEASE, PREVIOUS_RELEASE, extract, \
    record_with_previous_release

A, B = "team-a-orders", "team-b-payments"
PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
#: Tables that are not a pipeline's rows: the schema's version (readable) and the scopes (own row only).
UNGUARDED = {"alembic_version": ("SELECT",), "ledger_role_scopes": ("SELECT",)}


@pytest.fixture
def roles(pg_dsn: str) -> Iterator[dict[str, str]]:
    """Two role names of this test's own (roles are cluster-wide), dropped afterwards."""
    suffix = uuid.uuid4().hex[:8]
    names = {"a": f"walls_a_{suffix}", "b": f"walls_b_{suffix}"}
    yield names
    admin = make_engine(pg_dsn)
    with admin.begin() as conn:
        for role in names.values():
            if conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first():
                conn.execute(text(f'DROP OWNED BY "{role}"'))
                conn.execute(text(f'DROP ROLE "{role}"'))
    admin.dispose()


def grant(dsn: str, roles: dict[str, str], release: Path | None = None) -> None:
    """``db grant`` of both teams, by this tree's command line or by the release at ``release``."""
    for key, pattern in (("a", "team-a-*"), ("b", "team-b-*")):
        argv = ["db", "grant", "--role", roles[key], "--pipelines", pattern, "--dsn", dsn, "--execute"]
        if release is None:
            from offset_ledger.cli.main import app

            result = CliRunner().invoke(app, argv)
            assert result.exit_code == 0, result.output
        else:
            _run_release(release, "from offset_ledger.cli.main import main; main(sys.argv[1:])", *argv)
    admin = make_engine(dsn)
    with admin.begin() as conn:
        for role in roles.values():
            conn.execute(text(f"ALTER ROLE \"{role}\" PASSWORD 'pw'"))
    admin.dispose()


def team_engine(dsn: str, role: str) -> Engine:
    return make_engine(make_url(dsn).set(username=role, password="pw").render_as_string(hide_password=False),
                       create=False)


def _run_release(release: Path, script: str, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(release)
    done = subprocess.run([sys.executable, "-c", "import sys; " + script, *args], env=env, cwd=release,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]


def upgrade_by_release(release: Path, dsn: str, revision: str) -> None:
    """The release's own upgrade (its own 0001 builds its own tables, in its own column order)."""
    _run_release(release, "from offset_ledger.ledger.engine import make_engine, upgrade; "
                          "upgrade(make_engine(sys.argv[1]), sys.argv[2])", dsn, revision)


def seed_both(admin: Engine) -> None:
    """Rows of both teams in every table with a pipeline, as the owner writes them (at head)."""
    for pipeline, topic in ((A, "orders-a"), (B, "payments-b")):
        seed_pipeline(admin, pipeline, {topic: {0: 50, 1: 60}}, start=datetime.now(timezone.utc) - timedelta(days=3))
        now = func.now()
        with admin.begin() as conn:
            reset_id = conn.execute(insert(resets).values(
                pipeline=pipeline, consumer_group=pipeline, mode="earliest", actor="ops", dry_run=False, forced=False,
                created_at=now, status="pending").returning(resets.c.id)).scalar_one()
            conn.execute(insert(reset_partitions).values(reset_id=reset_id, topic=topic, partition=0,
                                                         after_next_offset=0))
            conn.execute(insert(findings).values(pipeline=pipeline, consumer_group=pipeline, kind="gap",
                                                 message="gap", created_at=now))
            generation = conn.execute(insert(checkpoint_generations).values(
                pipeline=pipeline, consumer_group=pipeline, generation=1, checkpoint_root="/c",
                location=f"/c/{pipeline}/1", reason="first", created_at=now).returning(
                checkpoint_generations.c.id)).scalar_one()
            conn.execute(insert(listener_health).values(listener_id=f"l-{pipeline}", pipeline=pipeline,
                                                        reported_at=now))
            conn.execute(insert(pipeline_policies).values(pipeline=pipeline, policies={}, actor="ops", created_at=now))
            conn.execute(insert(sinks).values(sink=f"s-{pipeline}", pipeline=pipeline, consumer_group=pipeline,
                                              kind="postgres", target="t", last_sequence=1, updated_at=now))
            conn.execute(insert(sink_batches).values(
                sink=f"s-{pipeline}", pipeline=pipeline, consumer_group=pipeline, sequence=1,
                generation_id=generation, query_id="q", batch_id=0, target="t", committed_at=now, recorded_at=now))
            conn.execute(insert(pruned_ranges).values(
                pipeline=pipeline, consumer_group=pipeline, query_id="q-old", topic=topic, partition=0,
                from_batch_id=0, until_batch_id=0, from_offset=0, until_offset=1, batches=1,
                first_batch_time=now, cutoff=now, pruned_at=now))


def _relations(conn: Any) -> list[tuple[str, str, bool]]:
    """(name, relkind, is a partition) of every table, view and sequence in the ledger's schema."""
    return [tuple(r) for r in conn.execute(text(
        "SELECT c.relname, c.relkind, c.relispartition FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S') ORDER BY 1"))]


def _expected_privileges(name: str) -> set[str]:
    """What a team role should hold on table ``name``: SELECT plus GUARDED's writes (column lists apart)."""
    guarded = {g.table: g for g in GUARDED}[name]
    return {"SELECT", *(w for w in guarded.writes if "(" not in w)}


def schema_problems(admin: Engine, roles: dict[str, str]) -> list[str]:
    """Every way the schema differs from the walls ``row_security`` promises, read from pg_catalog."""
    problems: list[str] = []
    guarded = {g.table: g for g in GUARDED}
    with admin.connect() as conn:
        for name, kind, partition in _relations(conn):
            security, options = conn.execute(text(
                "SELECT relrowsecurity, coalesce(reloptions, '{}') FROM pg_class WHERE oid = CAST(:n AS regclass)"),
                {"n": name}).one()
            policies = set(conn.execute(text("SELECT polname FROM pg_policy WHERE polrelid = CAST(:n AS regclass)"),
                                        {"n": name}).scalars())
            held = {role: {p for p in PRIVILEGES if conn.execute(text(
                "SELECT has_table_privilege(:r, CAST(:n AS regclass), :p)"), {"r": role, "n": name, "p": p}).scalar()}
                for role in roles.values()} if kind != "S" else {}
            if kind == "S":
                for role in roles.values():
                    if conn.execute(text("SELECT has_sequence_privilege(:r, CAST(:n AS regclass), 'UPDATE')"),
                                    {"r": role, "n": name}).scalar():
                        problems.append(f"{name}: {role} may set the sequence")
                continue
            if kind in ("v", "m"):
                if "security_invoker=true" not in options:
                    problems.append(f"view {name}: no security_invoker (options {options})")
                for role, privileges in held.items():
                    if privileges != {"SELECT"}:
                        problems.append(f"view {name}: {role} holds {sorted(privileges)}, not SELECT")
                continue
            if partition:  # reached through its parent only (the parent's policies and checks)
                for role, privileges in held.items():
                    if privileges:
                        problems.append(f"partition {name}: {role} holds {sorted(privileges)} on it directly")
                continue
            if name in UNGUARDED:
                for role, privileges in held.items():
                    if privileges != set(UNGUARDED[name]):
                        problems.append(f"{name}: {role} holds {sorted(privileges)}")
                if name == "ledger_role_scopes" and (not security or policies != {"offset_ledger_own_scope"}):
                    problems.append(f"{name}: row security {security}, policies {sorted(policies)}")
                continue
            if name not in guarded:
                problems.append(f"table {name} is not under row security (add it to row_security.GUARDED)")
                continue
            want = {f"offset_ledger_{c}" for c in ("select", "insert", "update", "delete")}
            if not security or policies != want:
                problems.append(f"table {name}: row security {security}, policies {sorted(policies)}")
            for role, privileges in held.items():
                if privileges != _expected_privileges(name):
                    problems.append(f"table {name}: {role} holds {sorted(privileges)}, "
                                    f"not {sorted(_expected_privileges(name))}")
                for w in guarded[name].writes:
                    if "(" in w:
                        columns = [c.strip() for c in w[w.index("(") + 1:-1].split(",")]
                        for column in columns:
                            if not conn.execute(text("SELECT has_column_privilege(:r, CAST(:n AS regclass), :c, "
                                                     "'UPDATE')"), {"r": role, "n": name, "c": column}).scalar():
                                problems.append(f"table {name}: {role} may not update {column}")
        for g in GUARDED:
            if g.checked_after:
                trigger = f"offset_ledger_{g.table}_scope"
                if not conn.execute(text("SELECT 1 FROM pg_trigger WHERE tgrelid = CAST(:n AS regclass) "
                                         "AND tgname = :t"), {"n": g.table, "t": trigger}).first():
                    problems.append(f"table {g.table}: trigger {trigger} missing")
        for fn in ("offset_ledger_in_scope", "offset_ledger_unscoped"):
            config = conn.execute(text("SELECT proconfig FROM pg_proc WHERE proname = :f"), {"f": fn}).scalar()
            if not config or not any(c.startswith("search_path=") for c in config):
                problems.append(f"function {fn}: search path not pinned ({config})")
    return problems


def leaks(admin: Engine, team: Engine, own: str) -> dict[str, Any]:
    """Per relation with a ``pipeline`` column: the pipelines the team reads outside ``own``'s prefix, and
    whether the owner sees more than one team there (so that the relation proves something)."""
    out: dict[str, Any] = {}
    with admin.connect() as conn:
        names = conn.execute(text(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'pipeline' AND NOT a.attisdropped "
            "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v', 'm') AND NOT c.relispartition "
            "ORDER BY 1")).scalars().all()
        both = {n for n in names if conn.execute(text(f'SELECT count(DISTINCT pipeline) FROM "{n}"')).scalar() > 1}
    with team.connect() as conn:
        for name in names:
            seen = set(conn.execute(text(f'SELECT DISTINCT pipeline FROM "{name}"')).scalars())
            foreign = sorted(p for p in seen if p is not None and not p.startswith(own))
            if foreign:
                out[name] = foreign
    out["_proving"] = sorted(both)
    return out


def assert_walls(dsn: str, roles: dict[str, str]) -> None:
    admin = make_engine(dsn)
    team = team_engine(dsn, roles["a"])
    try:
        assert schema_problems(admin, roles) == []
        seen = leaks(admin, team, "team-a-")
        proving = seen.pop("_proving")
        assert seen == {}, seen
        # the relations a team reads every day hold both teams' rows here: the check above proves something
        assert {"v_batch_offsets", "v_batch_history", "v_current_positions", "batches", "v_positions",
                "topic_positions"} <= set(proving)
    finally:
        team.dispose()
        admin.dispose()


def test_a_writers_automatic_upgrade_keeps_the_walls(pg_dsn: str, roles: dict[str, str]) -> None:
    """Issue 48, case 1: a ledger at 0017 with two teams granted; a process on the new release using the
    owner's login upgrades it at start (``ensure_schema``); team A then reads only its own rows."""
    admin = make_engine(pg_dsn)
    upgrade(admin, "0017")
    grant(pg_dsn, roles)
    writer = make_engine(pg_dsn)  # a listener's, start_from_ledger's, a PostgresSink's or watch's engine
    ensure_schema(writer)
    writer.dispose()
    seed_both(admin)
    admin.dispose()
    assert_walls(pg_dsn, roles)


RELEASES = {"compact": COMPACT_RELEASE, "last": LAST_RELEASE, "older": PREVIOUS_RELEASE}


def _cli_upgrade(dsn: str) -> None:
    from offset_ledger.cli.main import app

    result = CliRunner().invoke(app, ["db", "upgrade", "--dsn", dsn])
    assert result.exit_code == 0 and "row-level security re-applied" in result.output, result.output


def _auto_upgrade(dsn: str) -> None:
    writer = make_engine(dsn)  # the path every writer takes at start
    ensure_schema(writer)
    writer.dispose()


@pytest.mark.parametrize(("made_by", "start", "path"), [
    ("tree", "0017", "cli"),
    ("tree", "0017", "down-up"),
    ("tree", "0018", "auto"),
    ("tree", "0019", "auto"),
    ("tree", "0020", "cli"),
    ("compact", "0017", "auto"),   # granted by f245580's own db grant, with its own rows
    ("last", "0019", "auto"),      # 1e8e3af: its positions laid out before 0021 (v_current_positions re-made)
    ("last", "0019", "down-up"),
    ("older", "0014", "auto"),     # 4cc5ce0, before grants existed: upgraded, then granted
])
def test_the_walls_hold_on_every_upgrade_path(pg_dsn: str, roles: dict[str, str], tmp_path: Path,
                                             made_by: str, start: str, path: str) -> None:
    release = extract(tmp_path / made_by, RELEASES[made_by]) if made_by != "tree" else None
    admin = make_engine(pg_dsn)
    try:
        if release is None:
            upgrade(admin, start)
        else:
            upgrade_by_release(release, pg_dsn, start)
            for pipeline in (A, B):  # rows the release itself wrote, in its own layout
                record_with_previous_release(release, pg_dsn, pipeline, str(uuid.uuid4()))
        if start >= "0017":
            grant(pg_dsn, roles, release)
        if path == "cli":
            _cli_upgrade(pg_dsn)
        else:
            _auto_upgrade(pg_dsn)
        if path == "down-up":
            downgrade(admin, start)
            assert schema_problems(admin, roles) == []  # the downgrade's transaction re-applied them too
            _auto_upgrade(pg_dsn)
        if start < "0017":
            grant(pg_dsn, roles)
        with admin.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == head_revision()
        seed_both(admin)
    finally:
        admin.dispose()
    assert_walls(pg_dsn, roles)


def test_a_downgrade_below_0017_is_refused_while_a_team_is_scoped(pg_dsn: str, roles: dict[str, str]) -> None:
    """Below 0017 the scopes and policies are gone but the team roles keep their table grants: refused."""
    from offset_ledger.errors import InvalidInput

    admin = make_engine(pg_dsn)
    try:
        upgrade(admin)
        grant(pg_dsn, roles)
        with pytest.raises(InvalidInput, match="downgrade below 0017"):
            downgrade(admin, "0016")
        with admin.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == head_revision()
        assert schema_problems(admin, roles) == []
        with admin.begin() as conn:  # the documented way down: the scopes first
            conn.execute(text("DELETE FROM ledger_role_scopes"))
        downgrade(admin, "0016")
    finally:
        admin.dispose()


def test_a_table_without_a_policy_fails_the_schema_check(pg_dsn: str, roles: dict[str, str]) -> None:
    """The check reads the catalog: a table or view a future migration adds unguarded is caught."""
    admin = make_engine(pg_dsn)
    try:
        upgrade(admin)
        grant(pg_dsn, roles)
        with admin.begin() as conn:
            conn.execute(text("CREATE TABLE team_notes (pipeline text)"))
            conn.execute(text("CREATE VIEW v_notes AS SELECT pipeline FROM positions"))
        problems = schema_problems(admin, roles)
        assert "table team_notes is not under row security (add it to row_security.GUARDED)" in problems
        assert any(p.startswith("view v_notes: no security_invoker") for p in problems), problems
    finally:
        admin.dispose()


def _prune(capsys: Any, dsn: str, *argv: str) -> tuple[int, str]:
    """The command line's exit code and output (stdout and stderr), as a shell would see them."""
    from offset_ledger.cli.main import main

    capsys.readouterr()
    try:
        main(["prune", "--older-than", "1d", "--dsn", dsn, *argv])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out + out.err


def _history(admin: Engine) -> dict[str, Any]:
    with admin.connect() as conn:
        return {p: (conn.execute(text("SELECT count(*) FROM batches WHERE pipeline = :p"), {"p": p}).scalar(),
                    conn.execute(text("SELECT count(*) FROM v_batch_offsets WHERE pipeline = :p"), {"p": p}).scalar(),
                    conn.execute(text("SELECT count(*) FROM pruned_ranges WHERE pipeline = :p"), {"p": p}).scalar())
                for p in (A, B)}


def test_a_team_prunes_its_own_pipeline_and_nothing_else(pg_dsn: str, roles: dict[str, str], capsys: Any) -> None:
    """Issue 48, case 2: ``prune --pipeline`` as a team role works within its scope (row security limits
    its deletes to its pipelines); another team's pipeline is an unknown name; a whole-ledger prune is
    refused with the reason; and a missing right is reported as itself, not as an aborted transaction."""
    admin = make_engine(pg_dsn)
    try:
        upgrade(admin)
        grant(pg_dsn, roles)
        seed_both(admin)
        team = make_url(pg_dsn).set(username=roles["a"], password="pw").render_as_string(hide_password=False)
        before = _history(admin)
        assert before[A][0] == 3 and before[B][0] == 3
        code, output = _prune(capsys, team, "--pipeline", A, "--execute")
        assert code == 0, output
        after = _history(admin)
        assert after[B] == before[B]  # untouched
        assert after[A][0] == 1 and after[A][1] == 2 and after[A][2] > before[A][2], after  # the latest batch stays
        other = _prune(capsys, team, "--pipeline", B, "--execute")
        unknown = _prune(capsys, team, "--pipeline", "team-b-nothing", "--execute")
        assert other[0] == unknown[0] == 2, (other, unknown)
        assert other[1].replace(B, "team-b-nothing") == unknown[1], (other, unknown)  # nothing of B disclosed
        assert "team-b" not in unknown[1].replace("team-b-nothing", ""), unknown
        code, output = _prune(capsys, team, "--execute")
        assert code == 2 and f"ledger role {roles['a']!r} reaches only its team's pipelines" in output, output
        assert _history(admin) == after
        with admin.begin() as conn:  # a right the role lacks: the error names it
            conn.execute(text(f'REVOKE INSERT ON pruned_ranges FROM "{roles["a"]}"'))
        seed_pipeline(admin, A, {"orders-a2": {0: 90}}, start=datetime.now(timezone.utc) - timedelta(days=2))
        code, output = _prune(capsys, team, "--pipeline", A, "--execute")
        assert code != 0
        assert f"may not prune pipeline {A!r}: permission denied for table pruned_ranges" in output, output
        assert "current transaction is aborted" not in output, output
        assert _history(admin)[B] == before[B]
    finally:
        admin.dispose()


def test_a_team_listener_of_several_pipelines_reports_its_own_health(pg_dsn: str, roles: dict[str, str]) -> None:
    """A listener recording several pipelines reports health without a pipeline: a team role's row is
    written (0023: the role that wrote it), read back by that team only, and cannot claim another."""
    from offset_ledger.ledger.engine import permission_denied
    from offset_ledger.ledger.recorder import Recorder

    admin = make_engine(pg_dsn)
    upgrade(admin)
    grant(pg_dsn, roles)
    teams = {key: team_engine(pg_dsn, role) for key, role in roles.items()}
    try:
        for key, engine in teams.items():
            recorder = Recorder(engine)
            recorder.report_health(f"l-{key}", None, f"host-{key}", {"written": 3}, f"error of team {key}")
            recorder.close()
        for key, engine in teams.items():
            with engine.connect() as conn:
                assert set(conn.execute(text("SELECT listener_id FROM listener_health")).scalars()) == {f"l-{key}"}
        with pytest.raises(Exception) as refused:  # a row in another role's name
            with teams["a"].begin() as conn:
                conn.execute(insert(listener_health).values(listener_id="l-x", reported_at=func.now(),
                                                            ledger_role=roles["b"]))
        assert permission_denied(refused.value), refused.value
        with admin.connect() as conn:
            assert dict(conn.execute(text("SELECT listener_id, ledger_role FROM listener_health")).all()) == {
                "l-a": roles["a"], "l-b": roles["b"]}
    finally:
        for engine in teams.values():
            engine.dispose()
        admin.dispose()


_RELEASE_HEALTH = ("from offset_ledger.ledger.engine import make_engine; from offset_ledger.ledger.recorder import "
                   "Recorder; r = Recorder(make_engine(sys.argv[1])); "
                   "r.report_health(sys.argv[2], None, 'old-host', {'written': 1}, None); r.close()")


def test_0023_from_the_last_release_down_and_up_with_its_listener_recording(
        pg_dsn: str, roles: dict[str, str], tmp_path: Path) -> None:
    """0023 on a ledger the last release (1e8e3af, 0019) made and wrote: its rows stay, its recorder keeps
    recording and reporting health (as the owner and as a team role) on it, down to 0021 and up again."""
    release = extract(tmp_path / "last", LAST_RELEASE)
    upgrade_by_release(release, pg_dsn, "0019")
    record_with_previous_release(release, pg_dsn, A, str(uuid.uuid4()))
    _run_release(release, _RELEASE_HEALTH, pg_dsn, "old-before")
    admin = make_engine(pg_dsn)
    team_dsn = make_url(pg_dsn).set(username=roles["a"], password="pw").render_as_string(hide_password=False)
    try:
        with admin.connect() as conn:
            before = conn.execute(text("SELECT count(*) FROM v_batch_offsets")).scalar()
        upgrade(admin)
        grant(pg_dsn, roles)
        with admin.connect() as conn:
            assert conn.execute(text("SELECT ledger_role FROM listener_health WHERE listener_id = 'old-before'")
                                ).scalar() is None  # written before: no team's
        for step in ("head", "0021", "head"):
            if step == "0021":
                downgrade(admin, "0021")
            else:
                _auto_upgrade(pg_dsn)
            assert schema_problems(admin, roles) == []
            record_with_previous_release(release, pg_dsn, A, str(uuid.uuid4()))  # the owner's listener
            _run_release(release, _RELEASE_HEALTH, pg_dsn, f"old-owner-{step}")
        _run_release(release, _RELEASE_HEALTH, team_dsn, "old-team")  # the last release as team A, at head
        with admin.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM v_batch_offsets")).scalar() == before * 4
            roles_seen = dict(conn.execute(text("SELECT listener_id, ledger_role FROM listener_health")).all())
        assert roles_seen["old-team"] == roles["a"] and roles_seen["old-owner-0021"] is None
        team = team_engine(pg_dsn, roles["a"])
        with team.connect() as conn:
            assert set(conn.execute(text("SELECT listener_id FROM listener_health")).scalars()) == {"old-team"}
        team.dispose()
    finally:
        admin.dispose()


def test_a_team_role_cannot_upgrade_the_ledger_and_is_told_why(pg_dsn: str, roles: dict[str, str]) -> None:
    """A team's process on a new release meets a ledger the owner has not upgraded: its automatic upgrade
    is refused with the revisions and what to run, and nothing changes (the walls included)."""
    admin = make_engine(pg_dsn)
    try:
        upgrade(admin, "0021")
        grant(pg_dsn, roles)
        team = team_engine(pg_dsn, roles["a"])
        with pytest.raises(Exception) as refused:
            ensure_schema(team)
        team.dispose()
        message = str(refused.value)
        assert f"at revision 0021 and this release needs {head_revision()}; role {roles['a']!r} may not migrate it" \
            in message and "run 'offset-ledger db upgrade' as the ledger's owner" in message, message
        with admin.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0021"
        assert schema_problems(admin, roles) == []
    finally:
        admin.dispose()
