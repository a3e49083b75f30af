"""The Grafana dashboard (issue 52): generated from code (``offset_ledger.operate.alert_dashboard``) with
grafana-foundation-sdk, checked in, and valid in the library's own model."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

import offset_ledger.api.metrics as metrics_module
from offset_ledger.operate.alert_rules import SHIPPED, rules_document

DASHBOARD = SHIPPED.with_name("grafana-dashboard.json")


@pytest.fixture(scope="module")
def sdk() -> None:
    try:
        import grafana_foundation_sdk  # noqa: F401
    except ImportError:
        message = "grafana-foundation-sdk missing: pip install -e '.[dashboards]' -c constraints.txt"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def _exprs(board: dict) -> list[str]:  # type: ignore[type-arg]
    return [t["expr"] for p in board["panels"] for t in p.get("targets", [])]


def test_the_checked_in_dashboard_is_what_the_code_generates(sdk: None) -> None:
    from offset_ledger.operate.alert_dashboard import render

    assert DASHBOARD.read_text(encoding="utf-8") == render(), \
        "regenerate: python -m offset_ledger.operate.alert_dashboard > " \
        "offset_ledger/operate/grafana-dashboard.json"


def test_the_dashboard_is_valid_in_the_librarys_model(sdk: None) -> None:
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    data = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    model = Dashboard.from_json(data)
    # Every field survives the model's decoding and encoding: nothing the model does not know.
    assert json.loads(json.dumps(model, cls=JSONEncoder)) == data
    assert model.uid == "offset-ledger" and model.templating.list_val is not None
    names = [v.name for v in model.templating.list_val]
    assert names == ["datasource", "pipeline"]
    titles = {p["title"] for p in data["panels"]}
    assert {"Running state", "Lag (records)", "Lag (seconds)", "Retention headroom", "Batches per 5 minutes",
            "Findings by kind", "Ledger health"} <= titles
    # Templated by pipeline: every pipeline query is cut to the chosen pipelines.
    for expr in _exprs(data):
        assert 'pipeline=~"$pipeline"' in expr or expr == "offset_ledger_kafka_up", expr


def test_the_dashboard_and_the_rules_use_only_series_metrics_renders() -> None:
    rendered = set(re.findall(r'"(offset_ledger_[a-z_]+)"', Path(metrics_module.__file__).read_text()))
    rendered |= {f"offset_ledger_listener_{c}_total" for c in ("queued", "written", "retried", "spilled", "failed")}
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    used = set(re.findall(r"offset_ledger_[a-z_]+", " ".join(_exprs(board))))
    rules = [r["expr"] for g in rules_document()["groups"] for r in g["rules"]]
    used |= set(re.findall(r"(?<!:)offset_ledger_[a-z_]+", " ".join(rules)))
    assert used and used <= rendered, used - rendered
    assert SHIPPED.exists() and DASHBOARD.exists()
