"""Coalescer: identical concurrent reads share one computation that started after they arrived."""

from __future__ import annotations

import threading
import time

import pytest

from offset_ledger.rules.coalesce import Coalescer


def test_sequential_calls_compute_every_time() -> None:
    c, calls = Coalescer(), []
    for i in range(3):
        assert c.run("k", lambda i=i: calls.append(i) or i) == i
    assert calls == [0, 1, 2]  # nothing is cached across time


def test_callers_arriving_during_a_computation_share_the_next_one_and_never_an_older_answer() -> None:
    c = Coalescer()
    release = threading.Event()
    starts: list[float] = []

    def compute() -> float:
        started = time.monotonic()
        starts.append(started)
        if len(starts) == 1:
            release.wait(5)  # the first computation is running while the others arrive
        return started

    answers: dict[int, tuple[float, float]] = {}

    def caller(n: int) -> None:
        arrived = time.monotonic()
        answers[n] = (arrived, c.run("list", compute))

    first = threading.Thread(target=caller, args=(0,))
    first.start()
    while not starts:
        time.sleep(0.001)
    others = [threading.Thread(target=caller, args=(n,)) for n in range(1, 6)]
    for t in others:
        t.start()
    time.sleep(0.05)
    release.set()
    for t in [first, *others]:
        t.join(5)
    assert len(starts) == 2  # five callers, one computation for all of them
    for arrived, answer_started in answers.values():
        assert answer_started >= arrived  # each answer was computed after its request arrived
    assert other_keys_do_not_wait(c)


def other_keys_do_not_wait(c: Coalescer) -> bool:
    return c.run("other", lambda: True)


def test_an_error_reaches_every_waiter_and_the_next_call_computes_again() -> None:
    c = Coalescer()
    release = threading.Event()
    errors: list[BaseException] = []

    def failing() -> None:
        release.wait(5)
        raise RuntimeError("ledger down")

    def caller() -> None:
        try:
            c.run("k", failing)
        except RuntimeError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=caller) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    release.set()
    for t in threads:
        t.join(5)
    assert len(errors) == 3
    assert c.run("k", lambda: "fine") == "fine"
    with pytest.raises(ZeroDivisionError):
        c.run("k", lambda: 1 / 0)
