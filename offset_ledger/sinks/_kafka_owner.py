"""One owner of the Kafka sink's producers per Spark executor, reached by its Python workers over a local socket.

Why: Spark hands a source partition's task to whichever Python worker of the executor is free, and each
worker is its own forked process. With the producers kept per worker (``_kafka_tx._PRODUCERS``), a
partition whose task moved to another worker needed a new producer there, whose ``init_transactions``
fenced the producer the other worker kept, which then had to be replaced in turn when the partition came
back: 2-3 new producers a batch of 6 partitions on 2 workers, each 55 ms or 505 ms (librdkafka's fixed
500 ms PID retry), most of a small batch (issue 53, docs/sinks.md "Throughput"). The producers cannot be
shared between forked processes (librdkafka's threads do not survive a fork), so one process per executor
holds them: every worker of the executor sends its partition's rows there, and a partition's next batch
finds its producer kept, whichever worker runs it.

The owner runs the same ``_kafka_tx.PartitionWriter`` a worker ran before (fence, read the group's
position, send the offsets, produce, commit), one thread per connection, and keeps a producer only after
its commit succeeded. One connection is one source partition's transaction::

    worker -> owner   ("open", cfg, topic, partition, mark)     the owner opens the transaction meanwhile
    worker -> owner   ("arrow", Arrow IPC stream of the rows' offset, value, key, headers, _out)   any number
                      (or ("rows", [(offset, value, key, headers, output partition), ...]))
    worker -> owner   ("commit",)  or  ("release",): opened ahead, no row came (aborted, the producer kept)
    owner  -> worker  ("done", written, skipped, committed position, timings) | ("error", kind, message)

A connection that closes before its commit (the task failed, was killed, or its worker died) aborts the
transaction and drops the producer. An error on the owner's side is answered once and the rest of the
connection is read and discarded, so a worker still sending rows never blocks on a full socket.

Where: the socket is named after the executor's PySpark daemon (the workers' parent process, one per
executor and Python executable), in a directory only this user can enter. The first worker that finds
no owner starts one (under a file lock, so one per executor), as a child in the daemon's process group:
the daemon's shutdown (its ``SIGHUP`` to the group, when the executor stops or dies) ends it, and it
also ends itself when the daemon is gone or after ``IDLE_S`` without a connection.

Imports neither SQLAlchemy nor the ledger (it runs on executors); ``confluent_kafka`` only in the owner.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from offset_ledger.errors import KafkaError
from offset_ledger.pids import pid_exists
from offset_ledger.rules.kafka_sink import PartitionRun

#: A frame: its length (4 bytes, network order), then a pickle.
_HEADER = struct.Struct("!I")
#: Rows go to the owner in chunks of at most this many rows or bytes (one frame each).
CHUNK_ROWS = 2000
CHUNK_BYTES = 1 << 20
#: The owner ends itself after this long without a connection (its kept producers with it).
IDLE_S = 600.0
#: How long a worker waits for the owner it started to listen before it keeps its producers itself.
START_TIMEOUT_S = 20.0


class OwnerError(KafkaError):
    """The owner answered an error that is none of the row checks' (``ValueError``): a Kafka failure, say."""


# ------------------------------------------------------------------ frames

def send(sock: socket.socket, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket) -> Any:
    """The next message, or None when the peer closed the connection (between frames or within one)."""
    head = _read_exact(sock, _HEADER.size)
    if head is None:
        return None
    body = _read_exact(sock, _HEADER.unpack(head)[0])
    return None if body is None else pickle.loads(body)


def arrow_rows(batch: Any) -> Iterator[tuple[Any, ...]]:
    """The rows of an Arrow record batch of the task's columns (offset, value, key, headers, _out) as
    (offset, value, key, headers as (key, value) pairs or None, output partition): one column at a time into
    Python objects (pyarrow's C loops), not a Python object per cell of a pickled row."""
    offsets = batch.column("offset").to_pylist()
    values = batch.column("value").to_pylist()
    keys = batch.column("key").to_pylist()
    outs = batch.column("_out").to_pylist()
    column = batch.column("headers")
    if column.null_count == len(column):
        headers: list[Any] = [None] * len(offsets)
    else:
        headers = [None if hs is None else [(h["key"], h["value"]) for h in hs] for hs in column.to_pylist()]
    return zip(offsets, values, keys, headers, outs)


# ------------------------------------------------------------------ where

