"""Checkpoint locations compared as locations, not strings (pure, no I/O).

A checkpoint is named in two spellings. The restart helper hands out what the caller wrote
(``/ck/gen-1-ab12cd34``, ``s3a://bucket/ck/...``, ``hdfs:///ck/...``); Spark reports
``resolvedCheckpointRoot``, the path qualified against its file system (``file:/ck/gen-1-ab12cd34``,
``hdfs://nn:8020/ck/...``). Spark 3.0 and later print it unescaped (measured with PySpark 4.2: a
space stays a space), so a ``%`` is a literal character on both sides and nothing is decoded.
``parse_location`` brings either to one form and ``same_place`` says whether two name the same
directory. A copy of a checkpoint somewhere else is a different place, whatever its last
directory is called.

The normal form:

- scheme lower-cased (URI schemes are case-insensitive); no scheme: a plain path, on whatever
  file system the driver's default is (``fs.defaultFS``: local, HDFS, ``dbfs:``, ...);
- ``file:``, ``file://`` + path, ``file:///`` and ``file://localhost/`` are one (RFC 8089);
  ``hdfs:///x`` (empty authority) is "no authority", like ``hdfs:/x``;
- a host is lower-cased (DNS names are case-insensitive), and HDFS's default name-node port 8020
  (Hadoop's ``dfs.namenode.rpc-port`` default, used when an ``hdfs://`` URI names none) is dropped.
  Other ports are kept: 9000 is only a common setting, not a default, and bucket names
  (``s3a://Bucket``) keep their case;
- the path has no doubled or trailing slashes, and ``.``/``..`` segments resolved, as Hadoop's
  ``Path`` normalises the URI it builds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*):(.*)", re.DOTALL)
# Schemes whose authority is a host[:port] (not a bucket or container name): its case is not significant.
_HOST_SCHEMES = frozenset({"hdfs", "webhdfs", "swebhdfs", "file", "ftp", "sftp"})
_DEFAULT_PORTS = {"hdfs": "8020"}


@dataclass(frozen=True)
class Location:
    """A checkpoint location in normal form (see the module docstring)."""

    scheme: str | None  # None: a plain path on the default file system
    authority: str | None  # None: none given (the scheme's default file system)
    path: str  # "/"-separated; relative when it does not start with "/"

    def __str__(self) -> str:
        if self.scheme is None:
            return self.path
        if self.authority is None:
            return f"{self.scheme}:{self.path}"
        return f"{self.scheme}://{self.authority}{self.path}"


def parse_location(text: str) -> Location:
    """The normal form of a checkpoint location, as handed out or as Spark reports it."""
    raw = str(text).strip()
    scheme: str | None = None
    authority: str | None = None
    rest = raw
    match = _SCHEME.fullmatch(raw)
    # One letter before ":" is a Windows drive (C:/ck), not a scheme.
    if match and len(match.group(1)) > 1:
        scheme, rest = match.group(1).lower(), match.group(2)
        if rest.startswith("//"):
            end = rest.find("/", 2)
            authority, rest = (rest[2:], "") if end < 0 else (rest[2:end], rest[end:])
            authority = _normal_authority(scheme, authority)
        if not rest:
            rest = "/"
    return Location(scheme, authority, _normal_path(rest))


def normalize_location(text: str) -> str:
    """``parse_location`` as text: the form locations are shown and compared in."""
    return str(parse_location(text))


def _normal_authority(scheme: str, authority: str) -> str | None:
    if not authority:
        return None
    user, at, host = authority.rpartition("@")
    port = ""
    if not host.startswith("[") and host.count(":") == 1:  # host:port (not a bare IPv6 address)
        host, port = host.split(":")
    elif host.startswith("[") and "]:" in host:
        host, port = host.rsplit(":", 1)
    if scheme in _HOST_SCHEMES or at:
        # abfss://container@account.dfs.core.windows.net: the part after "@" is a host too.
        host = host.lower()
    if port and _DEFAULT_PORTS.get(scheme) == port:
        port = ""
    if scheme == "file" and host == "localhost" and not at and not port:
        return None
    return f"{user}{at}{host}{':' + port if port else ''}" or None


def _normal_path(path: str) -> str:
    absolute = path.startswith("/")
    out: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == ".." and out and out[-1] != "..":
            out.pop()
        elif segment == ".." and absolute:
            continue  # above the root is the root
        else:
            out.append(segment)
    joined = "/".join(out)
    return "/" + joined if absolute else (joined or ".")


def _path_matches(a: str, b: str) -> bool:
    if a.startswith("/") == b.startswith("/"):
        return a == b
    # A relative path is relative to a working directory we cannot see (the driver's, or the file
    # system's home): it names the absolute path that ends with it, segment for segment.
    relative, absolute = (a, b) if not a.startswith("/") else (b, a)
    return relative != "." and absolute.endswith("/" + relative)


def same_place(a: Location, b: Location) -> bool:
    """Whether two normalised locations can name the same directory.

    Paths must be equal. A location without a scheme (a plain path) is on the default file
    system, whichever it is; a location without an authority (``hdfs:///ck``) is on the scheme's
    default file system, which Spark qualifies with its authority when it reports it
    (``hdfs://namenode:8020/ck``): a missing part matches any, a given part only itself.
    """
    if not _path_matches(a.path, b.path):
        return False
    if a.scheme is None or b.scheme is None:
        return True
    if a.scheme != b.scheme:
        return False
    return a.authority is None or b.authority is None or a.authority == b.authority


def same_root(a: str | None, b: str | None) -> bool:
    """Whether two checkpoint roots a caller gave (neither reported by Spark) are the same directory.

    Stricter than ``same_place`` about plain paths: a plain path is taken as local (``/ck`` is
    ``file:///ck``), so ``/ck`` then ``s3a://bucket/ck`` is a move to other storage, not a respelling.
    """
    if not a or not b or not a.strip() or not b.strip():
        return a == b
    pa, pb = parse_location(a), parse_location(b)
    if pa.scheme is None:
        pa = Location("file", None, pa.path)
    if pb.scheme is None:
        pb = Location("file", None, pb.path)
    return same_place(pa, pb)
