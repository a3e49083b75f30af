"""Reading a Spark checkpoint's files: local paths directly, remote URIs (``s3a://``, ``abfss://``,
``gs://``, ``hdfs://``) through ``fsspec``. What the files mean is ``offset_ledger.rules.checkpoint``'s job.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from offset_ledger.errors import CheckpointFormatError, ConfigError, install_hint
from offset_ledger.rules.checkpoint import CheckpointFiles

#: The fsspec implementation each remote scheme needs, for the install hint.
_REMOTE_PACKAGES = {
    "s3": "s3fs", "s3a": "s3fs", "s3n": "s3fs", "abfs": "adlfs", "abfss": "adlfs", "az": "adlfs",
    "wasb": "adlfs", "wasbs": "adlfs", "gs": "gcsfs", "gcs": "gcsfs", "hdfs": "pyarrow (HDFS support)",
    "viewfs": "pyarrow (HDFS support)",
}


class LocalFiles:
    """A checkpoint on the local file system (a plain path or ``file:`` URI)."""

    def __init__(self, location: str) -> None:
        self.root = Path(location.removeprefix("file://") if location.startswith("file://")
                         else location.removeprefix("file:"))

    def list(self, relative_dir: str) -> list[str]:
        d = self.root / relative_dir
        return sorted(p.name for p in d.iterdir()) if d.is_dir() else []

    def read(self, relative_path: str) -> bytes | None:
        p = self.root / relative_path
        try:
            return p.read_bytes() if p.is_file() else None
        except OSError as exc:
            raise CheckpointFormatError(str(p), f"cannot read: {exc.strerror}") from exc


class FsspecFiles:
    """A checkpoint behind any URI fsspec can open (``s3a://``, ``abfss://``, ``gs://``, ``hdfs://``)."""

    def __init__(self, location: str, storage_options: Mapping[str, Any] | None = None) -> None:
        scheme = location.split("://", 1)[0].lower()
        package = _REMOTE_PACKAGES.get(scheme, f"the fsspec implementation for {scheme}://")
        try:
            import fsspec
        except ImportError as exc:
            raise ConfigError(f"reading {scheme}:// checkpoints needs fsspec and {package}: "
                              f"{install_hint('remote')} {package.split()[0]}") from exc
        try:
            self.fs, self.root = fsspec.core.url_to_fs(location, **dict(storage_options or {}))
        except ImportError as exc:
            raise ConfigError(f"reading {scheme}:// checkpoints needs {package}: pip install "
                              f"{package.split()[0]}") from exc
        except ValueError as exc:  # an unknown protocol
            raise ConfigError(f"cannot read checkpoint {location}: {exc}") from exc
        self.location = location
        self.root = self.root.rstrip("/")

    def list(self, relative_dir: str) -> list[str]:
        try:
            entries = self.fs.ls(posixpath.join(self.root, relative_dir), detail=False)
        except FileNotFoundError:
            return []
        return sorted(posixpath.basename(str(e).rstrip("/")) for e in entries)

    def read(self, relative_path: str) -> bytes | None:
        path = posixpath.join(self.root, relative_path)
        try:
            with self.fs.open(path, "rb") as fh:
                data: bytes = fh.read()
                return data
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CheckpointFormatError(f"{self.location.rstrip('/')}/{relative_path}", f"cannot read: {exc}") from exc


def checkpoint_files(location: str, storage_options: Mapping[str, Any] | None = None) -> CheckpointFiles:
    """Local paths and ``file:`` URIs directly; any other ``scheme://`` through fsspec."""
    if "://" in location and not location.startswith("file://"):
        return FsspecFiles(location, storage_options)
    local = LocalFiles(location)
    if not local.root.is_dir():
        raise CheckpointFormatError(location, "no such directory")
    return local