def socket_dir() -> str:
    """A directory only this user can enter (the socket carries pickles: nobody else may connect)."""
    path = os.path.join(tempfile.gettempdir(), f"offset-ledger-ksink-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{path} must belong to uid {os.getuid()} and be closed to others (mode 0700)")
    return path


def socket_path(directory: str, daemon_pid: int) -> str:
    """The executor's owner: one per PySpark daemon (the Python workers' parent), so per executor."""
    return os.path.join(directory, f"owner-{daemon_pid}.sock")


def _start_lock(path: str) -> str:
    """One lock for starting and ending the user's owners (rare: once per executor), never removed."""
    return os.path.join(os.path.dirname(path), "start.lock")


# ------------------------------------------------------------------ the owner's side

class Connection:
    """One source partition's transaction on the owner's side, over any writer (``PartitionWriter`` in use)."""

    def __init__(self, sock: socket.socket, open_writer: Callable[..., Any]) -> None:
        self.sock, self.open_writer = sock, open_writer

    def run(self) -> None:
        writer = None
        committed = False
        try:
            message = recv(self.sock)
            if message is None or message[0] != "open":
                return
            _, cfg, topic, partition, mark = message
            writer = self.open_writer(cfg, topic, partition, mark)
            while True:
                message = recv(self.sock)
                if message is None:  # the task is gone before its commit: abort below
                    return
                if message[0] == "arrow":
                    import pyarrow as pa

                    for batch in pa.ipc.open_stream(message[1]):
                        writer.write_batch(batch)
                elif message[0] == "rows":
                    for row in message[1]:
                        writer.write(*row)
                elif message[0] == "release":  # opened ahead, no row came: aborted, the producer kept
                    writer.release()
                    writer = None
                    return
                elif message[0] == "commit":
                    run = writer.commit()
                    committed = True
                    send(self.sock, ("done", run.written, run.skipped, run.committed, dict(writer.timings)))
                    return
                else:
                    raise ValueError(f"unknown message {message[0]!r}")
        except Exception as exc:  # noqa: BLE001 - answered to the task, which fails with it
            if writer is not None and not committed:
                writer.abort()
                writer = None
            kind = "value" if isinstance(exc, ValueError) else "kafka"
            with contextlib.suppress(OSError):
                send(self.sock, ("error", kind, f"{type(exc).__name__}: {exc}"))
                # Read what the task still sends (it learns of the error at its commit), so it never blocks.
                while recv(self.sock) is not None:
                    pass
        finally:
            if writer is not None and not committed:
                writer.abort()
            with contextlib.suppress(OSError):
                self.sock.close()


