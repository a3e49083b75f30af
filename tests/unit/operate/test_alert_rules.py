"""The alert rules (``offset_ledger.operate.alert_rules``) checked and unit-tested by Prometheus' own ``promtool``
(Debian's ``prometheus`` package): every alert fires on its case and stays silent on its look-alike, among
them a slow trigger (running throughout, no batch for 5 minutes: no crash alert) and a normal batch's lag
spike (no lag alert). The ``promtool test rules`` file is generated here from the cases below, so each
expected alert's annotations are the rule's own templates expanded for its labels.

Without promtool the tests skip with the reason, and fail under CI (``.ci/run`` installs it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from offset_ledger.operate.alert_rules import SHIPPED, Thresholds, parse_thresholds, render_yaml, rules_document
from offset_ledger.errors import OffsetLedgerError


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = "promtool missing: apt-get install prometheus"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return found


def _labels(**kw: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in kw.items()) + "}"


A = {"pipeline": "orders", "consumer_group": "orders"}
B = {"pipeline": "payments", "consumer_group": "team-b"}
TP0 = {"topic": "t", "partition": "0"}
TP1 = {"topic": "t", "partition": "1"}
L1 = {"listener_id": "l-1", "pipeline": "orders", "consumer_group": "orders", "host": "h1"}
L2 = {"listener_id": "l-2", "pipeline": "payments", "consumer_group": "team-b", "host": "h2"}


def _humanize_duration(v: float) -> str:
    """Prometheus' humanizeDuration for v >= 1 (what the cases below produce)."""
    seconds = int(v)
    d, h, m, s = seconds // 86400, seconds // 3600 % 24, seconds // 60 % 60, seconds % 60
    if d:
        return f"{d}d {h}h {m}m {s}s"
    if h:
        return f"{h}h {m}m {s}s"
    if m:
        return f"{m}m {s}s"
    return f"{v:.4g}s"


def _expand(template: str, labels: dict[str, str], value: float | None) -> str:
    out = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), template)
    return re.sub(r"\{\{ \$value \| humanizeDuration \}\}", lambda m: _humanize_duration(value or 0), out)


def _alert(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for g in doc["groups"] for r in g["rules"] if r.get("alert") == name)


