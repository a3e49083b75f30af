"""An earlier release (git commit 4cc5ce0 before the compact layout, f245580 the one after it), extracted
from this repository's history, and run.

``git archive`` writes its ``offset_ledger`` package to a temporary directory; a subprocess with
that directory first on ``PYTHONPATH`` records batches through that release's own ``Recorder`` (its
general path, its COPY of a many-partition batch and, on PostgreSQL, its one-statement fast paths)
exactly as its listener's writer would, and prints what it recorded as JSON. CI runs on a full clone:
there a missing git or commit fails the test; elsewhere it is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

PREVIOUS_RELEASE = "4cc5ce0"
#: The release that wrote ``offset_ranges`` itself (0016, 0017): 0018 partitions that table under it.
COMPACT_RELEASE = "f245580"
#: The last release (0019): its ``offset_ranges`` has a foreign key to ``batches`` (0020 drops it) and its
#: ``positions`` has ``query_id`` between the columns a batch changes (0021).
LAST_RELEASE = "1e8e3af"
#: The release before the driver heartbeat (0021): its listener writes no ``runs.beat_at`` (0022 adds it).
HEARTBEAT_PREDECESSOR = "86cbfe6"
#: The release before positions became a row per topic (0024): its listener reads and writes ``positions``
#: one row per partition, with ``INSERT ... ON CONFLICT`` on its key.
PER_PARTITION_POSITIONS = "f0265ab"
ROOT = Path(__file__).resolve().parent.parent


def extract(into: Path, commit: str = PREVIOUS_RELEASE) -> Path:
    """The release ``commit``'s ``offset_ledger`` package under ``into`` (returned: the PYTHONPATH entry)."""
    git = shutil.which("git")
    problem = None
    if git is None:
        problem = "git is not installed"
    else:
        found = subprocess.run([git, "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
                               capture_output=True)
        if found.returncode != 0:
            problem = f"commit {commit} is not in this clone (a shallow clone?)"
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the previous release cannot be extracted: {problem}")
        pytest.skip(f"the previous release cannot be extracted: {problem}")
    into.mkdir(parents=True, exist_ok=True)
    archive = into / "release.tar"
    with archive.open("wb") as out:
        subprocess.run([git, "-C", str(ROOT), "archive", commit, "offset_ledger", "migrations"],
                       stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()
    return into


# Run by the previous release: one run of one query on two sources; batch 0 has 250 partitions and
# an unreported start (the general path, COPY on psycopg2), batches 1-3 one call each (PostgreSQL:
# the one-batch statement), batches 4-6 in one call (the several-batches statement).
_RECORD = r"""
import json, sys
from datetime import datetime, timedelta, timezone
from offset_ledger.ledger.engine import make_engine
from offset_ledger.ledger.recorder import BatchRecord, Recorder, RunStart
from offset_ledger.rules.model import BatchOffsets, PartitionRange, SourceProgress

dsn, pipeline, query = sys.argv[1], sys.argv[2], sys.argv[3]
t0 = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)
engine = make_engine(dsn)
recorder = Recorder(engine)
general = []  # which record() calls took the general path (the rest: the one-statement fast path)
# the general path: a method of the recorder up to f245580, its GeneralPath collaborator since
owner = recorder if hasattr(recorder, "_record") else recorder._general
name = "_record" if owner is recorder else "record"
_record = getattr(owner, name)
def counted(conn, records, txn):
    general.append(len(outcomes))
    return _record(conn, records, txn)
setattr(owner, name, counted)
out, outcomes = [], []
recorder.record([RunStart(pipeline, pipeline, query, "run-" + query, pipeline, t0)])
general.clear()
ends = {("t", p): 0 for p in range(250)}
ends.update({("u", p): 0 for p in range(2)})

def batch(n):
    sources = []
    for index, topic in ((0, "t"), (1, "u")):
        ranges = []
        for (tp, p), end in sorted(ends.items()):
            if tp != topic:
                continue
            start = None if (n == 0 and p == 1) else end
            until = end + 1 + (n + p) % 7
            ranges.append(PartitionRange(topic, p, start, until))
            out.append([query, n, index, topic, p, start, until])
            ends[(tp, p)] = until
        rows = sum(r.until_offset - (r.from_offset or 0) for r in ranges)
        sources.append(SourceProgress(index, "KafkaV2[Subscribe[%s]]" % topic, tuple(ranges), rows))
    rows = sum(s.input_rows for s in sources)
    return BatchRecord(pipeline, pipeline, BatchOffsets(query, "run-" + query, pipeline, n,
                                                        t0 + timedelta(seconds=5 * n), rows, tuple(sources),
                                                        duration_ms=100))

for group in ([0], [1], [2], [3], [4, 5, 6]):
    outcome = recorder.record([batch(n) for n in group])
    outcomes.append([outcome.batches_written, outcome.duplicates, [f.kind for f in outcome.findings]])
recorder.close()
print(json.dumps({"ranges": out, "outcomes": outcomes, "general_path_calls": general}))
"""


def upgrade_with_release(release: Path, dsn: str, revision: str) -> None:
    """``db upgrade`` to ``revision`` by the release at ``release`` (its own 0001 builds its own tables)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(release)
    script = "import sys; from offset_ledger.ledger.engine import make_engine, upgrade; " \
             "upgrade(make_engine(sys.argv[1]), sys.argv[2])"
    done = subprocess.run([sys.executable, "-c", script, dsn, revision], env=env, cwd=release,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]


def record_with_previous_release(release: Path, dsn: str, pipeline: str, query: str) -> dict[str, Any]:
    """Record seven batches of ``query`` through the previous release's Recorder; what it recorded."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(release)
    done = subprocess.run([sys.executable, "-c", _RECORD, dsn, pipeline, query], env=env, cwd=release,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"the previous release failed to record:\n{done.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def documented_queries() -> list[str]:
    """docs/audit.md's SQL examples as runnable text: psql's ``\\set`` variables substituted."""
    text = (ROOT / "docs" / "audit.md").read_text()
    out = []
    # the documented queries are the marked blocks (as tests/integration/test_audit_views.py reads them)
    for _, block in re.findall(r"<!-- query: ([\w-]+) -->\s*```sql\n(.*?)```", text, flags=re.S):
        values = dict(re.findall(r"^\\set (\w+) (.+)$", block, flags=re.M))
        sql = "\n".join(line for line in block.splitlines() if not line.startswith("\\set"))
        for name, value in values.items():
            literal = value.strip().strip("'")
            sql = sql.replace(f":'{name}'", "'" + literal + "'").replace(f":{name}", literal)
        # One fixed "now" so that a run before and one after a migration can be compared.
        sql = sql.replace("now()", "CAST('2026-11-26 13:00:00+00' AS timestamptz)")
        out.append(sql.strip().rstrip(";"))
    return out


def run_documented(conn: Any) -> dict[int, Any]:
    """Each documented query's rows (or the error it raised, as text, for a dialect it was not written for)."""
    results: dict[int, Any] = {}
    for i, sql in enumerate(documented_queries()):
        try:
            with conn.begin_nested():
                results[i] = [tuple(r) for r in conn.exec_driver_sql(sql).all()]
        except Exception as exc:  # noqa: BLE001 - a PostgreSQL-only query on SQLite
            results[i] = f"error: {type(exc).__name__}"
    return results
