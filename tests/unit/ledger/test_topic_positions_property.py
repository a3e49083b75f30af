"""Positions as a row per topic (0024) hold what the per-partition layout held, whatever happened.

The oracle is the per-partition layout itself, run by its own rules: the release before 0024
(``tests.previous_release.PER_PARTITION_POSITIONS``), extracted and imported beside this tree under
another package name. Both record the same random history on SQLite ledgers of their own (batches
of one or two queries over random subsets of partitions, partitions added mid-run, regressions,
resets, restarts and failovers that drop partitions, a defaulted group adopted) and after every step
the positions this tree reads (``v_positions``, the restart's ``current_positions``) equal the rows the
previous release's ``positions`` table holds.
"""

from __future__ import annotations

import importlib
import re
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.previous_release import PER_PARTITION_POSITIONS, extract

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)
TOPICS = ("t", "u")
OLD = "offset_ledger_per_partition"


@pytest.fixture(scope="module")
def old_release(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The previous release's package, importable as ``offset_ledger_per_partition``."""
    root = extract(tmp_path_factory.mktemp("previous"), PER_PARTITION_POSITIONS)
    package = root / "offset_ledger"
    for path in package.rglob("*.py"):
        text = path.read_text()
        path.write_text(re.sub(r"\boffset_ledger(?=[.\s])", OLD, text))
    package.rename(root / OLD)
    (root / OLD / "migrations").symlink_to(root / "migrations")  # migrations_dir(): beside or inside
    sys.path.insert(0, str(root))
    return OLD


def _mods(package: str) -> dict[str, ModuleType]:
    names = ("ledger.engine", "ledger.tables", "ledger.recorder", "ledger.records", "ledger.reset_store",
             "ledger.generations", "ledger.queries", "rules.model", "rules.resets")
    return {n.split(".")[1]: importlib.import_module(f"{package}.{n}") for n in names}


class Ledger:
    """One SQLite ledger and the release writing it."""

    def __init__(self, package: str, path: Path) -> None:
        self.m = _mods(package)
        self.engine = self.m["engine"].make_engine(f"sqlite:///{path}")
        self.m["tables"].metadata.create_all(self.engine)
        self.recorder = self.m["recorder"].Recorder(self.engine)

    def start(self, group: str, query: str, run: str, at: datetime) -> None:
        rec = self.m["records"]
        with self.engine.connect() as conn:  # a run on the current generation's checkpoint (if any) may move
            current = self.m["generations"].current_generation(conn, "p", group)
        self.recorder.record([rec.RunStart("p", group, query, run, "p", at,
                                           checkpoint_location=None if current is None else current.location)],
                             now=at)

    def batch(self, group: str, query: str, run: str, n: int, ranges: list[tuple[str, int, int | None, int]],
              at: datetime) -> list[str]:
        model, rec = self.m["model"], self.m["records"]
        sources = []
        for i, topic in enumerate(TOPICS):
            mine = tuple(model.PartitionRange(t, p, f, u) for t, p, f, u in ranges if t == topic)
            if mine:
                sources.append(model.SourceProgress(i, f"KafkaV2[Subscribe[{topic}]]", mine, 1))
        out = self.recorder.record([rec.BatchRecord("p", group, model.BatchOffsets(
            query, run, "p", n, at, len(sources), tuple(sources)))], now=at)
        return sorted(f.kind for f in out.findings)

    def reset(self, group: str, targets: dict[tuple[str, int], int], at: datetime) -> None:
        resets = self.m["resets"]

        def planner(positions: list[Any]) -> Any:
            now = {(p.topic, p.partition): p.next_offset for p in positions}
            return resets.ResetPlan("offsets", "refuse", tuple(
                resets.PartitionReset(t, p, now.get((t, p)), o, o, 0, 10**9)
                for (t, p), o in sorted(targets.items())))

        self.m["reset_store"].record_reset(self.engine, planner, pipeline="p", consumer_group=group, actor="a",
                                           reason=None, dry_run=False, force=True, now=at)

    def restart(self, group: str, resolved: dict[tuple[str, int], int], dropped: list[tuple[str, int]],
                at: datetime, defaulted: bool) -> None:
        offsets: dict[str, dict[str, int]] = {}
        for (t, p), o in resolved.items():
            offsets.setdefault(t, {})[str(p)] = o
        new = dict(pipeline="p", consumer_group=group, checkpoint_root="/ck", app_version="1", reason="failover",
                   starting_offsets=offsets, resolved_offsets=offsets, dropped_partitions=dropped, now=at,
                   group_defaulted=defaulted)
        gens = self.m["generations"]
        with self.engine.begin() as conn:  # the release before issue 51 took the fields as keywords
            if hasattr(gens, "NewGeneration"):
                gens.create_generation(conn, gens.NewGeneration(**new))
            else:
                gens.create_generation(conn, **new)

    def adopt(self, at: datetime) -> None:
        with self.engine.begin() as conn:
            self.m["generations"].adopt_defaulted_group(conn, "p", "guessed", "p", at)

    def positions(self, source: str) -> list[tuple[Any, ...]]:
        from sqlalchemy import text

        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(
                f'SELECT consumer_group, topic, "partition", next_offset, batch_id, reset_id, generation_id, '
                f'query_id, updated_at FROM {source} ORDER BY 1, 2, 3'))]

    def restart_view(self) -> list[tuple[str, str, int, int]]:
        with self.engine.connect() as conn:
            return sorted((g, p.topic, p.partition, p.next_offset) for g in ("p", "guessed")
                          for p in self.m["queries"].current_positions(conn, "p", g))

    def close(self) -> None:
        self.recorder.close()
        self.engine.dispose()


