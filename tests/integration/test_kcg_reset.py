"""``reset`` speaks kafka-consumer-groups: its modes, its CSV, and its answers (KCG itself is the oracle);
exit codes 3 (refused), 4 (data loss) and 5 (unreachable) as scripts see them."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from offset_ledger import devstack
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.queries import current_positions
from tests.ops_seed import seed_pipeline

CLI = [sys.executable, "-c", "from offset_ledger.cli.main import main; main()"]


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=120)


def csv_lines(text: str) -> list[str]:
    """The topic,partition,offset rows of an export, unquoted (KCG quotes names with underscores)."""
    return sorted(",".join(row) for row in csv.reader(io.StringIO(text))
                  if len(row) == 3 and re.fullmatch(r"\d+,-?\d+", ",".join(row[1:])))


def positions(pg_dsn: str, pipeline: str) -> dict[tuple[str, int], int]:
    engine = make_engine(pg_dsn)
    try:
        with engine.connect() as conn:
            return {(p.topic, p.partition): p.next_offset for p in current_positions(conn, pipeline)}
    finally:
        engine.dispose()


def test_export_from_file_round_trip_and_kcg_parity(pg_dsn: str, kafka, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    a, b = kafka.create_topic(partitions=2), kafka.create_topic(partitions=1)
    kafka.produce(a, [f"v{i}" for i in range(40)])  # 20 per partition
    kafka.produce(b, [f"w{i}" for i in range(30)])
    engine = make_engine(pg_dsn)
    upgrade(engine)
    seed_pipeline(engine, "etl", {a: {0: 12, 1: 17}, b: {0: 25}})
    engine.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFSET_LEDGER_")}
    env.update(OFFSET_LEDGER_DSN=pg_dsn, OFFSET_LEDGER_BOOTSTRAP_SERVERS=kafka.bootstrap_servers)
    saved = positions(pg_dsn, "etl")
    r = run(env, "mirror", "etl")  # the Kafka group gets the positions: KCG's shift below starts from them
    assert r.returncode == 0, r.stderr

    # --export of --to-current is the positions, as KCG's topic,partition,offset lines.
    r = run(env, "reset", "etl", "--to-current", "--export", "--dry-run")
    assert r.returncode == 0, r.stderr
    exported = tmp_path / "saved.csv"
    exported.write_text(r.stdout)
    assert {(t, int(p)): int(o) for t, p, o in csv.reader(io.StringIO(r.stdout))} == saved

    # Move them, then --from-file --execute restores them exactly.
    r = run(env, "reset", "etl", "--to-earliest", "--all-topics", "--execute", "--reason", "test")
    assert r.returncode == 0, r.stderr
    assert set(positions(pg_dsn, "etl").values()) == {0}
    r = run(env, "reset", "etl", "--from-file", str(exported), "--execute", "--reason", "restore")
    assert r.returncode == 0, r.stderr
    assert positions(pg_dsn, "etl") == saved

    # KCG's own export of the same request is byte for byte what ours prints, and ours reads it back.
    kcg = devstack.consumer_groups_command(
        kafka.bootstrap_servers, "--group", "etl-kcg-oracle", "--reset-offsets", "--to-offset", "7",
        "--topic", a, "--export", "--dry-run")
    r = run(env, "reset", "etl", "--to-offset", "7", "--topic", a, "--export")
    assert r.returncode == 0, r.stderr
    assert csv_lines(r.stdout) == csv_lines(kcg) == [f"{a},0,7", f"{a},1,7"]
    kcg_file = tmp_path / "kcg.csv"
    kcg_file.write_text(kcg)  # as KCG wrote it, quotes and all
    r = run(env, "reset", "etl", "--from-file", str(kcg_file), "--execute", "--reason", "test", "--bootstrap-server",
            kafka.bootstrap_servers)
    assert r.returncode == 0, r.stderr
    assert positions(pg_dsn, "etl") == {**saved, (a, 0): 7, (a, 1): 7}

    # --shift-by past log-start lands on log-start, as KCG's does (its dry run on the mirrored group is
    # the oracle): never a negative target.
    kcg_shift = devstack.consumer_groups_command(
        kafka.bootstrap_servers, "--group", "etl", "--reset-offsets", "--shift-by", "-50",
        "--topic", a, "--export", "--dry-run")
    r = run(env, "reset", "etl", "--shift-by", "-50", "--topic", a, "--format", "csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [(x["partition"], x["targetNextOffset"], x["outOfRange"], x["clamped"]) for x in rows] == [
        ("0", "0", "below_log_start", "True"), ("1", "0", "below_log_start", "True")]
    assert csv_lines(kcg_shift) == [f"{a},0,0", f"{a},1,0"]

    # --by-duration: every record is younger than an hour, so the first offset; --timeout is accepted.
    r = run(env, "reset", "etl", "--by-duration", "PT1H", "--topic", b, "--export", "--timeout", "5000")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [f"{b},0,0"]

    # Bad input: one line, exit 2, nothing written.
    bad = tmp_path / "bad.csv"
    bad.write_text(f"{a},0,zero\n")
    before = positions(pg_dsn, "etl")
    for args in (["reset", "etl", "--from-file", str(bad), "--execute"],
                 ["reset", "etl", "--to-latest", "--dry-run", "--execute"],
                 ["reset", "etl", "--to-latest", "--all-topics", "--topic", a],
                 ["reset", "etl", "--by-duration", "soon"],
                 ["reset", "etl", "--to-offset", "-5"]):
        r = run(env, *args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, (args, r.stderr)
    assert positions(pg_dsn, "etl") == before


def test_exit_codes_refused_data_loss_unreachable(pg_dsn: str, kafka) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(partitions=1)
    kafka.produce(topic, [f"v{i}" for i in range(20)])
    engine = make_engine(pg_dsn)
    upgrade(engine)
    seed_pipeline(engine, "live", {topic: {0: 5}}, active=True)
    seed_pipeline(engine, "old", {topic: {0: 3}})
    engine.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFSET_LEDGER_")}
    env.update(OFFSET_LEDGER_DSN=pg_dsn, OFFSET_LEDGER_BOOTSTRAP_SERVERS=kafka.bootstrap_servers)

    r = run(env, "reset", "live", "--to-earliest", "--execute", "--reason", "test")
    assert r.returncode == 3 and "active run" in r.stderr  # refused: stop it or --force
    r = run(env, "reset", "old", "--to-offset", "99", "--execute", "--reason", "test")
    assert r.returncode == 3 and "outside the log" in r.stderr  # refused: --out-of-range clamp
    kafka.delete_records(topic, {0: 10})  # retention took what "old" had not read
    r = run(env, "resolve", "old", "--topic", topic)
    assert r.returncode == 4 and r.stderr.startswith("offset-ledger: error: ")  # data loss, policy fail
    r = run(env, "resolve", "old", "--topic", topic, "--on-data-loss", "earliest")
    assert r.returncode == 0 and json.loads(r.stdout) == {topic: {"0": 10}}
    r = run(env, "lag", "old", "--bootstrap-server", "127.0.0.1:1", "--timeout", "2000")
    assert r.returncode == 5 and "cannot reach Kafka" in r.stderr
    r = run(dict(env, OFFSET_LEDGER_DSN="postgresql+psycopg2://nobody@127.0.0.1:1/none"), "offsets", "old")
    assert r.returncode == 5 and "ledger database" in r.stderr
    assert positions(pg_dsn, "live") == {(topic, 0): 5} and positions(pg_dsn, "old") == {(topic, 0): 3}


def test_offset_zero_and_a_shift_by_zero_as_kcg_takes_them(pg_dsn: str, kafka) -> None:  # type: ignore[no-untyped-def]
    """``--to-offset 0`` and ``--shift-by 0`` are choices (issue 50): exit 0 dry runs whose targets are
    KCG's own for the same request, never "choose exactly one of ..."."""
    a = kafka.create_topic(partitions=2)
    kafka.produce(a, [f"v{i}" for i in range(40)])
    engine = make_engine(pg_dsn)
    upgrade(engine)
    seed_pipeline(engine, "zero", {a: {0: 12, 1: 17}})
    engine.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFSET_LEDGER_")}
    env.update(OFFSET_LEDGER_DSN=pg_dsn, OFFSET_LEDGER_BOOTSTRAP_SERVERS=kafka.bootstrap_servers)
    assert run(env, "mirror", "zero").returncode == 0  # KCG's --shift-by starts from the group's offsets
    before = positions(pg_dsn, "zero")
    for mode in (["--to-offset", "0"], ["--shift-by", "0"]):
        kcg = devstack.consumer_groups_command(kafka.bootstrap_servers, "--group", "zero", "--reset-offsets",
                                               *mode, "--topic", a, "--export", "--dry-run")
        r = run(env, "reset", "zero", *mode, "--topic", a, "--export")
        assert r.returncode == 0, (mode, r.stderr)
        assert csv_lines(r.stdout) == csv_lines(kcg), mode
    assert csv_lines(r.stdout) == [f"{a},0,12", f"{a},1,17"]  # a shift by 0 stays put
    assert positions(pg_dsn, "zero") == before
