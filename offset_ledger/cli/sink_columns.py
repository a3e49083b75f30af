"""``offset-ledger history`` columns for batches a transactional sink wrote (sink, target, version, rows)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def output_columns(items: Sequence[dict[str, Any]], columns: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per batch range, with the batch's sink output beside it (one sink per row; several: joined)."""
    rows = []
    for b in items:
        outs = b.get("outputs") or []
        extra = {
            "sink": ",".join(o["sink"] for o in outs),
            "target": ",".join(o["target"] for o in outs),
            "sequence": ",".join(str(o["sequence"]) for o in outs),
            "tableVersion": ",".join("" if o["tableVersion"] is None else str(o["tableVersion"]) for o in outs),
            "rowCount": ",".join("" if o["rowCount"] is None else str(o["rowCount"]) for o in outs),
        }
        rows.extend({"batchTime": b["batchTime"], "batchId": b["batchId"], "queryId": b["queryId"], **r, **extra}
                    for r in b["ranges"])
    return rows, [*columns, "sink", "target", "sequence", "tableVersion", "rowCount"]
