"""A windowed pipeline's very first start: nothing was processed, so there is nothing to rewind.

Found by docs/restart.md's windowed example (tests/integration/test_docs_examples.py): the same
``start_from_ledger(..., window=...)`` call a job makes on every deploy was refused on its first
run ("the ledger has no watermark for its checkpoint") although no checkpoint existed yet.
"""

from __future__ import annotations

from pathlib import Path

from offset_ledger import start_from_ledger
from offset_ledger.errors import StatefulRestartRefused
from tests.integration.kafka_helper import KafkaHelper


def test_first_run_with_window_starts_like_any_first_run(kafka: KafkaHelper, pg_dsn: str, tmp_path: Path) -> None:
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [f"v{i}" for i in range(10)])
    plan = start_from_ledger("clicks", [topic], bootstrap_servers=kafka.bootstrap_servers, dsn=pg_dsn,
                             checkpoint_root=str(tmp_path / "gens"), app_version="1", window="10 minutes",
                             watermark_delay="10 seconds")
    assert plan.fresh_checkpoint and plan.generation == 1
    assert set(plan.starting_offsets) == {topic}
    assert plan.event_time_floor is None
    assert not [f for f in plan.findings if f.kind == "state_rewind"]


def test_a_known_pipeline_without_recorded_watermarks_is_still_refused(kafka: KafkaHelper, pg_dsn: str,
                                                                        tmp_path: Path) -> None:
    import pytest

    topic = kafka.create_topic(partitions=1)
    kafka.produce(topic, ["a", "b"])
    common = dict(bootstrap_servers=kafka.bootstrap_servers, dsn=pg_dsn, checkpoint_root=str(tmp_path / "gens"))
    start_from_ledger("clicks", [topic], app_version="1", **common)  # first run: positions exist now
    with pytest.raises(StatefulRestartRefused, match="no watermark"):
        start_from_ledger("clicks", [topic], app_version="2", window="10 minutes", **common)
