"""``offset-ledger alerts``: print the Prometheus alert and recording rules (``operate.alert_rules``) for the
thresholds a team chooses, or the Grafana dashboard the package ships (docs/alerting.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Annotated, Optional

import typer

from offset_ledger.cli.option_groups import grouped
from offset_ledger.errors import InvalidInput
from offset_ledger.operate.alert_rules import SHIPPED, Thresholds, parse_thresholds, render_yaml, rules_document

_DURATION = "a duration: 6h, 90m, PT1H"


@dataclass(frozen=True)
class RuleSettings:
    """The thresholds the rules page and warn at, and where their runbooks are (``alert_rules.parse_thresholds``)."""

    headroom_warn: Annotated[Optional[str], typer.Option(
        "--headroom-warn", metavar="DURATION",
        help=f"Warn when retention headroom is below this (6h; {_DURATION}).")] = None
    headroom_critical: Annotated[Optional[str], typer.Option(
        "--headroom-critical", metavar="DURATION",
        help="Page when retention headroom is below this (1h).")] = None
    headroom_for: Annotated[Optional[str], typer.Option(
        "--headroom-for", metavar="DURATION",
        help="How long headroom must stay below a threshold first (5m).")] = None
    lag_seconds: Annotated[Optional[str], typer.Option(
        "--lag-seconds", metavar="SECONDS",
        help="Lag in seconds above this for --lag-for pages (900).")] = None
    lag_for: Annotated[Optional[str], typer.Option(
        "--lag-for", metavar="DURATION",
        help="The window lag must stay above --lag-seconds throughout (10m).")] = None
    crash_for: Annotated[Optional[str], typer.Option(
        "--crash-for", metavar="DURATION",
        help="How long a pipeline reads stale (heartbeat stopped) first (1m).")] = None
    lost_window: Annotated[Optional[str], typer.Option(
        "--lost-window", metavar="DURATION",
        help="Records lost within this window page (15m).")] = None
    ledger_for: Annotated[Optional[str], typer.Option(
        "--ledger-for", metavar="DURATION",
        help="How long a listener fails or spills first (5m).")] = None
    reset_window: Annotated[Optional[str], typer.Option(
        "--reset-window", metavar="DURATION",
        help="A reset executed within this is reported (info, 1h).")] = None
    runbook_base: Annotated[Optional[str], typer.Option(
        "--runbook-base", metavar="URL",
        help="Where docs/alerting.md is served (runbook_url's base).")] = None


@grouped
def alerts_cmd(
    fmt: str = typer.Option("prometheus", "--format", metavar="prometheus|grafana",
                            help="prometheus: the rules file (YAML); grafana: the dashboard JSON (no thresholds)."),
    settings: RuleSettings = RuleSettings(),
) -> None:
    """Print alert and recording rules for Prometheus (or the Grafana dashboard), for your thresholds.

    The package ships the defaults as offset_ledger/operate/prometheus-rules.yml and the dashboard as
    offset_ledger/operate/grafana-dashboard.json; docs/alerting.md says what each alert means and answers.
    """
    if fmt not in ("prometheus", "grafana"):
        raise InvalidInput(f"--format must be prometheus or grafana, not {fmt!r}")
    thresholds = parse_thresholds(**asdict(settings))
    if fmt == "grafana":
        if thresholds != Thresholds():
            raise InvalidInput("the thresholds shape the prometheus rules only; --format grafana takes none")

        typer.echo(SHIPPED.with_name("grafana-dashboard.json").read_text(encoding="utf-8"), nl=False)
        return
    typer.echo(render_yaml(rules_document(thresholds)), nl=False)


def register(app: typer.Typer) -> None:
    """Add ``alerts`` to the command line."""
    app.command("alerts")(alerts_cmd)
