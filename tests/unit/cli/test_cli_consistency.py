"""Issue 22's CLI consistency leftovers: ``import-checkpoint PIPELINE CHECKPOINT`` (positional, with
the old ``--pipeline`` as a deprecated alias), ``serve --timeout``, and the findings count on
``GET /api/v1/pipelines`` (the CLI ``pipelines`` FINDINGS column)."""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert

from offset_ledger.cli.main import main
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.tables import findings
from tests.ops_seed import seed_pipeline

CHECKPOINT = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints" / "spark-4.2.0" / "kafka-one"


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("OFFSET_LEDGER_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def checkpoint(tmp_path: Path) -> str:
    dest = tmp_path / "jobs" / "orders"
    shutil.copytree(CHECKPOINT, dest)
    return str(dest)


@pytest.fixture
def dsn(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


# -- import-checkpoint PIPELINE CHECKPOINT --------------------------------------------------------


def test_import_checkpoint_takes_the_pipeline_positionally(checkpoint: str, dsn: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(["import-checkpoint", "orders", checkpoint, "--dsn", dsn, "-f", "json"], capsys)
    assert code == 0, err
    assert json.loads(out)["pipeline"] == "orders" and "deprecated" not in err


def test_the_old_pipeline_option_still_works_with_a_one_line_note(checkpoint: str, dsn: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(["import-checkpoint", checkpoint, "--pipeline", "orders", "--dsn", dsn, "-f", "json"],
                         capsys)
    assert code == 0, err
    assert json.loads(out)["pipeline"] == "orders"
    notes = [line for line in err.splitlines() if "deprecated" in line]
    assert len(notes) == 1 and "import-checkpoint PIPELINE CHECKPOINT" in notes[0]
    # Both spellings naming the same pipeline: accepted, still with the note.
    code, out, err = cli(["import-checkpoint", "orders", checkpoint, "--pipeline", "orders", "--dsn", dsn,
                          "-f", "json"], capsys)
    assert code == 0 and json.loads(out)["pipeline"] == "orders" and "deprecated" in err


@pytest.mark.parametrize("argv, fragment", [
    (["import-checkpoint", "orders", "CKPT", "--pipeline", "other"], "given twice, differently"),
    (["import-checkpoint", "CKPT"], "missing argument CHECKPOINT"),
    (["import-checkpoint"], "missing argument PIPELINE and CHECKPOINT"),
    (["import-checkpoint", "--pipeline", "orders"], "missing argument CHECKPOINT"),
])
def test_import_checkpoint_usage_errors_exit_2(argv: list[str], fragment: str, checkpoint: str, dsn: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    argv = [checkpoint if a == "CKPT" else a for a in argv]
    code, out, err = cli([*argv, "--dsn", dsn], capsys)
    assert code == 2 and out == ""
    errors = [line for line in err.splitlines() if line.startswith("offset-ledger: error: ")]
    assert len(errors) == 1 and fragment in errors[0], err
    assert not Path(dsn.removeprefix("sqlite:///")).exists()  # nothing was written


def test_import_checkpoint_help_names_pipeline_then_checkpoint(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(["import-checkpoint", "--help"], capsys)
    assert code == 0
    usage = " ".join(out.split())
    assert usage.index("PIPELINE") < usage.index("CHECKPOINT")
    assert "--pipeline " not in out and "--timeout" in out  # the alias is hidden


# -- serve --timeout ----------------------------------------------------------------------------


def test_serve_passes_timeout_to_the_kafka_clients(monkeypatch: pytest.MonkeyPatch, dsn: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import uvicorn

    import offset_ledger.api as api

    seen: dict[str, Any] = {}

    def fake_create_app(*args: Any, **kwargs: Any) -> str:
        seen.update(kwargs)
        return "app"

    monkeypatch.setattr(api, "create_app", fake_create_app)
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.setdefault("ran", (app, kw)))
    code, _, err = cli(["serve", "--dsn", dsn], capsys)  # serve never creates a ledger
    assert code == 2 and "no ledger database" in err and not seen
    assert cli(["db", "upgrade", "--dsn", dsn], capsys)[0] == 0
    code, _, err = cli(["serve", "--dsn", dsn, "--bootstrap-server", "k:9092", "--timeout", "2500"], capsys)
    assert code == 0, err
    assert seen["kafka_timeout_ms"] == 2500 and seen["bootstrap_servers"] == "k:9092"
    seen.clear()
    code, _, err = cli(["serve", "--dsn", dsn], capsys)
    assert code == 0 and seen["kafka_timeout_ms"] == 10_000  # the other commands' default
    code, _, err = cli(["serve", "--dsn", dsn, "--timeout", "0"], capsys)
    assert code == 2 and "--timeout" in err


# -- GET /api/v1/pipelines: findings ----------------------------------------------------------


def test_pipelines_resource_counts_findings_like_the_cli(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    from fastapi.testclient import TestClient

    from offset_ledger.api import create_app
    from offset_ledger.operate.operations import Operations

    engine = make_engine(dsn)
    upgrade(engine)
    seed_pipeline(engine, "etl", {"orders": {0: 12, 1: 17}})
    seed_pipeline(engine, "quiet", {"orders": {0: 3}})
    now = datetime.now(timezone.utc)
    with engine.begin() as conn:
        conn.execute(insert(findings), [
            {"pipeline": "etl", "consumer_group": "etl", "kind": kind, "topic": "orders", "partition": 0,
             "message": f"finding {i}", "created_at": now} for i, kind in enumerate(["gap", "data_loss"])])
    client = TestClient(create_app(operations=Operations(engine), api_token=""), base_url="http://localhost")
    r = client.get("/api/v1/pipelines", params={"lag": "false"})
    assert r.status_code == 200
    listed = {p["pipeline"]: p["findings"] for p in r.json()["pipelines"]}
    assert listed == {"etl": 2, "quiet": 0}
    code, out, _ = cli(["pipelines", "--dsn", dsn, "--no-lag", "-f", "json"], capsys)
    assert code == 0 and {p["pipeline"]: p["findings"] for p in json.loads(out)} == listed
    # The legacy endpoint keeps its shape, nothing added.
    legacy = client.get("/v1/getCurrentOffsets/", params={"pipelineName": "etl"}).json()
    assert legacy == {"orders": {"0": 12, "1": 17}}  # {topic: {partition: offset}}
    engine.dispose()


# -- watch PIPELINE CHECKPOINT (the same shape as import-checkpoint) -------------------------------


def test_watch_takes_the_pipeline_positionally_and_the_old_option_with_a_note(
        checkpoint: str, dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(["watch", "orders", checkpoint, "--once", "--dsn", dsn], capsys)
    assert code == 0, err
    assert "orders: recorded batch(es)" in out and "deprecated" not in err
    code, out, err = cli(["watch", checkpoint, "--pipeline", "orders", "--once", "--dsn", dsn], capsys)
    assert code == 0, err
    notes = [line for line in err.splitlines() if "deprecated" in line]
    assert len(notes) == 1 and "watch PIPELINE CHECKPOINT" in notes[0]


@pytest.mark.parametrize(("argv", "fragment"), [
    (["watch", "orders", "CKPT", "--pipeline", "other", "--once"], "given twice, differently"),
    (["watch", "CKPT", "--once"], "missing argument CHECKPOINT (watch PIPELINE CHECKPOINT)"),
    (["watch", "--once"], "missing argument PIPELINE and CHECKPOINT"),
])
def test_watch_usage_errors_exit_2(argv: list[str], fragment: str, dsn: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli([*argv, "--dsn", dsn], capsys)
    assert code == 2 and fragment in err and err.count("error:") == 1, err
    assert not Path(dsn.removeprefix("sqlite:///")).exists()  # nothing written, not even a ledger file
