"""Refuse what does not exist: every face names a pipeline, group or topic through these checks.

A typo must never read as a green answer ("0 partitions, every record read exactly once"): a name
the ledger does not know is an error that says what the ledger does know (issue 34).
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy.engine import Connection

from offset_ledger.errors import UnknownConsumerGroup, UnknownPipeline, UnknownTopic
from offset_ledger.ledger import catalog, queries
from offset_ledger.operate.visibility import current_scope


def pipeline_names(conn: Connection) -> list[str]:
    """Every pipeline the ledger has positions or runs of and the caller may see, sorted."""
    return current_scope().visible(catalog.pipeline_names(conn))


def require_visible(conn: Connection, pipeline: str) -> None:
    """UnknownPipeline, exactly as for a name the ledger does not know, when the caller's scope hides
    ``pipeline`` (a 403 would confirm that the name exists)."""
    if not current_scope().allows(pipeline):
        raise UnknownPipeline(pipeline, pipeline_names(conn))


def require_pipeline(conn: Connection, pipeline: str, *, with_policies: bool = False) -> list[str]:
    """The pipeline's consumer groups; UnknownPipeline (naming the known ones) when it has none.

    ``with_policies``: a pipeline whose only trace is a stored policy (set before its first run) counts.
    Outside the caller's scope (``operate.visibility``) no pipeline is known.
    """
    require_visible(conn, pipeline)
    groups = queries.consumer_groups(conn, pipeline)
    if groups:
        return groups
    if with_policies and catalog.has_stored_policy(conn, pipeline):
        return []
    raise UnknownPipeline(pipeline, pipeline_names(conn))


def require_group(conn: Connection, pipeline: str, consumer_group: str) -> None:
    """UnknownConsumerGroup (naming the pipeline's groups) unless the pipeline ran under ``consumer_group``."""
    groups = require_pipeline(conn, pipeline)
    if consumer_group not in groups:
        raise UnknownConsumerGroup(pipeline, consumer_group, groups)


def pipeline_topics(conn: Connection, pipeline: str, consumer_group: str) -> list[str]:
    """The topics the pipeline has a position on under ``consumer_group``, sorted."""
    return catalog.pipeline_topics(conn, pipeline, consumer_group)


def require_topics(conn: Connection, pipeline: str, consumer_group: str, topics: Iterable[str]) -> None:
    """UnknownTopic (naming the topics it reads) for the first of ``topics`` the pipeline never read."""
    wanted = list(topics)
    if not wanted:
        return
    known = pipeline_topics(conn, pipeline, consumer_group)
    for topic in wanted:
        if topic not in known:
            raise UnknownTopic(topic, pipeline, known)
