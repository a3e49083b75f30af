"""Which names the ledger knows (pipelines, their topics, a stored policy), and whether it answers at all.

``operate.known`` refuses a name the ledger does not know through these (a typo must never read as a
green answer); ``operate.reads.ping`` asks the ledger to answer. The caller's scope (``operate.visibility``)
is applied by the caller: these read every pipeline.
"""

from __future__ import annotations

from sqlalchemy import select, text, union
from sqlalchemy.engine import Connection

from offset_ledger.ledger.tables import pipeline_policies, positions, runs


def ping(conn: Connection) -> None:
    """One round trip (the driver's error when the database does not answer)."""
    conn.execute(text("SELECT 1"))


def pipeline_names(conn: Connection) -> list[str]:
    """Every pipeline the ledger has positions or runs of, sorted."""
    stmt = union(select(positions.c.pipeline).distinct(), select(runs.c.pipeline).distinct())
    return sorted(r[0] for r in conn.execute(stmt))


def has_stored_policy(conn: Connection, pipeline: str) -> bool:
    """Whether a policy is stored for ``pipeline`` (it may be set before the pipeline's first run)."""
    return conn.execute(select(pipeline_policies.c.pipeline)
                        .where(pipeline_policies.c.pipeline == pipeline).limit(1)).first() is not None


def pipeline_topics(conn: Connection, pipeline: str, consumer_group: str) -> list[str]:
    """The topics the pipeline has a position on under ``consumer_group``, sorted."""
    stmt = (select(positions.c.topic).distinct()
            .where(positions.c.pipeline == pipeline, positions.c.consumer_group == consumer_group))
    return sorted(r[0] for r in conn.execute(stmt))