# (series, values) fed to promtool, and per alert: (eval time, [(labels, $value)] expected firing).
# Every alert has a case that fires and a look-alike that must not.
SERIES: list[tuple[str, str]] = [
    # Headroom: A-0 below critical, A-1 below warn only; B-0 plenty; B-1 nothing unread can be deleted.
    ("offset_ledger_retention_headroom_seconds" + _labels(**A, **TP0), "1800x30"),
    ("offset_ledger_retention_headroom_seconds" + _labels(**A, **TP1), "10000x30"),
    ("offset_ledger_retention_headroom_seconds" + _labels(**B, **TP0), "50000x30"),
    ("offset_ledger_retention_headroom_seconds" + _labels(**B, **TP1), " ".join(["+Inf"] * 31)),
    # Records lost: A-0 first seen at 20 m already 3 (no increase() possible); A-1 grows at 25 m;
    # B-0 a loss seen long before, steady at 5.
    ("offset_ledger_records_lost_total" + _labels(**A, **TP0), "_x19 3x30"),
    ("offset_ledger_records_lost_total" + _labels(**A, **TP1), "1x24 4x25"),
    ("offset_ledger_records_lost_total" + _labels(**B, **TP0), "5x50"),
    # A: SIGKILLed at 2 m (stale from then). B: a slow trigger: running throughout, no batch for 5 minutes
    # (seconds since the last batch climbs to 300 and more), its heartbeat a few seconds old.
    *[("offset_ledger_pipeline_state" + _labels(**A, state=s), v) for s, v in (
        ("running", "1 1 0x20"), ("stale", "0 0 1x20"), ("stopped", "0x22"), ("uncertain", "0x22"))],
    *[("offset_ledger_pipeline_state" + _labels(**B, state=s), v) for s, v in (
        ("running", "1x22"), ("stale", "0x22"), ("stopped", "0x22"), ("uncertain", "0x22"))],
    ("offset_ledger_seconds_since_last_batch" + _labels(**B), "0+60x22"),
    ("offset_ledger_driver_heartbeat_age_seconds" + _labels(**B), "3x22"),
    # Lag in seconds: A-0 behind 1000 s throughout; B-0 a normal batch cycle (0, then 1200 s just before a
    # 2-minute trigger's batch catches up, again and again); B-1 behind only for the last 5 minutes.
    ("offset_ledger_lag_seconds" + _labels(**A, **TP0), "1000x30"),
    ("offset_ledger_lag_seconds" + _labels(**B, **TP0), "0 1200 " * 15),
    ("offset_ledger_lag_seconds" + _labels(topic="u", partition="1", **B), "0x24 2000x5"),
    # Listener: l-1 cannot write the ledger from 3 m (failures, error reported, events spilled);
    # l-2 healthy, writing, with spills long ago.
    ("offset_ledger_listener_failed_total" + _labels(**L1), "0 0 0 1+1x20"),
    ("offset_ledger_listener_healthy" + _labels(**L1), "1 1 1 0x20"),
    ("offset_ledger_listener_spilled_total" + _labels(**L1), "0 0 0 5+5x20"),
    ("offset_ledger_listener_failed_total" + _labels(**L2), "2x23"),
    ("offset_ledger_listener_healthy" + _labels(**L2), "1x23"),
    ("offset_ledger_listener_spilled_total" + _labels(**L2), "7x23"),
    ("offset_ledger_listener_written_total" + _labels(**L2), "0+10x23"),
    # Findings: A records a gap at 20 m (a new series) and a regression grows at 25 m; B's old gap is steady,
    # and B's foreign-run findings (not a stretch) grow.
    ("offset_ledger_findings" + _labels(**A, kind="gap"), "_x19 1x30"),
    ("offset_ledger_findings" + _labels(**A, kind="regression"), "1x24 2x25"),
    ("offset_ledger_findings" + _labels(**B, kind="gap"), "4x50"),
    ("offset_ledger_findings" + _labels(**B, kind="foreign_run"), "0+1x50"),
    # Resets: A has one pending; B none. A's newest executed reset at t=120 s (Unix time in the test clock).
    ("offset_ledger_resets_pending" + _labels(**A), "1x200"),
    ("offset_ledger_resets_pending" + _labels(**B), "0x200"),
    ("offset_ledger_last_reset_timestamp_seconds" + _labels(**A), "120x200"),
]

EXPECT: dict[str, list[tuple[str, list[tuple[dict[str, str], float | None]]]]] = {
    "OffsetLedgerRetentionHeadroomCritical": [
        ("3m", []),  # below for 3 of the 5 minutes
        ("10m", [({**A, **TP0}, 1800)]),
    ],
    "OffsetLedgerRetentionHeadroomLow": [
        ("3m", []),
        ("10m", [({**A, **TP1}, 10000)]),  # A-0 is critical, not also warned
    ],
    "OffsetLedgerRecordsLost": [
        ("18m", []),  # B-0's and A-1's losses were seen 15 minutes before: no page
        ("21m", [({**A, **TP0}, 3)]),
        ("26m", [({**A, **TP0}, 3), ({**A, **TP1}, 3)]),
        ("45m", []),  # no loss within the window
    ],
    "OffsetLedgerUnexplainedStretch": [
        ("18m", []),  # B's gap was seen long before; foreign runs are no stretch
        ("21m", [({**A, "kind": "gap"}, 1)]),
        ("26m", [({**A, "kind": "gap"}, 1), ({**A, "kind": "regression"}, 1)]),
        ("45m", []),
    ],
    "OffsetLedgerPipelinePresumedCrashed": [
        ("2m", []),  # stale, but for less than crash_for
        ("5m", [({**A, "state": "stale"}, 1)]),
        ("20m", [({**A, "state": "stale"}, 1)]),  # B, the slow trigger, never
    ],
    "OffsetLedgerLagHigh": [
        ("5m", []),  # A-0 behind for only 5 of the 10 minutes so far
        ("12m", [({**A, "topic": "t"}, 1000)]),
        ("28m", [({**A, "topic": "t"}, 1000)]),  # B-0's spikes and B-1's last 5 minutes: never
    ],
    "OffsetLedgerLedgerWritesFailing": [
        ("5m", []),  # failing for 2 of the 5 minutes
        ("10m", [(L1, 1)]),
    ],
    "OffsetLedgerSpoolGrowing": [
        ("2m", []),
        ("5m", [(L1, None)]),
    ],
    "OffsetLedgerResetPending": [
        ("1m", [(A, 1)]),
    ],
    "OffsetLedgerResetExecuted": [
        ("10m", [(A, None)]),
        ("2h", []),  # more than an hour ago
    ],
}


