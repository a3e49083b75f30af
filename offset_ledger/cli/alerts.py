"""``offset-ledger alerts``: print the Prometheus alert and recording rules (``operate.alert_rules``) for the
thresholds a team chooses, or the Grafana dashboard the package ships (docs/alerting.md)."""

from __future__ import annotations

from typing import Optional

import typer

_DURATION = "a duration: 6h, 90m, PT1H"


def alerts_cmd(
    fmt: str = typer.Option("prometheus", "--format", metavar="prometheus|grafana",
                            help="prometheus: the rules file (YAML); grafana: the dashboard JSON (no thresholds)."),
    headroom_warn: Optional[str] = typer.Option(None, "--headroom-warn", metavar="DURATION",
                                                help=f"Warn when retention headroom is below this (6h; {_DURATION})."),
    headroom_critical: Optional[str] = typer.Option(None, "--headroom-critical", metavar="DURATION",
                                                    help="Page when retention headroom is below this (1h)."),
    headroom_for: Optional[str] = typer.Option(None, "--headroom-for", metavar="DURATION",
                                               help="How long headroom must stay below a threshold first (5m)."),
    lag_seconds: Optional[str] = typer.Option(None, "--lag-seconds", metavar="SECONDS",
                                              help="Lag in seconds above this for --lag-for pages (900)."),
    lag_for: Optional[str] = typer.Option(None, "--lag-for", metavar="DURATION",
                                          help="The window lag must stay above --lag-seconds throughout (10m)."),
    crash_for: Optional[str] = typer.Option(None, "--crash-for", metavar="DURATION",
                                            help="How long a pipeline reads stale (heartbeat stopped) first (1m)."),
    lost_window: Optional[str] = typer.Option(None, "--lost-window", metavar="DURATION",
                                              help="Records lost within this window page (15m)."),
    ledger_for: Optional[str] = typer.Option(None, "--ledger-for", metavar="DURATION",
                                             help="How long a listener fails or spills first (5m)."),
    reset_window: Optional[str] = typer.Option(None, "--reset-window", metavar="DURATION",
                                               help="A reset executed within this is reported (info, 1h)."),
    runbook_base: Optional[str] = typer.Option(None, "--runbook-base", metavar="URL",
                                               help="Where docs/alerting.md is served (runbook_url's base)."),
) -> None:
    """Print alert and recording rules for Prometheus (or the Grafana dashboard), for your thresholds.

    The package ships the defaults as offset_ledger/operate/prometheus-rules.yml and the dashboard as
    offset_ledger/operate/grafana-dashboard.json; docs/alerting.md says what each alert means and answers.
    """
    from offset_ledger.operate.alert_rules import parse_thresholds, render_yaml, rules_document
    from offset_ledger.errors import InvalidInput

    if fmt not in ("prometheus", "grafana"):
        raise InvalidInput(f"--format must be prometheus or grafana, not {fmt!r}")
    thresholds = parse_thresholds(
        headroom_warn=headroom_warn, headroom_critical=headroom_critical, headroom_for=headroom_for,
        lag_seconds=lag_seconds, lag_for=lag_for, crash_for=crash_for, lost_window=lost_window,
        ledger_for=ledger_for, reset_window=reset_window, runbook_base=runbook_base)
    if fmt == "grafana":
        from offset_ledger.operate.alert_rules import Thresholds

        if thresholds != Thresholds():
            raise InvalidInput("the thresholds shape the prometheus rules only; --format grafana takes none")
        from offset_ledger.operate.alert_rules import SHIPPED

        typer.echo(SHIPPED.with_name("grafana-dashboard.json").read_text(encoding="utf-8"), nl=False)
        return
    typer.echo(render_yaml(rules_document(thresholds)), nl=False)


def register(app: typer.Typer) -> None:
    """Add ``alerts`` to the command line."""
    app.command("alerts")(alerts_cmd)
