"""Topic names by Kafka's rule: "." and ".." are refused as input (Kafka answers InvalidTopicError,
which the API turned into a 503; found by test_api.py's schemathesis run)."""

from __future__ import annotations

import re

import pytest

from offset_ledger.errors import InvalidInput
from offset_ledger.operate.inputs import TOPIC_PATTERN, check_topic


@pytest.mark.parametrize("name", ["a", "_", "-", "a.", "_.", ".a", "a-", "..a", "...", "a.b", "x" * 249, "orders"])
def test_legal_topic_names(name: str) -> None:
    assert check_topic(name) == name and re.match(TOPIC_PATTERN, name)


@pytest.mark.parametrize("name", [".", "..", "", "x" * 250, "a b", "ä", "a/b"])
def test_illegal_topic_names(name: str) -> None:
    with pytest.raises(InvalidInput):
        check_topic(name)
    assert not re.match(TOPIC_PATTERN, name)


def test_the_api_answers_400_for_dot_topics() -> None:
    from fastapi.testclient import TestClient

    from offset_ledger.api import create_app
    from offset_ledger.ledger.engine import make_engine
    from offset_ledger.operate.operations import Operations

    client = TestClient(create_app(operations=Operations(make_engine("sqlite://")), api_token=""),
                        base_url="http://localhost")
    for path in ("/v1/getTopicDetails?topicName=.", "/v1/getTopicDetails?topicName=..", "/api/v1/topics/%2E%2E"):
        r = client.get(path)
        assert r.status_code in (400, 422) and r.json()["error"] == "RequestValidationError", path