def rule_tests(doc: dict[str, Any], rules_file: str) -> dict[str, Any]:
    cases = []
    for name, evals in EXPECT.items():
        rule = _alert(doc, name)
        for at, firing in evals:
            cases.append({"eval_time": at, "alertname": name, "exp_alerts": [
                {"exp_labels": {**labels, "severity": rule["labels"]["severity"]},
                 "exp_annotations": {k: _expand(v, labels, value) for k, v in rule["annotations"].items()}}
                for labels, value in firing]})
    return {"rule_files": [rules_file], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": s, "values": v.strip()} for s, v in SERIES],
        "alert_rule_test": cases,
        "promql_expr_test": [
            {"expr": "offset_ledger:lag_seconds:max", "eval_time": "3m", "exp_samples": [
                {"labels": "offset_ledger:lag_seconds:max" + _labels(**A, topic="t"), "value": 1000},
                {"labels": "offset_ledger:lag_seconds:max" + _labels(**B, topic="t"), "value": 1200},
                {"labels": "offset_ledger:lag_seconds:max" + _labels(**B, topic="u"), "value": 0}]},
            {"expr": "offset_ledger:records_lost:sum", "eval_time": "26m", "exp_samples": [
                {"labels": "offset_ledger:records_lost:sum" + _labels(**A, topic="t"), "value": 7},
                {"labels": "offset_ledger:records_lost:sum" + _labels(**B, topic="t"), "value": 5}]},
        ],
    }]}


