"""The executor's producer owner (``sinks/_kafka_owner.py``): its protocol over a real local socket, with a fake
writer in place of ``PartitionWriter`` (the Kafka side runs for real in ``tests/integration/test_sink_kafka.py``).

What exactness needs of it: a transaction is committed only on the task's commit, with every row the task sent,
in order; a task that goes away before its commit leaves it aborted; an error on the owner's side fails the
task at its commit (never a silent success) and never blocks a task still sending rows.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from offset_ledger.rules.kafka_sink import PartitionRun
from offset_ledger.sinks import _kafka_owner
from offset_ledger.sinks._kafka_owner import OwnedWriter, OwnerError


class FakeWriter:
    def __init__(self, topic: str, partition: int, fail_at: int | None) -> None:
        self.topic, self.partition, self.fail_at = topic, partition, fail_at
        self.rows: list[tuple[Any, ...]] = []
        self.state = "open"
        self.timings = {"init_ms": 1.0}

    def write(self, offset: int, value: Any, key: Any, headers: Any, out_partition: Any) -> None:
        if offset == self.fail_at:
            raise ValueError(f"row {offset} refused")
        self.rows.append((offset, value, key, headers, out_partition))

    def write_batch(self, batch: Any) -> None:
        for row in _kafka_owner.arrow_rows(batch):
            self.write(*row)

    def commit(self) -> PartitionRun:
        self.state = "committed"
        return PartitionRun(self.topic, self.partition, len(self.rows), 0, self.rows[-1][0] + 1 if self.rows else 0)

    def abort(self) -> None:
        self.state = "aborted"

    def release(self) -> None:
        self.state = "released"


class Owner:
    """An owner listening in a thread of this process, opening ``FakeWriter``s (or failing to, ``open_fails``)."""

    def __init__(self, path: str, fail_at: int | None = None, open_fails: bool = False) -> None:
        self.path, self.writers = path, []
        self.fail_at, self.open_fails = fail_at, open_fails

    def open(self, cfg: Any, topic: str, partition: int, mark: str) -> FakeWriter:
        if self.open_fails:
            raise RuntimeError("KafkaError{code=_FENCED}")
        writer = FakeWriter(topic, partition, self.fail_at)
        self.writers.append(writer)
        return writer

    def wait_closed(self, state: str) -> None:
        """The one writer opened so far ends in ``state`` (the owner's thread gets there on its own time)."""
        deadline = time.monotonic() + 5
        while (not self.writers or self.writers[0].state != state) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(self.writers) == 1 and self.writers[0].state == state


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[Any]:
    def start(**kw: Any) -> Owner:
        own = Owner(str(tmp_path / "o.sock"), **kw)
        threading.Thread(target=_kafka_owner.serve, args=(own.path, os.getpid(), own.open, 30), daemon=True).start()
        # Listening, not only bound: the socket file exists from bind(), and a connect between bind() and
        # listen() is refused (as the workers do, ``_kafka_owner.connect``, try until one is accepted).
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            probe = _kafka_owner._connect(own.path)
            if probe is not None:
                probe.close()
                break
            time.sleep(0.01)
        return own

    yield start


def _check(topic: str, partition: int, offset: int, until: int) -> None:
    if offset >= until:
        raise ValueError(f"offset {offset} lies past this batch's end")


def _writer(own: Owner, until: int = 10**9) -> OwnedWriter:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(own.path)
    return OwnedWriter(sock, {"ranges": []}, "in", 3, until, "mark", _check)


def test_the_owner_commits_every_row_the_task_sent_in_order_in_chunks(owner: Any) -> None:
    own = owner()
    writer = _writer(own)
    rows = [(o, f"v{o}".encode(), None, [("h", bytearray(b"x"))] if o % 2 else None, o % 3)
            for o in range(_kafka_owner.CHUNK_ROWS * 2 + 7)]
    for row in rows:
        writer.write(*row)
    run = writer.commit()
    assert run == PartitionRun("in", 3, len(rows), 0, len(rows)) and writer.timings == {"init_ms": 1.0}
    [fake] = own.writers
    assert fake.state == "committed"
    assert fake.rows == [(o, v, k, [(h[0][0], b"x")] if h else None, p) for o, v, k, h, p in rows]


def test_arrow_batches_reach_the_owner_whole_with_their_keys_headers_and_partitions(owner: Any) -> None:
    """The task's path: Arrow record batches sent as IPC bytes; the owner writes their rows in order, headers as
    (key, value) pairs, nulls as None; the task checks each batch's last offset against the batch's end."""
    import pyarrow as pa

    own = owner()
    writer = _writer(own, until=10)
    headers = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

    def batch(offsets: list[int]) -> Any:
        return pa.RecordBatch.from_arrays(
            [pa.array(offsets, pa.int64()), pa.array([f"v{o}".encode() for o in offsets], pa.binary()),
             pa.array([None if o % 2 else b"k" for o in offsets], pa.binary()),
             pa.array([[{"key": "h", "value": b"x"}] if o % 3 == 0 else None for o in offsets], headers),
             pa.array([o % 2 if o > 2 else None for o in offsets], pa.int32())],
            names=["offset", "value", "key", "headers", "_out"])

    writer.write_batch(batch([0, 1, 2, 3]))
    writer.write_batch(batch([4, 5, 6]))
    with pytest.raises(ValueError, match="offset 10 lies past"):
        writer.write_batch(batch([9, 10]))  # refused in the task, before it is sent
    run = writer.commit()
    assert run == PartitionRun("in", 3, 7, 0, 7)
    [fake] = own.writers
    assert fake.state == "committed"
    assert fake.rows == [(o, f"v{o}".encode(), None if o % 2 else b"k", [("h", b"x")] if o % 3 == 0 else None,
                          o % 2 if o > 2 else None) for o in range(7)]


def test_a_transaction_opened_ahead_without_rows_is_released_never_committed(owner: Any) -> None:
    own = owner()
    _writer(own).release()
    own.wait_closed("released")


def test_a_task_gone_before_its_commit_leaves_the_transaction_aborted(owner: Any) -> None:
    own = owner()
    writer = _writer(own)
    for o in range(_kafka_owner.CHUNK_ROWS + 1):
        writer.write(o, b"v", None, None, None)
    writer.abort()  # the task failed or its worker was killed: the connection closes
    own.wait_closed("aborted")


def test_an_error_in_the_owner_fails_the_task_at_its_commit_without_blocking_its_rows(owner: Any) -> None:
    own = owner(fail_at=5)
    writer = _writer(own)
    big = b"x" * 4096
    for o in range(3000):  # ~12 MB after the error: more than any socket buffer holds
        writer.write(o, big, None, None, None)
    with pytest.raises(ValueError, match="row 5 refused"):
        writer.commit()
    own.wait_closed("aborted")


def test_a_transaction_the_owner_could_not_open_fails_the_task(owner: Any) -> None:
    own = owner(open_fails=True)
    writer = _writer(own)
    writer.write(0, b"v", None, None, None)
    with pytest.raises(OwnerError, match="_FENCED"):
        writer.commit()


def test_a_row_past_the_batchs_end_fails_in_the_task_at_that_row(owner: Any) -> None:
    own = owner()
    writer = _writer(own, until=2)
    writer.write(1, b"v", None, None, None)
    with pytest.raises(ValueError, match="offset 2 lies past"):
        writer.write(2, b"v", None, None, None)
    writer.abort()
    own.wait_closed("aborted")


def test_one_owner_per_daemon_started_by_the_first_worker_and_gone_with_the_daemon(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_kafka_owner, "socket_dir", lambda: str(tmp_path))
    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        socks: list[Any] = []
        workers = [threading.Thread(target=lambda: socks.append(_kafka_owner.connect(daemon.pid))) for _ in range(3)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert all(s is not None for s in socks) and len(_kafka_owner._STARTED) == 1
        for s in socks:
            s.close()
        started = _kafka_owner._STARTED.pop()
        path = _kafka_owner.socket_path(str(tmp_path), daemon.pid)
        assert os.path.exists(path)
    finally:
        daemon.kill()
        daemon.wait()
    assert started.wait(timeout=10) == 0  # the daemon is gone: so is its owner, and its socket
    assert not os.path.exists(path)


def test_the_socket_directory_is_closed_to_other_users(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_kafka_owner.tempfile, "gettempdir", lambda: str(tmp_path))
    made = _kafka_owner.socket_dir()
    assert os.stat(made).st_mode & 0o777 == 0o700
    os.chmod(made, 0o755)
    with pytest.raises(PermissionError, match="closed to others"):
        _kafka_owner.socket_dir()


def test_the_daemons_shutdown_signal_ends_the_owner_and_removes_its_socket(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PySpark's daemon ends its process group with SIGHUP when the executor stops: the owner goes with it."""
    monkeypatch.setattr(_kafka_owner, "socket_dir", lambda: str(tmp_path))
    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        sock = _kafka_owner.connect(daemon.pid)
        assert sock is not None
        sock.close()
        started = _kafka_owner._STARTED.pop()
        path = _kafka_owner.socket_path(str(tmp_path), daemon.pid)
        os.kill(started.pid, signal.SIGHUP)
        assert started.wait(timeout=10) == 0
        assert not os.path.exists(path) and daemon.poll() is None
    finally:
        daemon.kill()
        daemon.wait()
