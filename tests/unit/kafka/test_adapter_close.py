"""``KafkaAdapter.close`` is bounded: a client whose close never returns (kafka-python 3.0 joins its IO
thread without a timeout) must not hang the caller — a CLI command that has already answered."""

from __future__ import annotations

import threading
import time

from offset_ledger.kafka.adapter import KafkaAdapter


class _Client:
    def __init__(self, *, hang: threading.Event | None = None) -> None:
        self.hang = hang
        self.closed = False

    def close(self, **_kwargs: object) -> None:
        if self.hang is not None:
            self.hang.wait()  # stuck until the test releases it
        self.closed = True


def test_a_client_that_never_closes_holds_close_for_at_most_one_request_timeout() -> None:
    release = threading.Event()
    adapter = KafkaAdapter("127.0.0.1:9", request_timeout_ms=300)
    stuck, sampler = _Client(hang=release), _Client()
    adapter._consumer, adapter._sampler = stuck, sampler
    began = time.monotonic()
    try:
        adapter.close()
        took = time.monotonic() - began
        assert 0.25 <= took < 3, took
        assert not stuck.closed and adapter._consumer is None and adapter._sampler is None
    finally:
        release.set()


def test_clients_that_close_are_closed_before_close_returns() -> None:
    adapter = KafkaAdapter("127.0.0.1:9", request_timeout_ms=5_000)
    consumer, sampler, admin = _Client(), _Client(), _Client()
    adapter._consumer, adapter._sampler, adapter._admin = consumer, sampler, admin
    adapter.close()
    assert consumer.closed and sampler.closed and admin.closed
    assert adapter._admin is None
