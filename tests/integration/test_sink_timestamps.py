"""COPY staging keeps instants: a ``timestamp`` lands as the instant Spark held, whatever the workers' zone.

PySpark hands a Python worker a ``timestamp`` as a naive datetime in the *worker's* local time zone.
The oracle is the produced values themselves: each Kafka record is an ISO instant, the query casts
it to ``timestamp`` (an instant) and, without its ``Z``, to ``timestamp_ntz`` (a wall clock); the
target (``timestamptz``, ``timestamp``) in a UTC database must hold exactly those. The Python
workers run in Europe/Berlin across its 2026-10-25 DST change (00:30Z and 01:30Z are both 02:30
local there), the driver's JVM in America/New_York: neither zone may leak into the output.
A nested column (a struct with an instant, a wall clock and an array and a map of instants) lands
in a ``jsonb`` column: its instants with their UTC offset, its wall clock without one.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from sqlalchemy import create_engine, text

from tests.integration.sink_helper import run_driver

INSTANTS = ["2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z", "2026-10-25T00:59:59.999999Z",
            "2026-10-26T12:00:00Z", "2026-07-01T12:00:00.123456Z", "1969-12-31T23:59:59.5Z"]


def _instant(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_copy_staging_keeps_instants_and_wall_clocks_with_workers_in_berlin_across_dst(
        kafka, pg_dsn: str, stack, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, INSTANTS)
    engine = create_engine(pg_dsn)
    try:
        with engine.begin() as conn:
            conn.execute(text("DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET timezone TO ''UTC''', "
                              "current_database()); END $$"))
            conn.execute(text("CREATE TABLE ts_out (value text NOT NULL, ts timestamptz, ts_ntz timestamp, "
                              "nested jsonb)"))
        cfg = {"pipeline": "clock", "topic": topic, "bootstrap": kafka.bootstrap_servers, "dsn": pg_dsn,
               "checkpoint_root": str(tmp_path / "ck"), "jars": stack.spark_jars, "table": "ts_out",
               "app_version": "1", "executor_env": {"TZ": "Europe/Berlin"},
               "select": ["CAST(value AS STRING) AS value", "CAST(CAST(value AS STRING) AS TIMESTAMP) AS ts",
                          "CAST(replace(CAST(value AS STRING), 'Z', '') AS TIMESTAMP_NTZ) AS ts_ntz",
                          "named_struct('at', CAST(CAST(value AS STRING) AS TIMESTAMP), "
                          "'wall', CAST(replace(CAST(value AS STRING), 'Z', '') AS TIMESTAMP_NTZ), "
                          "'list', array(CAST(CAST(value AS STRING) AS TIMESTAMP)), "
                          "'by', map('k', CAST(CAST(value AS STRING) AS TIMESTAMP)), 'none', "
                          "CAST(NULL AS TIMESTAMP)) AS nested"],
               "probe": ["CAST('2026-10-25T00:30:00Z' AS TIMESTAMP)", "CAST('2026-10-25T01:30:00Z' AS TIMESTAMP)"]}
        code, out = run_driver(cfg, env={"TZ": "America/New_York"})
        assert code == 0 and "DONE" in out, out[-4000:]
        # The trap is armed: the workers really are in Berlin, where PySpark's datetimes of the two
        # instants are the same wall clock (what today's COPY text carried, without an offset).
        probe = json.loads(next(x for x in out.splitlines() if x.startswith("PROBE ")).removeprefix("PROBE "))
        assert probe == ["2026-10-25T02:30:00", "2026-10-25T02:30:00"], probe
        with engine.connect() as conn:
            rows = {r.value: (r.ts, r.ts_ntz) for r in conn.execute(text("SELECT value, ts, ts_ntz FROM ts_out"))}
            nested = {r.value: r for r in conn.execute(text(
                "SELECT value, nested->>'at' AS at, (nested->>'at')::timestamptz AS at_instant, "
                "nested->>'wall' AS wall, (nested->'list'->>0)::timestamptz AS first, "
                "(nested->'by'->>'k')::timestamptz AS by_k, nested ? 'none' AS has_none, "
                "nested->'none' = 'null'::jsonb AS none_is_null FROM ts_out"))}
    finally:
        engine.dispose()
    assert sorted(rows) == sorted(INSTANTS)
    assert {v: ts for v, (ts, _) in rows.items()} == {v: _instant(v) for v in INSTANTS}
    assert {v: ntz for v, (_, ntz) in rows.items()} == {v: _instant(v).replace(tzinfo=None) for v in INSTANTS}
    # Nested: the instants as the instants (with their offset, never a worker's wall clock), the
    # wall clock as it was written, the null field kept.
    assert {v: r.at_instant for v, r in nested.items()} == {v: _instant(v) for v in INSTANTS}
    assert all(r.at.endswith("+00:00") for r in nested.values()), [r.at for r in nested.values()]
    assert {v: (r.first, r.by_k) for v, r in nested.items()} == {v: (_instant(v), _instant(v)) for v in INSTANTS}
    assert {v: datetime.fromisoformat(r.wall) for v, r in nested.items()} == {
        v: _instant(v).replace(tzinfo=None) for v in INSTANTS}
    assert all(r.has_none and r.none_is_null for r in nested.values())
