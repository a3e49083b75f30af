"""What the console shows beyond ``Operations``: state with staleness, findings, runs, generations."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from offset_ledger.ledger import console_queries as cq
from offset_ledger.ledger.activity import open_runs
from offset_ledger.ledger.engine import translate_db_error
from offset_ledger.operate.answers import iso_utc
from offset_ledger.operate.audit import INFORMATIONAL_FINDINGS
from offset_ledger.operate.operations import Operations, resolve_group
from offset_ledger.operate.reads import list_pipelines


class ConsoleReads:
    """Thin, read-only views for the console over the same engine ``Operations`` uses."""

    def __init__(self, ops: Operations) -> None:
        self.ops = ops

    @contextmanager
    def _db(self) -> Iterator[Connection]:
        try:
            with self.ops.engine.connect() as conn:
                yield conn
        except SQLAlchemyError as exc:
            raise translate_db_error(exc, "reading") from exc

    def pipelines(self) -> list[dict[str, Any]]:
        """Every pipeline/consumer group: the API's summary (state with staleness and why, generation,
        foreign runs) plus findings count and the running code's version."""
        summaries = list_pipelines(self.ops, with_lag=True)
        with self._db() as conn:
            counts = cq.finding_counts(conn)
            attention = cq.finding_counts(conn, except_kinds=INFORMATIONAL_FINDINGS)
            last_runs = cq.latest_runs(conn)
        groups_per_pipeline: dict[str, int] = {}
        for s in summaries:
            groups_per_pipeline[s.pipeline] = groups_per_pipeline.get(s.pipeline, 0) + 1
        out = []
        for s in summaries:
            key = (s.pipeline, s.consumer_group)
            row = s.to_dict()
            row["staleRunIds"] = [r.run_id for r in s.runs if r.state == "stale"]
            row["findings"] = counts.get(key, 0)
            row["findingsAttention"] = attention.get(key, 0)  # what the count is coloured by
            gen = s.generation  # shown as the API's object (test_faces_agree: same name, same value)
            run = last_runs.get(key)
            # The running code's version is the newest run's; a generation opened but not yet run
            # still tells which version asked for it.
            row["appVersion"] = (run or {}).get("app_version") or (gen or {}).get("app_version")
            row["groupCount"] = groups_per_pipeline[s.pipeline]
            out.append(row)
        return out

    def runs(self, pipeline: str, consumer_group: str | None = None) -> dict[str, Any]:
        """Runs (with the generation the recorder matched them to) and generations, newest first."""
        with self._db() as conn:
            group = resolve_group(conn, pipeline, consumer_group)
            runs = cq.pipeline_runs(conn, pipeline, group)
            gens = cq.pipeline_generations(conn, pipeline, group)
            judged = {a.run_id: a for a in open_runs(conn, pipeline, group).get((pipeline, group), [])}
        # The recorder decided which generation each run is on (``authority.match_generation``);
        # only the newest generation's runs move positions, the rest are foreign.
        number = {g["id"]: g["generation"] for g in gens}
        current = gens[0]["id"] if gens else None
        return {
            "pipeline": pipeline, "consumerGroup": group,
            "runs": [{
                "runId": r["run_id"], "queryId": r["query_id"], "queryName": r["query_name"],
                "appVersion": r["app_version"], "checkpointLocation": r["checkpoint_location"],
                "generation": number.get(r["generation_id"]),
                "foreign": current is not None and r["generation_id"] != current,
                "startedAt": iso_utc(r["started_at"]), "terminatedAt": iso_utc(r["terminated_at"]),
                "lastHeartbeatAt": iso_utc(r["last_heartbeat_at"]), "lastBatchId": r["last_batch_id"],
                "exception": (r["exception"] or None) and str(r["exception"])[:2000],
                # The liveness rule's answer (ledger.activity): an unterminated row may be presumed crashed,
                # and a sink's row ended with its query.
                "state": judged[r["run_id"]].state if r["run_id"] in judged else "terminated",
                "why": judged[r["run_id"]].why if r["run_id"] in judged else None,
            } for r in runs],
            "generations": [{
                "generation": g["generation"], "location": g["location"], "appVersion": g["app_version"],
                "reason": g["reason"], "createdAt": iso_utc(g["created_at"]), "startingOffsets": g["starting_offsets"],
            } for g in gens],
        }
