"""Every sink is a ``Sink`` (``offset_ledger.sinks.protocol``): the methods a restart and ``foreachBatch`` call."""

from __future__ import annotations

import inspect

import pytest

from offset_ledger.sinks import DeltaSink, IcebergSink, KafkaSink, PostgresSink, Sink

DSN = "postgresql://ledger@localhost:5432/ledger"  # nothing connects: constructing a sink opens nothing


def _sinks() -> list[object]:
    return [
        PostgresSink(table="public.orders_out", pipeline="orders", dsn=DSN),
        PostgresSink(table="orders_out", pipeline="orders", dsn=DSN, target_dsn="postgresql://t@elsewhere/t"),
        DeltaSink(path="/tables/orders", pipeline="orders", dsn=DSN),
        IcebergSink(table="db.orders", pipeline="orders", warehouse="/warehouse", dsn=DSN),
        KafkaSink(topic="orders_out", bootstrap_servers="127.0.0.1:9092", pipeline="orders", dsn=DSN),
    ]


@pytest.mark.parametrize("sink", _sinks(), ids=lambda s: type(s).__name__)
def test_each_sink_is_a_sink_with_the_protocols_signatures(sink: object) -> None:
    assert isinstance(sink, Sink)
    for name in ("bind", "write", "reconcile", "__call__"):
        theirs = list(inspect.signature(getattr(sink, name)).parameters)
        ours = [p for p in inspect.signature(getattr(Sink, name)).parameters if p != "self"]
        assert theirs == ours, (type(sink).__name__, name, theirs)
    bound = sink.bind("/ck/orders/gen-1-abc")  # type: ignore[attr-defined]
    assert isinstance(bound, type(sink)) and bound is not sink
    assert bound.spec == sink.spec and bound.spec.pipeline == "orders"  # type: ignore[attr-defined]


def test_something_without_reconcile_is_no_sink() -> None:
    class Half:
        spec = None

        def bind(self, checkpoint_location: str) -> Half:
            return self

        def write(self, df: object, batch_id: int) -> None:
            return None

        def __call__(self, df: object, batch_id: int) -> None:
            return None

    assert not isinstance(Half(), Sink)
    assert not isinstance(object(), Sink)


def test_start_from_ledger_types_its_sinks_as_the_protocol() -> None:
    import offset_ledger.operate.restart as restart

    annotation = inspect.signature(restart.start_from_ledger).parameters["sinks"].annotation
    assert annotation == "Sequence[Sink]"
    # Resolved where the protocol lives (restart.py imports it for type checking only).
    from typing import get_type_hints

    assert get_type_hints(restart.start_from_ledger, {**vars(restart), "Sink": Sink})["sinks"] is not None


def test_start_from_ledger_refuses_something_that_is_no_sink_before_it_connects(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from offset_ledger import start_from_ledger
    from offset_ledger.errors import ConfigError

    ledger = tmp_path / "ledger.db"
    with pytest.raises(ConfigError, match="dict is not a sink"):
        start_from_ledger("orders", ["orders"], checkpoint_root=str(tmp_path / "ck"), bootstrap_servers="127.0.0.1:9",
                          dsn=f"sqlite:///{ledger}", sinks=[{"table": "orders_out"}])  # type: ignore[list-item]
    assert not ledger.exists()  # nothing was written, not even the schema