def serve(path: str, daemon_pid: int, open_writer: Callable[..., Any], idle_s: float = IDLE_S) -> None:
    """Listen on ``path`` until the daemon is gone or nobody connected for ``idle_s``; a thread per connection,
    whose transaction ``open_writer(cfg, topic, partition, mark)`` opens (``_kafka_tx.open_writer``)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a dead owner's (the starter holds the lock: no live owner listens on it)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    server.settimeout(1.0)
    last = time.monotonic()
    active: list[threading.Thread] = []
    try:
        while pid_exists(daemon_pid):
            try:
                sock, _ = server.accept()
            except TimeoutError:
                active = [t for t in active if t.is_alive()]
                if not active and time.monotonic() - last > idle_s:
                    return
                continue
            sock.settimeout(None)
            last = time.monotonic()
            thread = threading.Thread(target=Connection(sock, open_writer).run, daemon=True)
            thread.start()
            active.append(thread)
    finally:
        # Under the starters' lock, the name first: a worker that finds no owner from now on starts a new one,
        # and this one's unlink can never remove the new one's socket.
        with open(_start_lock(path), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            server.close()


def run(path: str, daemon_pid: int, open_writer: Callable[..., Any]) -> None:
    """The owner process's main: ``serve``, ended by the daemon's shutdown signal too (its socket's name
    removed either way), then out without the interpreter's teardown: the kept producers hold no open
    transaction between tasks, and a transaction still open dies with its connection (aborted by the
    coordinator, or fenced by the partition's next attempt)."""
    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGHUP, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        serve(path, daemon_pid, open_writer)
    finally:
        os._exit(0)


# ------------------------------------------------------------------ the worker's side

def _connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        return sock
    except OSError:
        sock.close()
        return None


#: The owner this worker started (kept so that the worker reaps it; it outlives the worker otherwise).
_STARTED: list[subprocess.Popen[bytes]] = []


def connect(daemon_pid: int | None = None) -> socket.socket | None:
    """A connection to this executor's owner, started when there is none; None when it cannot be had (the
    task then keeps its producer in its own worker, as before: slower, as exact)."""
    try:
        directory = socket_dir()
    except OSError:
        return None
    pid = os.getppid() if daemon_pid is None else daemon_pid
    path = socket_path(directory, pid)
    sock = _connect(path)
    if sock is not None:
        return sock
    with open(_start_lock(path), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one starter per executor; the others wait and connect
        sock = _connect(path)
        if sock is not None:
            return sock
        # This interpreter and this worker's import path (a job's --py-files zip is on sys.path only).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        proc = subprocess.Popen(  # noqa: S603
            [sys.executable, "-c", f"from offset_ledger.sinks._kafka_tx import serve_owner; serve_owner({path!r}, {pid})"],
            stdin=subprocess.DEVNULL, close_fds=True, env=env)
        _STARTED.append(proc)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            sock = _connect(path)
            if sock is not None:
                return sock
            time.sleep(0.01)
        return None


class OwnedWriter:
    """A worker's handle on one source partition's transaction in the owner: same ``write``/``commit``/``abort``
    as ``PartitionWriter``; the rows travel in chunks, the owner opens the transaction while they come."""

    def __init__(self, sock: socket.socket, cfg: Mapping[str, Any], topic: str, partition: int, until: int,
                 mark: str, check: Callable[[str, int, int, int], None]) -> None:
        self.sock, self.topic, self.partition, self.until, self.check = sock, topic, partition, until, check
        self.rows: list[tuple[Any, ...]] = []
        self.bytes = 0
        self.timings: dict[str, float] = {}
        self.connect_ms = 0.0  # reaching (or starting) the owner, set by the task
        self.requested = False
        send(sock, ("open", dict(cfg), topic, partition, mark))

    def write(self, offset: int, value: Any, key: Any, headers: Any, out_partition: Any) -> None:
        self.check(self.topic, self.partition, offset, self.until)  # at its row, as in the worker before
        if headers:
            headers = [(h[0], None if h[1] is None else bytes(h[1])) for h in headers]
        self.rows.append((offset, value, key, headers, out_partition))
        self.bytes += len(value or b"") + len(key or b"")
        if len(self.rows) >= CHUNK_ROWS or self.bytes >= CHUNK_BYTES:
            self._flush()

    def write_batch(self, batch: Any) -> None:
        """An Arrow record batch of the task's columns, checked here (its last offset against the batch's end of
        the partition), sent on as Arrow IPC bytes: no row becomes a Python object in the task."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if batch.num_rows == 0:
            return
        self.check(self.topic, self.partition, int(pc.max(batch.column("offset")).as_py()), self.until)
        self._flush()
        out = pa.BufferOutputStream()
        with pa.ipc.new_stream(out, batch.schema) as stream:
            stream.write_batch(batch)
        send(self.sock, ("arrow", out.getvalue().to_pybytes()))

    def _flush(self) -> None:
        if self.rows:
            send(self.sock, ("rows", self.rows))
            self.rows, self.bytes = [], 0

    def request_commit(self) -> None:
        """Ask for the commit without waiting for it (``commit`` reads the answer): a task's transactions commit
        side by side in the owner."""
        if self.requested:
            return
        self.requested = True
        try:
            self._flush()
            send(self.sock, ("commit",))
        except OSError:
            pass  # the owner answered an error and closed, or died: its answer (or its absence) says which

    def commit(self) -> PartitionRun:
        """What the owner committed; raises what the owner met (nothing of the transaction is committed then)."""
        self.request_commit()
        reply = recv(self.sock)
        self.sock.close()
        if reply is None:
            raise OwnerError(f"the executor's Kafka producer owner went away during {self.topic}[{self.partition}]'s "
                             f"transaction (aborted: nothing of it is committed)")
        if reply[0] == "error":
            raise (ValueError if reply[1] == "value" else OwnerError)(reply[2])
        _, written, skipped, committed, self.timings = reply
        return PartitionRun(self.topic, self.partition, int(written), int(skipped), int(committed))

    def release(self) -> None:
        """The transaction was opened ahead and no row came: the owner aborts it and keeps its producer."""
        with contextlib.suppress(OSError):
            send(self.sock, ("release",))
        self.abort()

    def abort(self) -> None:
        """Closing before the commit aborts the transaction in the owner (and drops its producer)."""
        with contextlib.suppress(OSError):
            self.sock.close()


