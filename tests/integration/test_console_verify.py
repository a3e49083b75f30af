"""The console's "Exactly once?" section in a real headless browser, over a ledger a real Spark query
recorded (the fixtures of test_console.py): clean, then with a gap made by hand."""

from __future__ import annotations

from typing import Any

from sqlalchemy import create_engine

from tests.integration.console_helper import Ledger, Served, click, css, css_all, wait_for
from tests.integration.test_console import browser, recorded, served  # noqa: F401 - fixtures
from tests.tamper import shift_recorded_start


def test_the_verify_section_reports_a_clean_history_then_a_hand_made_gap(
        browser: Any, served: Served, recorded: Ledger) -> None:  # noqa: F811
    browser.get(served.url + "/pipelines/orders")
    click(browser, "#verify-run")
    wait_for(browser, lambda d: "Every record read exactly once" in css(d, "#verify-status").text,
             what="a clean verdict")
    assert "No gap and no overlap" in css(browser, "#verify tbody").text

    engine = create_engine(recorded.dsn)
    try:
        shift_recorded_start(engine, partition=2, by=4, batch_id=1)
    finally:
        engine.dispose()
    click(browser, "#verify-run")
    wait_for(browser, lambda d: "Not accounted for" in css(d, "#verify-status").text, what="the unexplained gap")
    rows = css_all(browser, "#verify tbody tr[data-explained=false]")
    assert len(rows) == 1
    assert "UNEXPLAINED" in rows[0].text and f"{recorded.topic}/2" in rows[0].text and "gap" in rows[0].text