_PARTITIONS = [(t, p) for t in TOPICS for p in range(4)]
_step = st.one_of(
    # a batch of query q1 or q2 over any subset of partitions, moving each forward (or back: a regression)
    st.tuples(st.just("batch"), st.sampled_from(["q1", "q2"]),
              st.lists(st.tuples(st.sampled_from(_PARTITIONS), st.integers(-3, 6)), min_size=1, max_size=8,
                       unique_by=lambda x: x[0])),
    st.tuples(st.just("new_run"), st.sampled_from(["q1", "q2"]), st.none()),
    st.tuples(st.just("reset"), st.none(),
              st.dictionaries(st.sampled_from(_PARTITIONS), st.integers(0, 40), min_size=1, max_size=4)),
    st.tuples(st.just("restart"), st.booleans(),
              st.tuples(st.dictionaries(st.sampled_from(_PARTITIONS), st.integers(0, 40), max_size=5),
                        st.lists(st.sampled_from(_PARTITIONS), max_size=2, unique=True))),
    st.tuples(st.just("adopt"), st.none(), st.none()),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_step, min_size=1, max_size=14))
# a batch, a restart placing one partition (its generation), a batch moving both: the generation stays
@example([("batch", "q1", [(("t", 0), 3), (("t", 1), 2)]), ("restart", False, ({("t", 0): 2}, [])),
          ("batch", "q1", [(("t", 0), 3), (("t", 1), 1)])])
def test_positions_per_topic_equal_the_per_partition_layout(old_release: str, tmp_path_factory: pytest.TempPathFactory,
                                                             steps: list[tuple[str, Any, Any]]) -> None:
    where = tmp_path_factory.mktemp("pos")
    new, old = Ledger("offset_ledger", where / "new.db"), Ledger(old_release, where / "old.db")
    runs = {"q1": 0, "q2": 0}
    batch_ids = {"q1": 0, "q2": 0}
    ends: dict[tuple[str, str, int], int] = {}
    try:
        for ledger in (new, old):
            for q in runs:
                ledger.start("p", q, f"{q}-r0", T0)
        for i, (kind, arg, data) in enumerate(steps):
            at = T0 + timedelta(seconds=10 * (i + 1))
            found: dict[bool, list[str]] = {}  # the findings each release's recorder reported
            for ledger in (new, old):
                if kind == "batch":
                    q = arg
                    ranges = []
                    for (t, p), step in data:
                        start = ends.get((q, t, p))
                        ranges.append((t, p, start, max(0, (start or 0) + step)))
                    found[ledger is new] = ledger.batch("p", q, f"{q}-r{runs[q]}", batch_ids[q], ranges, at)
                elif kind == "new_run":
                    ledger.start("p", arg, f"{arg}-r{runs[arg] + 1}", at)
                elif kind == "reset":
                    ledger.reset("p", data, at)
                elif kind == "restart":
                    resolved, dropped = data
                    # defaulted: the helper guessed the group ("guessed"), which an adoption hands to "p"
                    ledger.restart("guessed" if arg else "p", resolved, dropped, at, defaulted=arg)
                    if not arg:  # the pipeline restarts on the new generation: its queries' next runs
                        for q in runs:
                            ledger.start("p", q, f"{q}-r{runs[q] + 1}", at)
                else:
                    ledger.adopt(at)
            if kind == "batch":
                batch_ids[arg] += 1
                for t, p, start, until in ranges:
                    ends[(arg, t, p)] = until
            elif kind == "new_run":
                runs[arg] += 1
            elif kind == "restart" and not arg:
                runs = {q: n + 1 for q, n in runs.items()}
            assert new.positions("v_positions") == old.positions("positions"), (i, kind)
            assert new.restart_view() == old.restart_view()
            assert found.get(True) == found.get(False), (i, kind)
    finally:
        new.close()
        old.close()