def _run(tmp_path: Path, doc: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    tool = promtool()
    (tmp_path / "rules.yml").write_text(render_yaml(doc), encoding="utf-8")
    # JSON is YAML: promtool reads the generated test file as is.
    (tmp_path / "rules_test.yml").write_text(json.dumps(rule_tests(doc, "rules.yml"), indent=1), encoding="utf-8")
    check = subprocess.run([tool, "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    return subprocess.run([tool, "test", "rules", str(tmp_path / "rules_test.yml")], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)


def test_every_alert_fires_on_its_case_and_not_on_its_look_alike(tmp_path: Path) -> None:
    doc = rules_document()
    assert {r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r} == set(EXPECT)
    got = _run(tmp_path, doc)
    assert got.returncode == 0, got.stdout + got.stderr


def test_the_tests_can_fail(tmp_path: Path) -> None:
    # The crash alert written as "no batch for 5 minutes" pages the slow trigger: promtool says so.
    doc = rules_document()
    _alert(doc, "OffsetLedgerPipelinePresumedCrashed")["expr"] = "offset_ledger_seconds_since_last_batch > 300"
    got = _run(tmp_path, doc)
    assert got.returncode != 0 and "OffsetLedgerPipelinePresumedCrashed" in got.stdout + got.stderr
    # The lag alert on a single sample pages the normal batch spike.
    doc = rules_document()
    _alert(doc, "OffsetLedgerLagHigh")["expr"] = "offset_ledger:lag_seconds:max > 900"
    got = _run(tmp_path, doc)
    assert got.returncode != 0 and "OffsetLedgerLagHigh" in got.stdout + got.stderr


def test_the_shipped_file_is_the_defaults_and_promtool_accepts_it() -> None:
    assert SHIPPED.read_text(encoding="utf-8") == render_yaml(rules_document(Thresholds())), \
        "regenerate: offset-ledger alerts --format prometheus > offset_ledger/operate/prometheus-rules.yml"
    check = subprocess.run([promtool(), "check", "rules", str(SHIPPED)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "SUCCESS: 14 rules found" in check.stdout, check.stdout + check.stderr


def test_thresholds_shape_the_rules(tmp_path: Path) -> None:
    t = parse_thresholds(headroom_warn="12h", headroom_critical="PT2H", lag_seconds="5m", lag_for="15m",
                         crash_for="30s", runbook_base="https://docs.example/alerting")
    assert (t.headroom_warn, t.headroom_critical, t.lag_seconds) == (timedelta(hours=12), timedelta(hours=2), 300)
    doc = rules_document(t)
    assert _alert(doc, "OffsetLedgerRetentionHeadroomCritical")["expr"] == \
        "offset_ledger_retention_headroom_seconds < 7200"
    assert _alert(doc, "OffsetLedgerLagHigh")["expr"].startswith(
        "min_over_time(offset_ledger:lag_seconds:max[15m]) > 300")
    assert _alert(doc, "OffsetLedgerPipelinePresumedCrashed")["for"] == "30s"
    assert _alert(doc, "OffsetLedgerRecordsLost")["annotations"]["runbook_url"] == \
        "https://docs.example/alerting#records-lost"
    for rule in (r for g in doc["groups"] for r in g["rules"] if "alert" in r):
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        assert rule["annotations"]["command"].startswith("offset-ledger ")
    (tmp_path / "r.yml").write_text(render_yaml(doc), encoding="utf-8")
    check = subprocess.run([promtool(), "check", "rules", str(tmp_path / "r.yml")], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize("given, says", [
    ({"headroom_warn": "1h", "headroom_critical": "6h"},
     "--headroom-critical (6h) must be shorter than --headroom-warn (1h)"),
    ({"lag_seconds": "-5"}, "--lag-seconds must be a number of seconds above zero"),
    ({"lag_seconds": "soon"}, "--lag-seconds"),
    ({"lag_for": "10"}, "--lag-for"),
    ({"crash_for": "0s"}, "--crash-for"),
    ({"runbook_base": "a b"}, "--runbook-base"),
])
def test_bad_thresholds_are_refused_in_one_line(given: dict[str, str], says: str) -> None:
    with pytest.raises(OffsetLedgerError) as err:
        parse_thresholds(**given)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_the_command_works_without_the_server_extra(tmp_path: Path) -> None:
    # A Prometheus host has the CLI, not necessarily the web stack: alerts must not import it.
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nfor m in ('uvicorn', 'fastapi', 'starlette', 'jinja2'):\n    sys.modules[m] = None\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path), OFFSET_LEDGER_HOME=str(tmp_path / "home"))
    for fmt, says in (("prometheus", "OffsetLedgerPipelinePresumedCrashed"), ("grafana", '"uid": "offset-ledger"')):
        out = subprocess.run([sys.executable, "-c", f"from offset_ledger.cli.main import main; "
                              f"main(['alerts', '--format', '{fmt}'])"], capture_output=True, text=True, env=env,
                             timeout=120)
        assert out.returncode == 0 and says in out.stdout, out.stderr


def test_the_command_prints_the_rules_and_refuses_bad_thresholds_with_exit_2() -> None:
    from typer.testing import CliRunner

    from offset_ledger.cli.main import app

    runner = CliRunner()
    ok = runner.invoke(app, ["alerts", "--format", "prometheus", "--lag-seconds", "600", "--lag-for", "5m"])
    assert ok.exit_code == 0 and "min_over_time(offset_ledger:lag_seconds:max[5m]) > 600" in ok.stdout
    bad = subprocess.run(["offset-ledger", "alerts", "--headroom-warn", "1h", "--headroom-critical", "2h"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().count("\n") == 0 and "--headroom-critical (2h) must be shorter" in bad.stderr
