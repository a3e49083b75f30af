"""The Grafana dashboard over ``/metrics``, generated with grafana-foundation-sdk (the ``[dashboards]`` extra),
never edited by hand: ``python -m offset_ledger.operate.alert_dashboard > offset_ledger/operate/grafana-dashboard.json``
regenerates the file the package ships (``offset-ledger alerts --format grafana`` prints it).

Per pipeline (the ``pipeline`` variable, several or all): lag in records and seconds, retention headroom,
batches and records read, findings, the running state over time, resets, and the ledger's health (the
listeners' writes, failures and spool, Kafka answering the scrape). docs/alerting.md shows it beside the rules.
"""

from __future__ import annotations

import json
from typing import Any

UID = "offset-ledger"
SEL = 'pipeline=~"$pipeline"'
BY = "pipeline, consumer_group"
#: offset_ledger_pipeline_state's states as the timeline's values (offset_ledger.rules.liveness).
STATE_VALUES = (("running", 1, "green"), ("uncertain", 2, "yellow"), ("stale", 3, "red"), ("stopped", 4, "text"))


def build() -> dict[str, Any]:
    """The dashboard's JSON model (a dict)."""
    from grafana_foundation_sdk.builders import dashboard, prometheus, stat, statetimeline, timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import (
        DataSourceRef,
        ValueMap,
        ValueMappingResult,
        VariableRefresh,
        VariableSort,
    )

    ds = DataSourceRef(type_val="prometheus", uid="${datasource}")

    def q(expr: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
        return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(ds)

    def series(title: str, unit: str, description: str, *queries: prometheus.Dataquery,
               width: int = 12) -> timeseries.Panel:
        panel = timeseries.Panel().title(title).description(description).unit(unit).datasource(ds).height(8).span(width)
        for query in queries:
            panel = panel.with_target(query)
        return panel

    state_expr = " + ".join(f'{n} * max by ({BY}) (offset_ledger_pipeline_state{{{SEL},state="{s}"}})'
                            for s, n, _ in STATE_VALUES)
    board = (
        dashboard.Dashboard("offset-ledger: pipelines")
        .uid(UID)
        .description("Spark Structured Streaming pipelines recorded by offset-ledger: lag, retention headroom, "
                     "batches, findings, running state and the ledger's health (docs/alerting.md).")
        .tags(["offset-ledger", "kafka", "spark"])
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(dashboard.QueryVariable("pipeline").label("Pipeline").datasource(ds)
                       .query("label_values(offset_ledger_pipeline_state, pipeline)")
                       .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
                       .multi(True).include_all(True).all_value(".*"))
        .with_row(dashboard.Row("State"))
        .with_panel(
            statetimeline.Panel().title("Running state").datasource(ds).height(6).span(24)
            .description("running: the driver's heartbeat is fresh; uncertain: inferred (no heartbeat); stale: the "
                         "heartbeat stopped with no termination reported (presumed crashed); stopped.")
            .with_target(q(state_expr, "{{pipeline}} / {{consumer_group}}"))
            .mappings([ValueMap({str(n): ValueMappingResult(text=s, color=c, index=n - 1)
                                 for s, n, c in STATE_VALUES})]))
        .with_row(dashboard.Row("Lag and retention"))
        .with_panel(series(
            "Lag (records)", "short", "Log-end offset minus the pipeline's position, per topic.",
            q(f"sum by ({BY}, topic) (offset_ledger_lag_records{{{SEL}}})", "{{pipeline}} {{topic}}")))
        .with_panel(series(
            "Lag (seconds)", "s", "Age of the record at the pipeline's position (0 when caught up), worst partition.",
            q(f"max by ({BY}, topic) (offset_ledger_lag_seconds{{{SEL}}})", "{{pipeline}} {{topic}}")))
        .with_panel(series(
            "Retention headroom", "s", "Time until retention may delete unread records, worst partition "
            "(0: due or lost).",
            q(f"min by ({BY}, topic) (offset_ledger_retention_headroom_seconds{{{SEL}}})", "{{pipeline}} {{topic}}")))
        .with_panel(series(
            "Records lost", "short", "Records the pipeline's batches never read (deleted before they were fetched).",
            q(f"sum by ({BY}, topic) (offset_ledger_records_lost_total{{{SEL}}})", "{{pipeline}} {{topic}}")))
        .with_row(dashboard.Row("Batches and findings"))
        .with_panel(series(
            "Batches per 5 minutes", "short", "Committed batches (changes of the newest batch id).",
            q(f"changes(offset_ledger_last_batch_id{{{SEL}}}[5m])", "{{pipeline}}"), width=8))
        .with_panel(series(
            "Records read per second", "short", "How fast the position moves (all partitions).",
            q(f"sum by ({BY}) (deriv(offset_ledger_position_next_offset{{{SEL}}}[5m]))", "{{pipeline}}"), width=8))
        .with_panel(series(
            "Findings by kind", "short", "Findings recorded (gaps, regressions, data loss, ...).",
            q(f"sum by ({BY}, kind) (offset_ledger_findings{{{SEL}}})", "{{pipeline}} {{kind}}"), width=8))
        .with_row(dashboard.Row("Resets and the ledger's health"))
        .with_panel(
            stat.Panel().title("Resets pending").datasource(ds).height(6).span(6)
            .description("Executed resets waiting for the next restart.")
            .with_target(q(f"offset_ledger_resets_pending{{{SEL}}}", "{{pipeline}}")))
        .with_panel(
            stat.Panel().title("Last executed reset").datasource(ds).height(6).span(6).unit("dateTimeFromNow")
            .description("When the newest executed reset was made.")
            .with_target(q(f"offset_ledger_last_reset_timestamp_seconds{{{SEL}}} * 1000", "{{pipeline}}")))
        .with_panel(series(
            "Listener writes", "short", "Events written, retried, spilled to the spool and failed, per second.",
            q(f"sum by ({BY}) (rate(offset_ledger_listener_written_total{{{SEL}}}[5m]))", "{{pipeline}} written"),
            q(f"sum by ({BY}) (rate(offset_ledger_listener_retried_total{{{SEL}}}[5m]))", "{{pipeline}} retried",
              "B"),
            q(f"sum by ({BY}) (rate(offset_ledger_listener_spilled_total{{{SEL}}}[5m]))", "{{pipeline}} spilled",
              "C"),
            q(f"sum by ({BY}) (rate(offset_ledger_listener_failed_total{{{SEL}}}[5m]))", "{{pipeline}} failed",
              "D"), width=6))
        .with_panel(series(
            "Ledger health", "short", "1: the listener's last report has no error; Kafka answered the scrape.",
            q(f"min by ({BY}) (offset_ledger_listener_healthy{{{SEL}}})", "{{pipeline}} listener healthy"),
            q("offset_ledger_kafka_up", "Kafka up", "B"), width=6))
    )
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def render() -> str:
    """The checked-in file's text."""
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(render(), end="")
