"""Concurrent identical reads share one computation, and never an answer older than the request.

The pipelines list costs a few ledger round trips and some Python; four clients polling it on a
two-core machine spent their time queueing behind each other's identical work. Here the callers
of one key that arrive while a computation runs wait for the *next* one, which starts after all
of them arrived and answers them all. So every answer reflects the ledger as read after its
request came in (nothing is cached across time), and at most one computation per key runs at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class _Flight(Generic[T]):
    __slots__ = ("done", "result", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class Coalescer:
    """``run(key, fn)``: fn's result, computed once for every caller of ``key`` waiting together."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[Hashable, _Flight[Any]] = {}   # gathering callers, not started
        self._running: dict[Hashable, threading.Lock] = {}  # one computation per key at a time

    def run(self, key: Hashable, fn: Callable[[], T]) -> T:
        with self._lock:
            flight = self._pending.get(key)
            leader = flight is None
            if flight is None:
                flight = self._pending[key] = _Flight()
            running = self._running.setdefault(key, threading.Lock())
        if leader:
            with running:  # after the previous computation of this key, so it cannot answer us
                with self._lock:
                    del self._pending[key]  # later callers gather for the next computation
                try:
                    flight.result = fn()
                except BaseException as exc:  # noqa: BLE001 - every waiter gets the same error
                    flight.error = exc
                finally:
                    flight.done.set()
        else:
            flight.done.wait()
        if flight.error is not None:
            raise flight.error
        return flight.result  # type: ignore[no-any-return]
