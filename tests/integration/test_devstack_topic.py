"""``python -m offset_ledger.devstack topic NAME --produce N`` (the README's quick start) on a real broker:
the topic is there with its partitions and the log holds exactly the records produced."""

from __future__ import annotations

import uuid

import pytest

from offset_ledger import devstack
from offset_ledger.devstack.__main__ import make_topic


def test_topic_creates_and_produces(kafka) -> None:  # type: ignore[no-untyped-def]
    name = f"quick-{uuid.uuid4().hex[:8]}"
    said = make_topic(kafka.bootstrap_servers, name, None, 1000)
    assert said == f"created topic {name} (2 partitions); produced 1,000 records"
    assert sum(kafka.end_offsets(name).values()) == 1000 and len(kafka.end_offsets(name)) == 2
    assert make_topic(kafka.bootstrap_servers, name, None, 500).startswith(f"topic {name} exists")
    assert sum(kafka.end_offsets(name).values()) == 1500
    with pytest.raises(devstack.StackError):
        make_topic(kafka.bootstrap_servers, name, 4, 0)  # --partitions names a new topic's only
    kafka.delete_topics([name])
