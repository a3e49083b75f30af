"""``offset_ledger.Pipeline``: the pure parts (arguments, reader options, delegation to start_from_ledger).

The real-stack behaviour (records neither lost nor read twice across restarts) is in
tests/integration/test_pipeline_surface.py.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest

from offset_ledger import Pipeline
from offset_ledger.errors import InvalidInput
from offset_ledger.operate.pipeline import PipelineStart, call_arguments, spark_kafka_options
from offset_ledger.operate.restart import start_from_ledger as real_start_from_ledger  # before any fake
from offset_ledger.rules.plan import RestartPlan


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


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def fake_start(*args: Any, **kwargs: Any) -> RestartPlan:
        seen.append((args, kwargs))
        return PLAN

    monkeypatch.setattr("offset_ledger.operate.restart.start_from_ledger", fake_start)
    return seen


def test_plan_is_start_from_ledger_with_the_pipeline_arguments(calls) -> None:  # type: ignore[no-untyped-def]
    p = Pipeline("orders", topics=["orders", "refunds"], dsn="sqlite:///x.db", bootstrap_servers="b:9092",
                 kafka_options={"kafka.security.protocol": "SSL"}, consumer_group="etl", app_version="2.0")
    assert p.plan(checkpoint_root="/ck/orders", on_data_loss="earliest", new_checkpoint=True) is PLAN
    (args, kwargs), = calls
    assert args == ("orders", ["orders", "refunds"])
    assert kwargs == {"topic_pattern": None, "bootstrap_servers": "b:9092", "checkpoint_root": "/ck/orders",
                      "app_version": "2.0", "dsn": "sqlite:///x.db", "consumer_group": "etl",
                      "kafka_options": {"kafka.security.protocol": "SSL"}, "on_data_loss": "earliest",
                      "new_checkpoint": True}


def test_a_call_passes_only_the_overrides_it_was_given_so_stored_policies_apply(calls) -> None:  # type: ignore[no-untyped-def]
    Pipeline("orders", topic_pattern="orders-.*").plan(checkpoint_root="/ck")
    (args, kwargs), = calls
    assert args == ("orders", None) and kwargs["topic_pattern"] == "orders-.*"
    # None of first_run, on_data_loss, window...: stored ones apply
    assert not set(kwargs) & (call_arguments() - {"checkpoint_root"})


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
    assert calls[0][1]["first_run"] == "latest"


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


def _a_value_for(name: str) -> object:
    """Something ``start_from_ledger`` would take for the argument (the fake records it as it is)."""
    return {"sinks": [object()], "checkpoint_root": "/ck"}.get(name, f"<{name}>")


def test_every_start_from_ledger_argument_is_held_by_the_pipeline_or_taken_by_plan_and_start(calls) -> None:  # type: ignore[no-untyped-def]
    """Read from the signature: a new ``start_from_ledger`` argument that ``Pipeline`` neither holds nor
    passes through fails here (issue 36: ``plan(..., sinks=[sink])`` once raised TypeError)."""
    import dataclasses
    import inspect

    arguments = [n for n in inspect.signature(real_start_from_ledger).parameters if n not in ("pipeline", "topics")]
    held = {f.name for f in dataclasses.fields(Pipeline) if f.init} | {"pipeline"}
    per_call = [n for n in arguments if n not in held]
    assert "sinks" in per_call and "checkpoint_root" in per_call
    p = Pipeline("orders", topics=["orders"])
    for name in per_call:
        calls.clear()
        p.plan(**{"checkpoint_root": "/ck", name: _a_value_for(name)})  # type: ignore[arg-type]
        assert calls[0][1][name] == _a_value_for(name) or name == "sinks", name
        calls.clear()
        p.start(FakeReader(), **{"checkpoint_root": "/ck", name: _a_value_for(name)})  # type: ignore[arg-type]
        assert name in calls[0][1], name
    for name in set(arguments) & held:  # the pipeline's own: refused per call, they would contradict it
        with pytest.raises(TypeError, match="belong"):
            p.plan(checkpoint_root="/ck", **{name: _a_value_for(name)})  # type: ignore[arg-type]


def test_the_pipeline_plans_with_its_sinks(calls) -> None:  # type: ignore[no-untyped-def]
    sink = object()
    Pipeline("orders", ["orders"]).plan(checkpoint_root="/ck", sinks=[sink])
    assert calls[0][1]["sinks"] == [sink]


def test_start_from_ledger_takes_exactly_the_values_fields() -> None:
    """The signature and the values (``PipelineRef``, ``RestartOptions``, ``Policies`` and the edge's
    ledger, cluster and sinks) name the same arguments: one cannot grow without the other."""
    import inspect

    from offset_ledger.operate.pipeline import restart_arguments

    assert set(inspect.signature(real_start_from_ledger).parameters) == restart_arguments()


def test_spark_kafka_options_prefix_and_spell_values_as_spark_does() -> None:
    assert spark_kafka_options({"security.protocol": "SSL", "kafka.request.timeout.ms": 5000,
                                "kafka.ssl.endpoint.identification.algorithm": "", "x.flag": True}) == {
        "kafka.security.protocol": "SSL", "kafka.request.timeout.ms": "5000",
        "kafka.ssl.endpoint.identification.algorithm": "", "kafka.x.flag": "true"}


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
