"""Prune keeps the whole history of each pipeline's live windowed query: the one-statement form
(``prune.live_stateful_queries``) names the same queries as ``queries.live_query_id`` asked group by
group, on random ledgers of groups, generations, runs with and without a generation, batch times out of
id order and watermarks (SQLite here; ``tests/integration/test_prune_partitions.py`` runs it on PostgreSQL)."""

from __future__ import annotations

import random
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import func, insert, select
from sqlalchemy.engine import Connection, Engine

from offset_ledger.ledger.engine import make_engine, upgrade
from offset_ledger.ledger.prune import live_stateful_queries
from offset_ledger.ledger.queries import live_query_id
from offset_ledger.ledger.tables import batches, checkpoint_generations, runs

T0 = datetime(2026, 11, 27, tzinfo=timezone.utc)


def live_stateful_queries_per_group(conn: Connection, pipeline: str | None = None) -> set[str]:
    """The reference: each group's live query asked through ``queries.live_query_id``, kept when it
    has a batch with a watermark."""
    live: set[str] = set()
    groups = conn.execute(select(batches.c.pipeline, batches.c.consumer_group).distinct().where(
        *([batches.c.pipeline == pipeline] if pipeline is not None else []))).all()
    for p, g in groups:
        generation_id = conn.execute(select(func.max(checkpoint_generations.c.id)).where(
            checkpoint_generations.c.pipeline == p, checkpoint_generations.c.consumer_group == g)).scalar()
        query_id = live_query_id(conn, p, g, generation_id)
        if query_id is not None and conn.execute(select(batches.c.id).where(
                batches.c.query_id == query_id, batches.c.watermark.is_not(None)).limit(1)).first() is not None:
            live.add(query_id)
    return live


def random_ledger(engine: Engine, seed: int) -> None:
    """Groups (two may share a pipeline), their generations, queries, runs on a generation or none, batches."""
    rnd = random.Random(seed)
    times = rnd.sample(range(10_000), 500)  # distinct: the newest batch of a group is one batch
    with engine.begin() as conn:
        for g in range(rnd.randint(1, 6)):
            pipeline, group = f"p{g % 3}", f"g{g}"
            gens = [conn.execute(insert(checkpoint_generations).values(
                pipeline=pipeline, consumer_group=group, generation=n, checkpoint_root="/c", location=f"/c/{n}",
                reason="requested", created_at=T0).returning(checkpoint_generations.c.id)).scalar_one()
                for n in range(rnd.randint(0, 3))]
            for q in range(rnd.randint(1, 4)):
                query = f"q-{g}-{q}"
                for r in range(rnd.randint(1, 2)):
                    run = f"r-{g}-{q}-{r}"
                    conn.execute(insert(runs).values(
                        run_id=run, query_id=query, pipeline=pipeline, consumer_group=group, started_at=T0,
                        generation_id=rnd.choice([None, *gens])))
                    for b in range(rnd.randint(0, 4)):
                        conn.execute(insert(batches).values(
                            pipeline=pipeline, consumer_group=group, query_id=query, run_id=run,
                            batch_id=r * 10 + b, batch_time=T0 + timedelta(seconds=times.pop()),
                            recorded_at=T0, input_rows=0,
                            watermark=T0 if rnd.random() < 0.3 else None))


def test_the_live_windowed_queries_are_those_asked_group_by_group(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    migrated = make_engine(f"sqlite:///{empty}")
    upgrade(migrated)  # once: each seed starts from a copy of the file
    migrated.dispose()
    found = []
    for seed in range(40):
        shutil.copy(empty, tmp_path / f"ledger{seed}.db")
        engine = make_engine(f"sqlite:///{tmp_path / f'ledger{seed}.db'}")
        try:
            random_ledger(engine, seed)
            with engine.connect() as conn:
                for pipeline in (None, "p0", "p1"):
                    one = live_stateful_queries(conn, pipeline)
                    assert one == live_stateful_queries_per_group(conn, pipeline), seed
                found.append(len(live_stateful_queries(conn)))
        finally:
            engine.dispose()
    assert min(found) == 0 and max(found) >= 2, found  # the comparison is not vacuous
