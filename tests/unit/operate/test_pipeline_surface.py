"""``offset_ledger.Pipeline``: the pure parts (arguments, reader options, delegation to start_from_ledger).

The real-stack behaviour (records neither lost nor read twice across restarts) is in
tests/integration/test_pipeline_surface.py.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, NamedTuple

import pytest

from offset_ledger import Pipeline
from offset_ledger.errors import InvalidInput
from offset_ledger.addresses import KafkaAddress, LedgerAddress
from offset_ledger.ledger.sink_store import SinkSpec
from offset_ledger.operate.pipeline import PipelineStart
from offset_ledger.operate.restart import start_from_ledger as real_start_from_ledger  # before any fake
from offset_ledger.rules.plan import RestartPlan
from offset_ledger.rules.policies import Policies
from offset_ledger.rules.restart_options import PipelineRef, RestartOptions
from offset_ledger.rules.restart_request import RestartRequest


class FakeReader:
    """Records what is set on it, like a DataStreamReader (every setter returns the reader)."""

    def __init__(self) -> None:
        self.fmt: str | None = None
        self.options: dict[str, str] = {"maxOffsetsPerTrigger": "100"}

    def format(self, fmt: str) -> FakeReader:
        self.fmt = fmt
        return self

    def option(self, key: str, value: str) -> FakeReader:
        self.options[key] = value
        return self

    def load(self) -> Any:
        return FakeFrame()


class FakeSession:
    def __init__(self) -> None:
        self.readStream = FakeReader()


class FakeFrame:
    def __init__(self) -> None:
        self.writeStream = FakeReader()


PLAN = RestartPlan(pipeline="orders", starting_offsets={"orders": {"0": 12, "1": -2}},
                   checkpoint_location="/ck/orders/gen-2-abc", fresh_checkpoint=True, generation=2)


class FakeSink:
    """Enough of a ``Sink`` for the protocol check; nothing here writes."""

    def __init__(self, name: str = "orders:out") -> None:
        self.spec = SinkSpec(name, "orders", "orders", "postgres", "out")

    def bind(self, checkpoint_location: str) -> FakeSink:
        return self

    def write(self, df: Any, batch_id: int) -> Any:
        return None

    def __call__(self, df: Any, batch_id: int) -> None:
        return None

    def reconcile(self, ledger: Any) -> tuple[Any, ...]:
        return ()


class Call(NamedTuple):
    ledger: LedgerAddress
    kafka: KafkaAddress
    request: RestartRequest
    sinks: tuple[Any, ...]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """What reached the restart (``operate.restart.restart_at``) from a Pipeline or from start_from_ledger."""
    seen: list[Call] = []

    def fake_restart_at(ledger: LedgerAddress, kafka: KafkaAddress, request: RestartRequest,
                        sinks: tuple[Any, ...] = ()) -> RestartPlan:
        seen.append(Call(ledger, kafka, request, tuple(sinks)))
        return PLAN

    monkeypatch.setattr("offset_ledger.operate.restart.restart_at", fake_restart_at)
    return seen


def test_plan_is_the_restart_request_with_the_pipeline_arguments(calls) -> None:  # type: ignore[no-untyped-def]
    p = Pipeline("orders", topics=["orders", "refunds"], dsn="sqlite:///x.db", bootstrap_servers="b:9092",
                 kafka_options={"kafka.security.protocol": "SSL"}, consumer_group="etl", app_version="2.0")
    assert p.plan(checkpoint_root="/ck/orders", on_data_loss="earliest", new_checkpoint=True) is PLAN
    (ledger, kafka, request, sinks), = calls
    assert request == RestartRequest(
        PipelineRef("orders", "etl"),
        RestartOptions(topics=("orders", "refunds"), checkpoint_root="/ck/orders", app_version="2.0",
                       new_checkpoint=True),
        Policies(on_data_loss="earliest"))
    assert ledger == LedgerAddress("sqlite:///x.db") and sinks == ()
    assert kafka.bootstrap_servers == "b:9092" and dict(kafka.options) == {"kafka.security.protocol": "SSL"}


def test_a_call_passes_only_the_overrides_it_was_given_so_stored_policies_apply(calls) -> None:  # type: ignore[no-untyped-def]
    Pipeline("orders", topic_pattern="orders-.*").plan(checkpoint_root="/ck")
    (_, _, request, _), = calls
    assert request.options.topic_pattern == "orders-.*" and request.options.topics is None
    # None of first_run, on_data_loss, window...: stored ones apply
    assert request.given == Policies() and request.sinks is None and not request.options.new_checkpoint


def test_start_sets_the_subscription_the_kafka_settings_and_starting_offsets(calls) -> None:  # type: ignore[no-untyped-def]
    p = Pipeline("orders", topics=["orders"], bootstrap_servers="b:9092",
                 kafka_options={"security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "PLAIN"})
    reader = FakeReader()
    started = p.start(reader, checkpoint_root="/ck/orders", first_run="latest")
    assert isinstance(started, PipelineStart) and started.plan is PLAN and started.reader is reader
    assert reader.fmt == "kafka"
    assert reader.options == {
        "maxOffsetsPerTrigger": "100",  # the caller's own options stay
        "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "PLAIN",
        "kafka.bootstrap.servers": "b:9092", "subscribe": "orders",
        "startingOffsets": PLAN.starting_offsets_json,
    }
    assert started.checkpoint_location == "/ck/orders/gen-2-abc"
    assert started.starting_offsets_json == PLAN.starting_offsets_json
    assert calls[0].request.given.first_run == "latest"
    assert calls[0].kafka.bootstrap_servers == "b:9092"  # the one address the restart and the reader share


def test_start_takes_a_session_and_write_stream_carries_the_checkpoint(calls) -> None:  # type: ignore[no-untyped-def]
    session = FakeSession()
    started = Pipeline("orders", topic_pattern="o.*", bootstrap_servers="b:9092").start(session, checkpoint_root="/ck")
    assert started.reader is session.readStream and started.reader.options["subscribePattern"] == "o.*"
    assert "subscribe" not in started.reader.options
    writer = started.write_stream(started.load())
    assert writer.options["checkpointLocation"] == "/ck/orders/gen-2-abc"


def test_bootstrap_servers_come_from_the_options_or_the_environment(calls, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    in_options = Pipeline("orders", topics=["orders"], kafka_options={"kafka.bootstrap.servers": "opt:9092"})
    assert in_options.reader_options(PLAN)["kafka.bootstrap.servers"] == "opt:9092"
    monkeypatch.setenv("OFFSET_LEDGER_BOOTSTRAP_SERVERS", "env:9092")
    from offset_ledger.config import settings

    if hasattr(settings, "cache_clear"):
        settings.cache_clear()
    try:
        assert Pipeline("orders", topics=["orders"]).reader_options(PLAN)["kafka.bootstrap.servers"] == "env:9092"
    finally:
        if hasattr(settings, "cache_clear"):
            settings.cache_clear()


def test_bad_arguments_are_refused_before_anything_runs(calls) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="exactly one"):
        Pipeline("orders")
    with pytest.raises(ValueError, match="exactly one"):
        Pipeline("orders", topics=["a"], topic_pattern="a.*")
    with pytest.raises(ValueError, match="non-empty"):
        Pipeline("orders", topics=[])
    with pytest.raises(InvalidInput):
        Pipeline("", topics=["a"])
    assert Pipeline("orders", topics="orders").topics == ("orders",)  # one name, not six letters
    p = Pipeline("orders", topics=["orders"])
    with pytest.raises(TypeError, match="on_dataloss"):
        p.plan(checkpoint_root="/ck", on_dataloss="earliest")
    with pytest.raises(TypeError, match="app_version"):
        p.start(FakeReader(), checkpoint_root="/ck", app_version="3")
    with pytest.raises(TypeError, match="SparkSession or a DataStreamReader"):
        p.start(object(), checkpoint_root="/ck")
    assert calls == []


#: A valid value of each per-call argument (the values check them when the request is built).
VALUES: dict[str, Any] = {
    "checkpoint_root": "/ck", "first_run": "latest", "on_data_loss": "earliest", "window": "10 minutes",
    "watermark_delay": "1 minute", "event_time_is_kafka_timestamp": True, "commit_to_kafka": True,
    "new_checkpoint": True, "allow_first_run": True, "adopt_checkpoint": "/old/ck", "sinks": [FakeSink()]}


def _given(name: str) -> dict[str, Any]:
    extra = {"window": "10 minutes"} if name in ("slide", "watermark_delay") else {}
    return {"checkpoint_root": "/ck", **extra, name: VALUES.get(name, "5 minutes")}


def test_a_pipeline_and_start_from_ledger_make_the_same_request_for_every_argument(calls) -> None:  # type: ignore[no-untyped-def]
    """Read from the signature: each ``start_from_ledger`` argument the pipeline does not hold is taken by
    ``plan`` and ``start`` and reaches the restart exactly as ``start_from_ledger`` sends it (issue 36:
    ``plan(..., sinks=[sink])`` once raised TypeError); the pipeline's own are refused per call."""
    import inspect

    from offset_ledger.operate.pipeline import HELD

    arguments = [n for n in inspect.signature(real_start_from_ledger).parameters if n not in ("pipeline", "topics")]
    per_call = [n for n in arguments if n not in HELD]
    assert "sinks" in per_call and "checkpoint_root" in per_call
    p = Pipeline("orders", topics=["orders"], bootstrap_servers="b:9092")
    for name in per_call:
        calls.clear()
        p.plan(**_given(name))
        p.start(FakeReader(), **_given(name))
        real_start_from_ledger("orders", ["orders"], bootstrap_servers="b:9092", **_given(name))
        planned, started, direct = calls
        assert planned.request == started.request == direct.request, name
        assert planned.sinks == direct.sinks and planned.ledger == direct.ledger, name
        assert planned.request != RestartRequest(PipelineRef("orders"), RestartOptions(topics=("orders",),
                                                 checkpoint_root="/ck")) or name == "checkpoint_root", name
    for name in set(arguments) & HELD:  # the pipeline's own: refused per call, they would contradict it
        with pytest.raises(TypeError, match="belong"):
            p.plan(checkpoint_root="/ck", **{name: "x"})


def test_listener_is_the_offset_ledger_listener_for_the_pipeline(tmp_path) -> None:  # type: ignore[no-untyped-def]
    if importlib.util.find_spec("pyspark") is None:  # the listener needs PySpark; CI installs it
        message = "pyspark is not installed: pip install '.[spark]'"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    from offset_ledger import OffsetLedgerListener

    p = Pipeline("orders", topics=["orders"], dsn=f"sqlite:///{tmp_path / 'ledger.db'}", consumer_group="etl",
                 app_version="2.0")
    listener = p.listener(spool_dir=tmp_path / "spool", queue_size=100)
    try:
        assert isinstance(listener, OffsetLedgerListener)
        assert (listener.dsn, listener.pipeline, listener.consumer_group, listener.app_version) == (
            p.dsn, "orders", "etl", "2.0")
    finally:
        listener.close(timeout=5)
    with pytest.raises(TypeError, match="belong"):
        p.listener(pipeline="other")


def test_only_name_and_topics_are_positional() -> None:
    assert Pipeline("orders", ["orders"]).topics == ("orders",)
    with pytest.raises(TypeError):
        Pipeline("orders", ["orders"], "orders-.*")  # type: ignore[misc]
