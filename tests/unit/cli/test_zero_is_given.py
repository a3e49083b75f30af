"""Offset 0 is an offset, and an empty string is not "not given" (issue 50, item 5).

Every option whose value may be 0 (or "") is checked here: given, it must be used (or refused by
name), never mistaken for an option that was left out. ``reset --to-offset 0`` and ``--shift-by 0``
are what kafka-consumer-groups accepts; the real-Kafka comparison with KCG is in
tests/integration/test_kcg_reset.py. The ledger is SQLite; Kafka is the API tests' in-memory
stand-in where a plan needs watermarks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from offset_ledger.cli.reset import build_request
from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.reset_operations import reset
from offset_ledger.rules.model import TopicPartition
from tests.ops_seed import seed_pipeline
from tests.unit.api.test_api_validation import StandInKafka
from tests.unit.cli.cli_run import run_cli

MODES = ("--to-earliest", "--to-latest", "--to-current", "--to-offset", "--to-offsets", "--from-file",
         "--to-datetime", "--by-duration", "--shift-by")


def _modes(**given: object) -> dict[str, object]:
    """The mode options as reset_cmd hands them over: flags False, values None, unless given."""
    flags = {"--to-earliest", "--to-latest", "--to-current"}
    out: dict[str, object] = {m: (False if m in flags else None) for m in MODES}
    out.update({"--" + k.replace("_", "-"): v for k, v in given.items()})
    return out


@pytest.fixture
def dsn(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = make_engine(url)
    upgrade(engine)
    seed_pipeline(engine, "orders-etl", {"orders": {0: 500, 1: 600, 2: 700}})
    engine.dispose()
    return url


@pytest.fixture
def ops(dsn: str) -> Iterator[Operations]:
    o = Operations(make_engine(dsn), kafka=StandInKafka())  # type: ignore[arg-type]
    yield o
    o.close()


def test_shift_by_zero_is_a_shift(ops: Operations) -> None:
    request = build_request(ops, "orders-etl", None, modes=_modes(shift_by=0), scope=None, out_of_range=None)
    assert request.mode == "shift" and request.shift_by == 0
    outcome = reset(ops, "orders-etl", request, actor="t", reason=None, dry_run=True)
    assert {p.tp.partition: p.target_next_offset for p in outcome.plan.partitions} == {0: 500, 1: 600, 2: 700}


def test_to_offset_zero_is_offset_zero(ops: Operations) -> None:
    """Offset 0 is below the stand-in's log start (10): the plan targets 0 and refuses it as out of range,
    exactly as --to-offset 5 would; never "choose exactly one of ...", as if nothing were given."""
    request = build_request(ops, "orders-etl", None, modes=_modes(to_offset=0), scope=None, out_of_range="clamp")
    assert request.mode == "offsets" and dict(request.offsets) == {TopicPartition("orders", p): 0 for p in range(3)}
    outcome = reset(ops, "orders-etl", request, actor="t", reason=None, dry_run=True)
    assert {p.tp.partition: p.target_next_offset for p in outcome.plan.partitions} == {0: 10, 1: 10, 2: 10}


@pytest.mark.parametrize("given", [{"to_offset": 0, "shift_by": 0}, {"to_offset": 0, "to_earliest": True},
                                   {"shift_by": 0, "to_datetime": "0"}])
def test_zero_counts_as_a_chosen_mode_when_two_are_given(ops: Operations, given: dict[str, object]) -> None:
    from offset_ledger.errors import InvalidInput

    with pytest.raises(InvalidInput) as info:
        build_request(ops, "orders-etl", None, modes=_modes(**given), scope=None, out_of_range=None)
    named = info.value.message.split("(got ")[1]
    assert all("--" + k.replace("_", "-") in named for k in given), info.value.message


@pytest.mark.parametrize("option", ["--since", "--until"])
def test_an_empty_time_is_refused_not_ignored(dsn: str, option: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _out, err = run_cli(capsys, "history", "orders-etl", option, "", "--dsn", dsn)
    assert code == 2 and err.startswith("offset-ledger: error: invalid timestamp ''"), err
    code, _out, err = run_cli(capsys, "findings", "orders-etl", "--since", "", "--dsn", dsn)
    assert code == 2 and "invalid timestamp ''" in err, err


def test_epoch_zero_is_a_time(dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "history", "orders-etl", "--until", "0", "-f", "json", "--dsn", dsn)
    assert code == 0 and '"batches": []' in out, err  # nothing before 1970: an empty page, not every batch


def test_the_api_reads_an_empty_time_as_given(dsn: str) -> None:
    from offset_ledger.api import create_app

    engine = make_engine(dsn)
    ops = Operations(engine, kafka=StandInKafka())  # type: ignore[arg-type]
    client = TestClient(create_app(operations=ops, api_token=""), raise_server_exceptions=False,
                        base_url="http://localhost")
    try:
        for param in ("since", "until"):
            r = client.get(f"/api/v1/pipelines/orders-etl/history?{param}=")
            assert r.status_code == 400 and "invalid timestamp ''" in r.json()["message"], r.text
        r = client.get("/api/v1/pipelines/orders-etl/history?until=0")
        assert r.status_code == 200 and r.json()["batches"] == []
        r = client.post("/api/v1/pipelines/orders-etl/resets", json={"mode": "shift", "shiftBy": 0})
        assert r.status_code == 200 and {p["targetNextOffset"] for p in r.json()["partitions"]} == {500, 600, 700}
        r = client.post("/api/v1/pipelines/orders-etl/resets", json={"mode": "offsets", "offsets": {"orders": {"0": 0}},
                                                                     "outOfRange": "clamp"})
        assert r.status_code == 200, r.text
    finally:
        engine.dispose()
