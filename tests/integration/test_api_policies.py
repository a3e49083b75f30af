"""Stored policies over real HTTP on Postgres, applied by the next restart against real Kafka.

An operator sets ``onDataLoss`` through the API (an operate token, audited with its name); the
next ``Pipeline.plan`` applies it without the code saying anything, and an argument in code still
overrides it for that call.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from offset_ledger import Pipeline
from offset_ledger.api.tokens import ApiToken
from offset_ledger.errors import DataLossError
from tests.integration.test_api import serving
from tests.ops_seed import seed_pipeline

OPERATE = ApiToken("release-bot", "operate", b"operate-secret-0123456789")
READ = ApiToken("dashboard", "read", b"read-secret-0123456789ab")


def _auth(token: ApiToken) -> dict[str, str]:
    return {"Authorization": f"Bearer {token.secret.decode()}"}


def test_a_policy_set_over_http_is_audited_and_applied_by_the_next_restart(
        ledger, pg_dsn: str, kafka, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [f"v{i}" for i in range(40)])  # 20 per partition
    seed_pipeline(ledger, "orders", {topic: {0: 5, 1: 5}})
    kafka.delete_records(topic, {0: 8})  # retention passed the ledger's position on partition 0
    orders = Pipeline("orders", topics=[topic], dsn=pg_dsn, bootstrap_servers=kafka.bootstrap_servers,
                      app_version="1")
    root = str(tmp_path / "checkpoints")
    with pytest.raises(DataLossError):  # the default policy: fail
        orders.plan(checkpoint_root=root)

    url = "/api/v1/pipelines/orders/policies"
    with serving(pg_dsn, kafka.bootstrap_servers, tokens=[OPERATE, READ]) as srv, \
            httpx.Client(base_url=srv.url) as http:
        body = {"policies": {"onDataLoss": "earliest"}, "reason": "retention is short; resume at log-start"}
        assert http.put(url, json=body, headers=_auth(READ)).status_code == 403
        bad = http.put(url, json={"policies": {"onDataLoss": "skip"}, "reason": "r"}, headers=_auth(OPERATE))
        assert bad.status_code == 400 and "policies.onDataLoss" in bad.json()["message"]
        assert http.get(url, headers=_auth(READ)).json()["lastChange"] is None  # nothing written so far
        done = http.put(url, json=body, headers=_auth(OPERATE))
        assert done.status_code == 200, done.text
        shown = http.get(url, headers=_auth(READ)).json()
        assert shown["policies"] == {"onDataLoss": "earliest"} and shown["effective"]["onDataLoss"] == "earliest"
        assert (shown["lastChange"]["actor"], shown["lastChange"]["reason"]) == (
            "release-bot", "retention is short; resume at log-start")
        history = http.get(url + "/history", headers=_auth(READ)).json()["changes"]
        assert [c["actor"] for c in history] == ["release-bot"]

    # An argument in code overrides the stored policy for that call (and nothing is written).
    with pytest.raises(DataLossError):
        orders.plan(checkpoint_root=root, on_data_loss="fail")
    plan = orders.plan(checkpoint_root=root)  # the stored policy, with no argument in code
    assert plan.policies["on_data_loss"] == "earliest"
    assert plan.starting_offsets == {topic: {"0": 8, "1": 5}}
    assert [f.kind for f in plan.findings] == ["data_loss"]
