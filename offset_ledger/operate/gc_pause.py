"""Python's cyclic garbage collector paused around a bulk computation (a scrape, a restart).

Building 10,000 partitions' worth of rows makes ~100,000 short-lived objects that reference
counting frees on its own. With the collector on, they live long enough to be promoted, and the
collector then walks the whole heap (every module, class and cache of the process) once or twice
per computation (most of a /metrics scrape: docs/benchmarks.md). Paused, they die young
without ever being examined. Results are unchanged, memory is freed by reference counting as
before, and the collector resumes (if it was on) when the last pauser leaves.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off inside the block (re-entrant and thread-safe: on again when the last block
    in any thread ends, and only if it was on when the first began)."""
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()
