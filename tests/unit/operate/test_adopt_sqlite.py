"""Importing checkpoints into the embedded SQLite ledger, through the function and the CLI (no services)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from offset_ledger.errors import AdoptionRefused, CheckpointFormatError, ConfigError, InvalidInput
from offset_ledger.ledger.engine import current_revision, make_engine
from offset_ledger.ledger.tables import checkpoint_generations, findings, positions
from offset_ledger.operate.adopt import adopt_checkpoint, import_checkpoint, parent_location, plan_adoption, plan_import
from offset_ledger.operate.operations import Operations
from offset_ledger.rules.authority import same_location

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints" / "spark-4.2.0"


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A copy of a real Spark 4.2 checkpoint (batches 0-3 committed) under tmp_path/jobs/orders."""
    dest = tmp_path / "jobs" / "orders"
    shutil.copytree(FIXTURES / "kafka-one", dest)
    return dest


@pytest.fixture
def dsn(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


def _rows(dsn: str, table):  # type: ignore[no-untyped-def]
    engine = make_engine(dsn)
    try:
        with engine.connect() as conn:
            return list(conn.execute(select(table)))
    finally:
        engine.dispose()


def test_dry_run_writes_nothing_and_execute_writes_one_adopted_generation(checkpoint: Path, dsn: str) -> None:
    dry = import_checkpoint(str(checkpoint) + "/", pipeline="orders", dsn=dsn)
    assert not dry.executed and dry.committed_batch_id == 3
    (topic, parts), = dry.positions.items()
    assert parts == {0: 20, 1: 20}
    engine = make_engine(dsn)
    assert current_revision(engine) is None  # not even the schema was created
    engine.dispose()

    done = import_checkpoint(str(checkpoint), pipeline="orders", app_version="1", dsn=dsn, execute=True)
    assert done.executed and done.generation == 1
    (gen,) = _rows(dsn, checkpoint_generations)
    assert gen.location == str(checkpoint) and gen.checkpoint_root == str(checkpoint.parent)
    assert gen.query_id == "3f479258-505f-43c2-aa86-afd339fd488d" and gen.reason == "adopted"
    assert gen.resolved_offsets == {topic: {"0": 20, "1": 20}} and gen.app_version == "1"
    # Spark reports the checkpoint as a file: URI; the recorder's matching accepts it.
    assert same_location(f"file:{checkpoint}", gen.location)
    assert sorted((r.topic, r.partition, r.next_offset, r.generation_id) for r in _rows(dsn, positions)) == [
        (topic, 0, 20, gen.id), (topic, 1, 20, gen.id)]
    (finding,) = _rows(dsn, findings)
    assert finding.kind == "checkpoint_adopted" and str(checkpoint) in finding.message
    assert "batch 3" in finding.message and finding.generation_id == gen.id


def test_the_verb_takes_the_operations_context(checkpoint: Path, dsn: str) -> None:
    """The one verb shape: a plan read from the checkpoint alone, then ``adopt_checkpoint(ops, plan)``."""
    plan = plan_adoption(str(checkpoint), pipeline="orders", consumer_group="etl", source="all")
    assert (plan.pipeline, plan.consumer_group, plan.checkpoint_root) == ("orders", "etl", str(checkpoint.parent))
    ops = Operations(make_engine(dsn))  # no Kafka: the topics' ids are not recorded, nothing asks a cluster
    try:
        assert adopt_checkpoint(ops, plan) == plan.dry_run()  # a ledger never set up: the plan's answer
        assert current_revision(ops.engine) is None
        done = adopt_checkpoint(ops, plan, app_version="7", execute=True)
        assert done.executed and done.generation == 1 and done.consumer_group == "etl"
        with pytest.raises(AdoptionRefused):
            adopt_checkpoint(ops, plan)
    finally:
        ops.close()
    (gen,) = _rows(dsn, checkpoint_generations)
    assert (gen.consumer_group, gen.app_version, gen.topic_ids) == ("etl", "7", None)


def test_a_group_with_positions_is_refused_unless_forced(checkpoint: Path, dsn: str) -> None:
    import_checkpoint(str(checkpoint), pipeline="orders", dsn=dsn, execute=True)
    (checkpoint / "commits" / "3").unlink()  # the job moved on... or not: batch 3 is now only planned
    with pytest.raises(AdoptionRefused, match="--force"):
        import_checkpoint(str(checkpoint), pipeline="orders", dsn=dsn, execute=True)
    with pytest.raises(AdoptionRefused):  # a dry run says so too
        import_checkpoint(str(checkpoint), pipeline="orders", dsn=dsn)
    assert len(_rows(dsn, checkpoint_generations)) == 1
    forced = import_checkpoint(str(checkpoint), pipeline="orders", dsn=dsn, execute=True, force=True)
    assert forced.generation == 2 and forced.committed_batch_id == 2 and forced.planned_batch_ids == (3,)
    assert {r.next_offset for r in _rows(dsn, positions)} == {15}
    # Another consumer group of the same pipeline is a separate set of positions.
    other = import_checkpoint(str(checkpoint), pipeline="orders", consumer_group="etl", dsn=dsn, execute=True)
    assert other.generation == 1


def test_bad_checkpoints_write_nothing(tmp_path: Path, checkpoint: Path, dsn: str) -> None:
    with pytest.raises(CheckpointFormatError, match="no such directory"):
        import_checkpoint(str(tmp_path / "nope"), pipeline="orders", dsn=dsn, execute=True)
    (checkpoint / "offsets" / "3").write_text("v99\n{}\n{}")
    with pytest.raises(CheckpointFormatError) as err:
        import_checkpoint(str(checkpoint), pipeline="orders", dsn=dsn, execute=True)
    assert err.value.path == f"{checkpoint}/offsets/3"
    assert not Path(dsn.removeprefix("sqlite:///")).exists()
    with pytest.raises(InvalidInput, match="source"):
        import_checkpoint(str(checkpoint), pipeline="orders", dsn=dsn, source="x")


def test_remote_paths_go_through_fsspec(checkpoint: Path) -> None:
    import fsspec  # a test dependency (pyproject's test extra): never skipped
    mem = fsspec.filesystem("memory")
    for path in checkpoint.rglob("*"):
        if path.is_file():
            mem.pipe(f"/ckpt/orders/{path.relative_to(checkpoint)}", path.read_bytes())
    state, chosen = plan_import("memory://ckpt/orders", None)
    assert state.committed_batch_id == 3 and list(chosen.positions.values()) == [{0: 20, 1: 20}]
    with pytest.raises(ConfigError, match="s3fs"):
        plan_import("s3a://bucket/ckpt/orders")


@pytest.mark.parametrize(("location", "parent"), [
    ("/data/jobs/orders", "/data/jobs"), ("s3a://bucket/jobs/orders", "s3a://bucket/jobs"),
    ("s3a://bucket/orders", "s3a://bucket"), ("relative", "."), ("/orders", "/"),
])
def test_parent_location(location: str, parent: str) -> None:
    assert parent_location(location) == parent


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "offset-ledger"
    return subprocess.run([str(exe), *args], capture_output=True, text=True)


def test_cli_import_checkpoint_dry_run_execute_and_errors(checkpoint: Path, dsn: str) -> None:
    dry = _cli("import-checkpoint", "orders", str(checkpoint), "--dsn", dsn)
    assert dry.returncode == 0, dry.stderr
    assert "last committed batch 3" in dry.stdout and "dry run" in dry.stderr
    done = _cli("import-checkpoint", "orders", str(checkpoint), "--dsn", dsn, "--execute",
                "--format", "json")
    assert done.returncode == 0, done.stderr
    assert '"generation": 1' in done.stdout and "generation 1" in done.stderr
    again = _cli("import-checkpoint", "orders", str(checkpoint), "--dsn", dsn, "--execute")
    assert again.returncode == 3 and again.stderr.count("\n") == 1 and "--force" in again.stderr  # refused
    (checkpoint / "metadata").write_text("{corrupt")
    bad = _cli("import-checkpoint", "p2", str(checkpoint), "--dsn", dsn, "--execute")
    assert bad.returncode == 2 and f"{checkpoint}/metadata" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("args, fragment", [
    (["import-checkpoint", "/nowhere"], "missing argument CHECKPOINT"),
    (["import-checkpoint", "p", "/nowhere"], "no such directory"),
    (["import-checkpoint", "p", "/nowhere", "--format", "xml"], "--format"),
    (["replay", "orders"], "--batch N"),
    (["replay", "orders", "--batch", "1", "--from", "2024-01-01"], "not both"),
    (["replay", "orders", "--from", "yesterday"], "invalid timestamp"),
    (["replay", "orders", "--batch", "1"], "unknown pipeline"),
])
def test_cli_errors_are_one_line_and_exit_2(args: list[str], fragment: str, dsn: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from offset_ledger.cli.main import main
    from offset_ledger.ledger.engine import ensure_schema

    engine = make_engine(dsn)
    ensure_schema(engine)
    engine.dispose()
    with pytest.raises(SystemExit) as info:
        main([*args, "--dsn", dsn] if args[0] == "replay" or len(args) > 2 else args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err and "Traceback" not in err


def test_a_relative_checkpoint_path_is_recorded_absolute(checkpoint: Path, dsn: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(checkpoint.parent)
    result = import_checkpoint("orders", pipeline="orders", dsn=dsn, execute=True)
    assert result.checkpoint_location == str(checkpoint)
    assert same_location(f"file:{checkpoint}", _rows(dsn, checkpoint_generations)[0].location)
