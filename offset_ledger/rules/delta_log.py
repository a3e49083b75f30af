"""Pure: the parts of a Delta Lake commit (``_delta_log/<version>.json``) a sink needs.

Each line of a commit file is one action. ``txn`` (``{"appId", "version"}``) is what a write with
``txnAppId``/``txnVersion`` leaves, so a later write with a version not above it is skipped by
Delta: the sink's idempotence key. ``commitInfo.userMetadata`` carries what the sink put there (its
batch record, to reconcile the ledger from), ``commitInfo.operationMetrics.numOutputRows`` the rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from offset_ledger.errors import CheckpointFormatError


@dataclass(frozen=True)
class DeltaCommit:
    """One table version as far as a sink cares."""

    version: int
    txn_app_id: str | None
    txn_version: int | None
    user_metadata: str | None
    output_rows: int | None


def commit_version(file_name: str) -> int | None:
    """The table version of a ``_delta_log`` entry (``00000000000000000012.json`` -> 12), else None."""
    stem, dot, ext = file_name.partition(".")
    return int(stem) if dot and ext == "json" and stem.isdigit() and len(stem) == 20 else None


def parse_commit(version: int, data: bytes, path: str) -> DeltaCommit:
    """A commit file's txn, user metadata and output rows."""
    app_id = txn_version = user_metadata = rows = None
    for number, line in enumerate(data.decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            action: dict[str, Any] = json.loads(line)
        except ValueError as exc:
            raise CheckpointFormatError(path, f"line {number} is not JSON: {exc}") from exc
        if "txn" in action:
            app_id, txn_version = action["txn"].get("appId"), int(action["txn"]["version"])
        if "commitInfo" in action:
            info = action["commitInfo"]
            user_metadata = info.get("userMetadata")
            metric = (info.get("operationMetrics") or {}).get("numOutputRows")
            rows = int(metric) if metric is not None else None
    return DeltaCommit(version, app_id, txn_version, user_metadata, rows)
