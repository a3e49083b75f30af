"""Stored restart policies: decided once, applied by every restart, overridden only loudly."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from offset_ledger.errors import InvalidRestartOptions
from offset_ledger.ledger.policy_store import current_policies, policy_history, set_policies
from offset_ledger.operate.operations import Operations
from offset_ledger.operate.restart import restart
from offset_ledger.rules.restart_request import RestartRequest
from offset_ledger.rules.restart_options import PipelineRef, RestartOptions
from offset_ledger.rules.policies import Policies, check_policies, merged
from offset_ledger.rules.stateful import WindowSpec
from tests.unit.operate.test_ground_truth_property import TOPIC, World, _first_run, world  # noqa: F401 - fixture

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _set(world: World, **changes: object) -> None:
    engine, _, _ = world
    with engine.begin() as conn:
        set_policies(conn, "orders", changes, actor="alice", reason="decided once")


def _restart(world: World, tmp_path: Path, version: str, new_checkpoint: bool = False,
             **given: object):  # type: ignore[no-untyped-def]
    engine, cluster, _ = world
    return restart(Operations(engine, kafka=cluster), RestartRequest(PipelineRef("orders"), RestartOptions(
        topics=(TOPIC,), checkpoint_root=str(tmp_path / "ck"), app_version=version, new_checkpoint=new_checkpoint),
        Policies(**given)))  # type: ignore[arg-type]


def test_policies_are_checked_and_merged() -> None:
    assert check_policies({"on_data_loss": "earliest", "window": "10m", "commit_to_kafka": True}) == {
        "on_data_loss": "earliest", "window": "10m", "commit_to_kafka": True}
    for bad in ({"on_data_loss": "sometimes"}, {"window": "ten"}, {"commit_to_kafka": "yes"}, {"colour": "red"},
                {"first_run": "yesterday"}):
        with pytest.raises(InvalidRestartOptions):
            check_policies(bad)
    with pytest.raises(InvalidRestartOptions, match="slide policy needs a window"):
        merged({}, {"slide": "5m"})
    assert merged({"window": "10m", "on_data_loss": "earliest"}, {"window": None}) == {"on_data_loss": "earliest"}
    use, overrides = Policies(on_data_loss="fail").over(Policies.stored({"on_data_loss": "earliest"}))
    assert use.on_data_loss == "fail" and [f.kind for f in overrides] == ["policy_override"]
    assert Policies().over(Policies.stored({"window": "10m", "slide": "5m"}))[0].window_spec() == WindowSpec(
        600_000, 300_000)  # the stored window, as one value
    with pytest.raises(InvalidRestartOptions, match="need window"):
        Policies(watermark_delay="1m").over(Policies())


def test_a_restart_with_stored_policies_and_no_arguments_is_the_explicit_call(tmp_path: Path, world: World) -> None:
    """Retention took records the pipeline never read: the stored on_data_loss decides, as the argument would."""
    engine, cluster, recorder = world
    _first_run(world, tmp_path, {0: 10, 1: 10})
    from offset_ledger.rules.model import TopicPartition, Watermarks

    real_snapshot = cluster.snapshot

    def trimmed(topics):  # type: ignore[no-untyped-def]
        seen = real_snapshot(topics)
        marks = dict(seen.watermarks)
        marks[TopicPartition(TOPIC, 0)] = Watermarks(15, 20)
        return seen._replace(watermarks=marks)

    cluster.snapshot = trimmed  # type: ignore[method-assign]
    cluster.log_end = {0: 20, 1: 20}
    explicit = _restart(world, tmp_path / "a", "2", on_data_loss="earliest", new_checkpoint=True)
    # The same decision stored once, then a restart that names nothing.
    _set(world, on_data_loss="earliest")
    stored = _restart(world, tmp_path / "b", "3", new_checkpoint=True)
    assert stored.starting_offsets == explicit.starting_offsets == {TOPIC: {"0": 15, "1": 10}}
    assert stored.policies["on_data_loss"] == "earliest"
    assert not [f for f in stored.findings if f.kind == "policy_override"]
    # An argument that contradicts the stored policy wins for this call, and says so.
    called = _restart(world, tmp_path / "c", "4", on_data_loss="fail", new_checkpoint=True)
    assert called.policies["on_data_loss"] == "fail"
    assert [f.details["policy"] for f in called.findings if f.kind == "policy_override"] == ["on_data_loss"]


def test_an_override_is_a_finding_in_the_plan(tmp_path: Path, world: World) -> None:
    _set(world, first_run="latest")
    engine, cluster, _ = world
    cluster.log_end = {0: 7, 1: 9}
    plan = _restart(world, tmp_path, "1", first_run="earliest")
    assert plan.starting_offsets == {TOPIC: {"0": -2, "1": -2}}
    [override] = [f for f in plan.findings if f.kind == "policy_override"]
    assert override.details == {"policy": "first_run", "given": "earliest", "stored": "latest"}
    with engine.connect() as conn:
        assert [c.actor for c in policy_history(conn, "orders")] == ["alice"]
        assert current_policies(conn, "orders") == {"first_run": "latest"}


def test_a_stored_window_rewinds_on_an_upgrade_only(tmp_path: Path, world: World) -> None:
    engine, cluster, recorder = world
    plan, job = _first_run(world, tmp_path, {0: 4, 1: 4})
    # A windowed job: each batch reports its watermark and event times (as the listener records them).
    for i, end in enumerate((8, 12, 16), start=1):
        cluster.log_end = {0: end, 1: end}
        rec = job.batch(cluster.log_end)
        recorder.record([replace(rec, batch=replace(
            rec.batch, watermark=T0 + timedelta(seconds=10 * (i - 1)), event_time_min=T0 + timedelta(seconds=10 * i),
            event_time_max=T0 + timedelta(seconds=10 * i + 9)))])
    _set(world, window="10 seconds", watermark_delay="10 seconds")
    same = _restart(world, tmp_path, "1")
    assert not same.fresh_checkpoint and same.event_time_floor is None  # nothing to upgrade: no rewind
    reads: list[tuple[str, ...]] = []
    real_snapshot = cluster.snapshot

    def snapshot(topics):  # type: ignore[no-untyped-def]
        reads.append(tuple(topics))
        return real_snapshot(topics)

    cluster.snapshot = snapshot  # type: ignore[method-assign]
    upgraded = _restart(world, tmp_path, "2")
    assert upgraded.fresh_checkpoint and upgraded.event_time_floor is not None
    # Issue 51: the stored window composes the plan again from the same reads; the cluster is read once.
    assert reads == [(TOPIC,)]
    cluster.snapshot = real_snapshot  # type: ignore[method-assign]
    assert [f.kind for f in upgraded.findings if f.kind == "state_rewind"] == ["state_rewind"]
    again = _restart(world, tmp_path, "2")
    assert not again.fresh_checkpoint and again.event_time_floor == upgraded.event_time_floor


def test_slide_without_any_window_is_refused(tmp_path: Path, world: World) -> None:
    with pytest.raises(InvalidRestartOptions, match="need window"):
        _restart(world, tmp_path, "1", slide="5 seconds")


def test_the_policy_commands_set_show_and_audit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from offset_ledger.cli.main import main

    dsn = f"sqlite:///{tmp_path / 'ledger.db'}"

    def run(*argv: str) -> int:
        try:
            main([*argv, "--dsn", dsn])
        except SystemExit as exc:
            return int(exc.code or 0)
        return 0

    # A read of a ledger that does not exist writes nothing and says so.
    assert run("policy", "show", "orders") == 2 and not (tmp_path / "ledger.db").exists()
    assert run("policy", "set", "orders", "--on-data-loss", "earliest") == 2  # no reason
    assert run("policy", "set", "orders", "--on-data-loss", "sometimes", "--reason", "r") == 2
    assert run("policy", "set", "orders", "--slide", "5m", "--reason", "r") == 2
    assert not (tmp_path / "ledger.db").exists()  # bad input wrote nothing
    # A pipeline the ledger does not know is a typo until said otherwise.
    assert run("policy", "set", "orders", "--on-data-loss", "earliest", "--reason", "v2") == 2
    assert not (tmp_path / "ledger.db").exists()
    assert run("policy", "set", "orders", "--on-data-loss", "earliest", "--window", "10m", "--reason", "v2",
               "--actor", "alice", "--new-pipeline") == 0
    assert run("policy", "set", "orders", "--unset", "window", "--reason", "v3", "--actor", "bob") == 0
    capsys.readouterr()
    assert run("policy", "show", "orders", "-f", "json") == 0
    shown = json.loads(capsys.readouterr().out)  # the API's GET answer: camelCase, effective and sources
    assert shown["pipeline"] == "orders" and shown["policies"] == {"onDataLoss": "earliest"}
    assert shown["effective"]["onDataLoss"] == "earliest" and shown["sources"]["window"] == "default"
    assert run("policy", "history", "orders", "-f", "json") == 0
    history = json.loads(capsys.readouterr().out)  # the API's GET .../policies/history answer: newest first
    assert history["pipeline"] == "orders"
    assert [(h["actor"], h["reason"], h["policies"]) for h in history["changes"]] == [
        ("bob", "v3", {"onDataLoss": "earliest"}), ("alice", "v2", {"onDataLoss": "earliest", "window": "10m"})]
