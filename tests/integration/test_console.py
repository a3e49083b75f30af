"""The web console in a real headless browser (Debian's chromium through chromium-driver).

One ledger per module, recorded by a real Spark query reading real Kafka through the listener;
the console is served by a real ``offset-ledger serve`` subprocess. The tests wait on what the page
shows (text, ARIA values), never on pixel positions. They write the README's screenshots to
``docs/`` (or ``OFFSET_LEDGER_SCREENSHOT_DIR``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from offset_ledger import OffsetLedgerListener, start_from_ledger
from offset_ledger.devstack import StackInfo
from offset_ledger.ledger.engine import make_engine, upgrade
from tests.integration.console_helper import (
    WAIT,
    Ledger,
    Served,
    api_positions,
    click,
    css,
    css_all,
    partition_positions,
    screenshot,
    type_into,
    wait_for,
)

CHROMIUM = os.environ.get("OFFSET_LEDGER_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("OFFSET_LEDGER_CHROMEDRIVER", "/usr/bin/chromedriver")
PARTITIONS = 3
PER_PARTITION = 30


@pytest.fixture(scope="module")
def recorded(stack: StackInfo, kafka_session, spark) -> Iterator[Ledger]:  # type: ignore[no-untyped-def]
    """A Postgres ledger that a real Spark query filled through OffsetLedgerListener, plus 30 unread records."""
    admin_url = make_url(stack.postgres_dsn)
    name = f"t_console_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    dsn = admin_url.set(database=name).render_as_string(hide_password=False)
    topic = kafka_session.create_topic(partitions=PARTITIONS, name=f"t_console_{uuid.uuid4().hex[:6]}")
    work = Path(tempfile.mkdtemp(prefix="offset-ledger-console-"))
    try:
        engine = make_engine(dsn)
        upgrade(engine)
        engine.dispose()
        kafka_session.produce(topic, [f"v{i}" for i in range(PARTITIONS * PER_PARTITION)])
        plan = start_from_ledger("orders", [topic], bootstrap_servers=stack.bootstrap_servers, dsn=dsn,
                                 checkpoint_root=str(work / "checkpoints"), app_version="1.0",
                                 first_run="earliest")
        listener = OffsetLedgerListener(dsn=dsn, pipeline="orders", app_version="1.0", spool_dir=work / "spool")
        spark.streams.addListener(listener)
        try:
            query = (spark.readStream.format("kafka")
                     .option("kafka.bootstrap.servers", stack.bootstrap_servers)
                     .option("subscribe", topic)
                     .option("startingOffsets", plan.starting_offsets_json)
                     .option("maxOffsetsPerTrigger", "30")  # several batches for the history and chart
                     .load().selectExpr("CAST(value AS STRING) AS value")
                     .writeStream.format("noop").option("checkpointLocation", plan.checkpoint_location)
                     .trigger(availableNow=True).start())
            query.awaitTermination(120)
            assert listener.flush(60), listener.health()
        finally:
            spark.streams.removeListener(listener)
            listener.close(10)
        # Records produced after the run are the lag the console must show.
        kafka_session.produce(topic, [f"w{i}" for i in range(PARTITIONS * 10)])
        yield Ledger(dsn, topic, stack.bootstrap_servers)
    finally:
        kafka_session.delete_topics([topic])
        kafka_session.created.remove(topic)
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def served(recorded: Ledger) -> Iterator[Served]:
    server = Served(recorded)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless chromium; a missing browser fails under CI and skips (with the reason) elsewhere."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        message = f"{', '.join(missing)} missing: apt-get install chromium chromium-driver"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1000", "--hide-scrollbars", "--lang=en-US"):
        options.add_argument(arg)
    # An explicit driver path: Selenium never tries to download a browser or driver.
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()


# -- tests ---------------------------------------------------------------------------------


def test_pipelines_table_shows_the_pipeline_its_lag_and_refreshes_by_itself(
        browser, served: Served, recorded: Ledger, kafka_session) -> None:  # type: ignore[no-untyped-def]
    browser.get(served.url + "/")
    row = '#pipelines tbody tr[data-pipeline="orders"]'
    wait_for(browser, lambda d: css(d, f"{row} [data-col=lag]").text == "30", what="lag 30 in the pipelines table")
    assert css(browser, f"{row} [data-col=state] .badge").text == "stopped"
    assert "query ended" in css(browser, f"{row} [data-col=state]").text  # its evidence (rules.liveness)
    # Retention headroom: the broker's default retention (7 days) less the unread record's age, coloured OK.
    wait_for(browser, lambda d: css(d, f"{row} [data-col=headroomSeconds]").text.startswith("6d"), what="headroom")
    assert "headroom-OK" in css(browser, f"{row} [data-col=headroomSeconds] .badge").get_attribute("class")
    assert css(browser, f"{row} [data-col=appVersion]").text == "1.0"
    assert css(browser, f"{row} [data-col=generation]").text == "1"
    # The restart's own finding (a first run from earliest) is stored with its generation.
    assert css(browser, f"{row} [data-col=findings]").text == "1"
    assert css(browser, f"{row} th a").get_attribute("href") == served.url + "/pipelines/orders"

    header = "#pipelines thead button[data-key=lag]"
    click(browser, header)
    assert css(browser, header).find_element("xpath", "..").get_attribute("aria-sort") == "ascending"
    click(browser, header)
    assert css(browser, header).find_element("xpath", "..").get_attribute("aria-sort") == "descending"
    screenshot(browser, "console-pipelines.png", min_height=360)

    # New records raise the lag; the table follows without a reload (the page keeps its marker).
    browser.execute_script("window.__notReloaded = true")
    kafka_session.produce(recorded.topic, [f"x{i}" for i in range(PARTITIONS)])
    wait_for(browser, lambda d: css(d, f"{row} [data-col=lag]").text == "33", timeout=20,
             what="the lag to refresh to 33")
    assert browser.execute_script("return window.__notReloaded") is True


def test_pipeline_page_shows_each_partition_position_in_its_log(
        browser, served: Served, recorded: Ledger, kafka_session) -> None:  # type: ignore[no-untyped-def]
    browser.get(served.url + "/")
    wait_for(browser, lambda d: css_all(d, '#pipelines tbody tr[data-pipeline="orders"] th a'), what="the link")
    click(browser, '#pipelines tbody tr[data-pipeline="orders"] th a')
    wait_for(browser, lambda d: d.current_url == served.url + "/pipelines/orders", what="the pipeline page")
    wait_for(browser, lambda d: len(partition_positions(d)) == PARTITIONS, what="one row per partition")

    ends = kafka_session.end_offsets(recorded.topic)
    assert partition_positions(browser) == {p: str(PER_PARTITION) for p in range(PARTITIONS)}
    meters = css_all(browser, "#partitions [role=meter]")
    wait_for(browser, lambda d: len(css_all(d, "#partitions [role=meter]")) == PARTITIONS, what="a bar per partition")
    meters = css_all(browser, "#partitions [role=meter]")
    assert sorted((m.get_attribute("aria-valuenow"), m.get_attribute("aria-valuemax")) for m in meters) == sorted(
        (str(PER_PARTITION), str(ends[p])) for p in range(PARTITIONS))

    # Retention headroom per partition: 7 days less the unread record's age, or nothing unread (caught up).
    wait_for(browser, lambda d: all(c.text.startswith("6d") or c.text == "caught-up"
                                    for c in css_all(d, "#partitions tbody [data-col=headroom]")), what="headroom")
    assert len(css_all(browser, "#partitions tbody [data-col=headroom] .headroom-OK")) == PARTITIONS

    # History: the real batches, newest first, paged with the API's cursor.
    wait_for(browser, lambda d: len(css_all(d, "#history tbody tr")) >= 3, what="batch history rows")
    assert "→ 30" in css(browser, "#history tbody").text
    from selenium.webdriver.support.ui import Select

    # Paged by the API's cursor: two batches, then the oldest one, then back.
    Select(css(browser, "#history-size")).select_by_visible_text("2")
    wait_for(browser, lambda d: len(css_all(d, "#history tbody tr")) == 2, what="a page of two batches")
    assert [r.find_element("css selector", "td").text for r in css_all(browser, "#history tbody tr")] == ["2", "1"]
    click(browser, "#history-older")
    wait_for(browser, lambda d: css(d, "#history-page").text == "Page 2", what="the second page")
    assert [r.find_element("css selector", "td").text for r in css_all(browser, "#history tbody tr")] == ["0"]
    assert not css(browser, "#history-older").is_enabled()
    click(browser, "#history-newer")
    wait_for(browser, lambda d: css(d, "#history-page").text == "Page 1", what="back to the first page")
    # Filtered by time: nothing recorded before 2001.
    browser.execute_script("document.getElementById('history-until').value = '2001-01-01T00:00:00'")
    click(browser, "#history-filter button[type=submit]")
    wait_for(browser, lambda d: css(d, "#history tbody").text == "No batches match.", what="an empty filtered page")
    Select(css(browser, "#history-size")).select_by_visible_text("20")
    click(browser, "#history-filter button[type=reset]")
    wait_for(browser, lambda d: len(css_all(d, "#history tbody tr")) == 3, what="every batch again")
    assert css_all(browser, "#chart canvas"), "the chart was not drawn"
    wait_for(browser, lambda d: "1.0" in css(d, "#generations tbody").text, what="generation 1 with app version 1.0")
    assert css(browser, "#generations tbody td").text == "1"
    runs = css(browser, "#runs tbody tr")
    assert "1.0" in runs.text
    assert runs.find_elements("css selector", "td")[2].text == "1", "the run was not matched to its generation"
    assert "first_run" in css(browser, "#findings tbody").text
    screenshot(browser, "console-pipeline.png")

    # An unknown pipeline: the API's 404 message, and no form to reset it with.
    browser.get(served.url + "/pipelines/no-such-pipeline")
    wait_for(browser, lambda d: "404 UnknownPipeline" in css(d, "#page-error").text, what="the 404 message")
    assert not css(browser, "#reset-form").is_displayed()
    browser.get(served.url + "/pipelines/orders")
    wait_for(browser, lambda d: len(partition_positions(d)) == PARTITIONS, what="the page again")

    # A phone-sized window: nothing wider than the screen but the tables' own scroll areas.
    browser.set_window_size(390, 844)
    try:
        if os.environ.get("OFFSET_LEDGER_PHONE_SHOT"):  # for looking at the layout by eye
            time.sleep(0.3)
            browser.save_screenshot(os.environ["OFFSET_LEDGER_PHONE_SHOT"])
        overflow = browser.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the page is {overflow}px wider than a phone screen"
    finally:
        browser.set_window_size(1280, 1000)


def test_reset_through_the_form_dry_runs_then_executes_and_the_positions_and_audit_change(
        browser, served: Served, recorded: Ledger) -> None:  # type: ignore[no-untyped-def]
    browser.get(served.url + "/pipelines/orders")
    wait_for(browser, lambda d: len(partition_positions(d)) == PARTITIONS, what="positions")
    before = api_positions(served, recorded.topic)

    click(browser, "input[name=mode][value=shift]")
    type_into(browser, "#reset-shift", "-5")
    wait_for(browser, lambda d: len(css_all(d, "#reset-topic option")) == 2, what="the topic choices")
    from selenium.webdriver.support.ui import Select

    Select(css(browser, "#reset-topic")).select_by_value(recorded.topic)
    type_into(browser, "#reset-partitions", "0,2")
    click(browser, "#reset-preview-button")
    wait_for(browser, lambda d: css(d, "#reset-preview").is_displayed(), what="the dry run")
    targets = {int(r.get_attribute("data-partition")): r.find_element("css selector", "[data-col=target]").text
               for r in css_all(browser, "#preview-table tbody tr[data-partition]")}
    assert targets == {0: "25", 2: "25"}
    heading = css(browser, "#preview-heading").text
    assert "10 records replayed (≈ " in heading and heading.endswith(", 0 skipped"), heading
    sizes = {int(r.get_attribute("data-partition")): r.find_element("css selector", "[data-col=bytes]").text
             for r in css_all(browser, "#preview-table tbody tr[data-partition]")}
    assert set(sizes) == {0, 2} and all(text.endswith((" B", " KB")) for text in sizes.values()), sizes
    assert api_positions(served, recorded.topic) == before, "a dry run moved positions"
    screenshot(browser, "console-reset-dry-run.png")

    # No reason: nothing is sent.
    click(browser, "#reset-confirmed")
    click(browser, "#reset-execute")
    wait_for(browser, lambda d: "reason" in css(d, "#reset-message").text, what="the missing-reason message")
    assert api_positions(served, recorded.topic) == before

    type_into(browser, "#reset-reason", "replay the last five records after the sink fix")
    click(browser, "#reset-execute")
    wait_for(browser, lambda d: "executed" in css(d, "#reset-result").text, what="the executed reset")
    assert api_positions(served, recorded.topic) == {"0": 25, "1": 30, "2": 25}
    wait_for(browser, lambda d: partition_positions(d) == {0: "25", 1: "30", 2: "25"}, what="positions after the reset")
    wait_for(browser, lambda d: "replay the last five records" in css(d, "#audit tbody").text, what="the audit row")
    audit = css(browser, "#audit tbody").text
    assert "executed (pending)" in audit and "dry run" in audit and "console" in audit
    assert f"{recorded.topic}/0: 30 → 25" in audit

    # A target beyond the log is refused with the API's own message, and nothing moves.
    click(browser, "input[name=mode][value=offsets]")
    Select(css(browser, "#reset-topic")).select_by_value("")
    css(browser, "#reset-partitions").clear()
    type_into(browser, "#reset-offsets", '{"%s": {"1": 99999}}' % recorded.topic)
    click(browser, "#reset-preview-button")
    wait_for(browser, lambda d: css(d, "#reset-preview").is_displayed(), what="the second dry run")
    assert "will be refused" in css(browser, "#preview-warnings").text
    # A refused target is no target: the preview shows none, and the audit trail marks the dry run refused.
    refused = css(browser, "#preview-table tbody tr[data-partition='1']")
    assert refused.find_element("css selector", "[data-col=target]").text == "—"
    wait_for(browser, lambda d: f"{recorded.topic}/1: 30 → refused: 99,999 is outside the log" in
             css(d, "#audit tbody").text, what="the refused dry run marked in the audit trail")
    type_into(browser, "#reset-reason", "should be refused")
    click(browser, "#reset-confirmed")
    click(browser, "#reset-execute")
    wait_for(browser, lambda d: css(d, "#reset-message").text.startswith("Refused: 400"), what="the refusal")
    assert "OffsetOutOfRange" in css(browser, "#reset-message").text
    assert api_positions(served, recorded.topic) == {"0": 25, "1": 30, "2": 25}


def test_with_a_token_the_console_asks_for_it_and_unauthenticated_writes_are_refused(
        browser, recorded: Ledger) -> None:  # type: ignore[no-untyped-def]
    token = "console-test-" + uuid.uuid4().hex
    server = Served(recorded, token=token)
    try:
        browser.get(server.url + "/")  # the HTML shell loads without a token ...
        wait_for(browser, lambda d: css(d, "#token-panel").is_displayed(), what="the token prompt")
        assert "requires an API token" in css(browser, "#token-message").text
        assert not css_all(browser, '#pipelines tbody tr[data-pipeline="orders"]'), "data shown without a token"

        # ... but a write without the bearer header is refused and changes nothing.
        status = browser.execute_async_script("""
            const done = arguments[arguments.length - 1];
            fetch('/api/v1/pipelines/orders/resets', {method: 'POST', headers: {'Content-Type': 'application/json'},
                  body: JSON.stringify({mode: 'earliest', dryRun: false, reason: 'no token'})})
              .then(r => done(r.status), e => done(String(e)));""")
        assert status == 401
        headers = {"Authorization": f"Bearer {token}"}
        assert httpx.get(f"{server.url}/v1/getCurrentOffsets?pipelineName=orders", headers=headers).json()[
            recorded.topic] == {"0": 25, "1": 30, "2": 25}

        type_into(browser, "#token-input", "wrong-token")
        click(browser, "#token-form button[type=submit]")
        wait_for(browser, lambda d: "was refused" in css(d, "#token-message").text, what="the wrong-token message")

        type_into(browser, "#token-input", token)
        click(browser, "#token-form button[type=submit]")
        wait_for(browser, lambda d: css_all(d, '#pipelines tbody tr[data-pipeline="orders"]'), what="data with the token")
        assert token not in browser.current_url
        browser.get(server.url + "/pipelines/orders")  # the token stays for this tab
        wait_for(browser, lambda d: len(partition_positions(d)) == PARTITIONS, what="positions with the token")
        browser.execute_script("sessionStorage.clear()")
    finally:
        server.stop()


def test_a_running_pipeline_shows_running_and_its_reset_is_refused_with_409(
        browser, served: Served, recorded: Ledger, spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    listener = OffsetLedgerListener(dsn=recorded.dsn, pipeline="live", spool_dir=tmp_path / "spool")
    spark.streams.addListener(listener)
    query = None
    try:
        query = (spark.readStream.format("kafka")
                 .option("kafka.bootstrap.servers", recorded.bootstrap).option("subscribe", recorded.topic)
                 .option("startingOffsets", "earliest").load()
                 .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(processingTime="1 second").start())
        query.processAllAvailable()
        assert listener.flush(60), listener.health()

        browser.get(served.url + "/")
        row = '#pipelines tbody tr[data-pipeline="live"]'
        wait_for(browser, lambda d: css(d, f"{row} [data-col=state] .badge").text == "running", what="live is running")
        # The evidence beside it, as the API and the CLI give it (rules.liveness).
        assert f"from run {str(query.runId)[:8]}" in css(browser, f"{row} [data-col=state]").text
        assert css(browser, f"{row} [data-col=lag]").text == "0"

        browser.get(served.url + "/pipelines/live")
        wait_for(browser, lambda d: len(partition_positions(d)) == PARTITIONS, what="live's positions")
        wait_for(browser, lambda d: f"from run {str(query.runId)[:8]}" in css(d, "#summary").text,
                 what="the state's evidence on the pipeline page")
        before = httpx.get(f"{served.url}/v1/getCurrentOffsets?pipelineName=live").json()
        click(browser, "#reset-preview-button")  # earliest, every topic
        wait_for(browser, lambda d: css(d, "#reset-preview").is_displayed(), what="the dry run")
        assert "active run" in css(browser, "#preview-warnings").text
        type_into(browser, "#reset-reason", "replay everything")
        click(browser, "#reset-confirmed")
        click(browser, "#reset-execute")
        wait_for(browser, lambda d: css(d, "#reset-message").text.startswith("Refused: 409 ActiveRunConflict"),
                 what="the 409 refusal")
        assert "has an active run" in css(browser, "#reset-message").text
        assert httpx.get(f"{served.url}/v1/getCurrentOffsets?pipelineName=live").json() == before
    finally:
        if query is not None:
            query.stop()
        spark.streams.removeListener(listener)
        listener.close(10)


def test_a_slash_in_a_pipeline_name_round_trips_through_the_console(
        browser, served: Served, recorded: Ledger, spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Spark and Kafka accept ``eu/orders`` as a pipeline (query) name: the console lists it, opens it
    (percent-encoded) and resets it, and the API answers for the same name."""
    name = "eu/orders"
    listener = OffsetLedgerListener(dsn=recorded.dsn, pipeline=name, spool_dir=tmp_path / "spool")
    spark.streams.addListener(listener)
    try:
        query = (spark.readStream.format("kafka")
                 .option("kafka.bootstrap.servers", recorded.bootstrap).option("subscribe", recorded.topic)
                 .option("startingOffsets", "earliest").load()
                 .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(120)
        assert listener.flush(60), listener.health()
    finally:
        spark.streams.removeListener(listener)
        listener.close(10)
    # The oracle: an availableNow run read every partition to its log-end offset, as Kafka reports it.
    details = httpx.get(f"{served.url}/v1/getTopicDetails", params={"topicName": recorded.topic}).json()
    log_ends = {int(p): d["lastOffset"] for p, d in details["partitions"].items()}
    api = httpx.get(f"{served.url}/api/v1/pipelines/eu%2Forders/offsets").json()
    assert api["pipeline"] == name and {p["partition"]: p["nextOffset"] for p in api["positions"]} == log_ends

    browser.get(served.url + "/")
    link = f'#pipelines tbody tr[data-pipeline="{name}"] a'
    wait_for(browser, lambda d: css_all(d, link), what="the eu/orders row")
    click(browser, link)
    wait_for(browser, lambda d: len(partition_positions(d)) == PARTITIONS, what="eu/orders positions")
    assert browser.current_url.endswith("/pipelines/eu%2Forders") and css(browser, "h1").text == name
    assert partition_positions(browser) == {p: f"{end:,}" for p, end in log_ends.items()}

    click(browser, "#reset-preview-button")  # earliest, every topic
    wait_for(browser, lambda d: css(d, "#reset-preview").is_displayed(), what="the dry run")
    type_into(browser, "#reset-reason", "slash round trip")
    click(browser, "#reset-confirmed")
    click(browser, "#reset-execute")
    wait_for(browser, lambda d: "executed" in css(d, "#reset-result").text, what="the executed reset")
    after = httpx.get(f"{served.url}/v1/getCurrentOffsets", params={"pipelineName": name}).json()
    log_starts = {p: d["firstOffset"] for p, d in details["partitions"].items()}
    assert after == {recorded.topic: log_starts}
    audit = httpx.get(f"{served.url}/api/v1/pipelines/eu%2Forders/resets").json()["resets"]
    assert [(r["mode"], r["reason"], r["status"]) for r in audit] == [
        ("earliest", "slash round trip", "pending"), ("earliest", None, "dry_run")]


def test_api_docs_open_from_the_console_with_the_token(browser, recorded: Ledger) -> None:  # type: ignore[no-untyped-def]
    token = "docs-test-" + uuid.uuid4().hex
    server = Served(recorded, token=token)
    try:
        browser.get(server.url + "/")
        wait_for(browser, lambda d: css(d, "#token-panel").is_displayed(), what="the token prompt")
        type_into(browser, "#token-input", token)
        click(browser, "#token-form button[type=submit]")
        click(browser, 'nav a[href="/docs"]')
        wait_for(browser, lambda d: "/v1/resetOffsetOfPartitions" in css(d, "#docs").text, what="the API reference")
        assert "GET /api/v1/pipelines/{pipeline}/offsets" in css(browser, "#docs").text
        # Everything on the page came from this server (the CSP would block anything else).
        sources = browser.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)")
        assert sources and all(s.startswith(server.url) for s in sources), sources
        browser.execute_script("sessionStorage.clear()")
    finally:
        server.stop()


def test_the_pipeline_page_shows_stored_policies_their_last_change_and_the_history(
        browser, served: Served, recorded: Ledger) -> None:  # type: ignore[no-untyped-def]
    browser.get(served.url + "/pipelines/orders")
    value = '#policies tbody tr[data-policy="{}"] [data-col={}]'
    wait_for(browser, lambda d: css(d, value.format("onDataLoss", "value")).text == "fail", what="the default policies")
    assert "Never set" in css(browser, "#policies-last").text
    assert css(browser, value.format("onDataLoss", "source")).text == "default"

    url = f"{served.url}/api/v1/pipelines/orders/policies"
    first = httpx.put(url, headers={"X-Actor": "alice"},
                      json={"policies": {"onDataLoss": "earliest", "window": "10 minutes"}, "reason": "windowed since v2"})
    assert first.status_code == 200, first.text
    second = httpx.put(url, headers={"X-Actor": "bob"},
                       json={"policies": {"window": None, "firstRun": "latest"}, "reason": "not windowed any more"})
    assert second.status_code == 200, second.text

    browser.get(served.url + "/pipelines/orders")
    wait_for(browser, lambda d: css(d, value.format("onDataLoss", "value")).text == "earliest", what="the stored policies")
    assert css(browser, value.format("onDataLoss", "source")).text == "stored"
    assert css(browser, value.format("firstRun", "value")).text == "latest"
    assert css(browser, value.format("window", "source")).text == "default"
    assert css(browser, "#policies-actor").text == "bob"
    assert css(browser, "#policies-reason").text == "not windowed any more"
    assert css(browser, "#policies-last time").get_attribute("datetime") == second.json()["lastChange"]["createdAt"]

    assert not css(browser, "#policy-history").is_displayed()
    click(browser, "#policy-history-link")
    wait_for(browser, lambda d: len(css_all(d, "#policy-history-table tbody tr[data-change]")) == 2, what="the history")
    rows = [r.text for r in css_all(browser, "#policy-history-table tbody tr[data-change]")]
    assert "bob" in rows[0] and "not windowed any more" in rows[0] and "firstRun: latest" in rows[0]
    assert "alice" in rows[1] and "window: 10 minutes" in rows[1]
    assert browser.current_url.endswith("#policy-history")
    screenshot(browser, "console-policies.png")


def test_policies_are_changed_from_the_console_after_a_dry_run_and_with_a_reason(
        browser, served: Served, recorded: Ledger) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.support.ui import Select

    url = f"{served.url}/api/v1/pipelines/orders/policies"
    changes_before = len(httpx.get(url + "/history").json()["changes"])
    browser.get(served.url + "/pipelines/orders")
    wait_for(browser, lambda d: css_all(d, '#policies tbody tr[data-policy="onDataLoss"]'), what="the policies")
    wait_for(browser, lambda d: css_all(d, "#policy-unset input[value=firstRun]"), what="the form")

    Select(css(browser, "#policy-onDataLoss")).select_by_value("fail")
    type_into(browser, "#policy-window", "5 minutes")
    click(browser, "#policy-unset input[value=firstRun]")
    click(browser, "#policy-preview-button")
    wait_for(browser, lambda d: css(d, "#policy-preview").is_displayed(), what="the dry run")
    after = {r.get_attribute("data-policy"): r.find_element("css selector", "[data-col=after]").text
             for r in css_all(browser, "#policy-preview-table tbody tr[data-policy]")}
    assert after["window"] == "5 minutes changed"
    assert after["onDataLoss"].startswith("fail")
    assert after["firstRun"].startswith("— (default)")
    assert len(httpx.get(url + "/history").json()["changes"]) == changes_before, "a dry run stored policies"

    # No reason: nothing is sent.
    click(browser, "#policy-confirmed")
    click(browser, "#policy-save")
    wait_for(browser, lambda d: "reason" in css(d, "#policy-message").text, what="the missing-reason message")
    assert len(httpx.get(url + "/history").json()["changes"]) == changes_before

    type_into(browser, "#policy-reason", "shorter windows from v3")
    click(browser, "#policy-save")
    wait_for(browser, lambda d: "Policies stored" in css(d, "#policy-result").text, what="the stored change")
    doc = httpx.get(url).json()
    assert doc["policies"]["onDataLoss"] == "fail" and doc["policies"]["window"] == "5 minutes"
    assert "firstRun" not in doc["policies"]
    assert (doc["lastChange"]["actor"], doc["lastChange"]["reason"]) == ("console", "shorter windows from v3")
    value = '#policies tbody tr[data-policy="window"] [data-col={}]'
    wait_for(browser, lambda d: css(d, value.format("value")).text == "5 minutes", what="the table after the change")
    assert css(browser, value.format("source")).text == "stored"
    assert css(browser, "#policies-reason").text == "shorter windows from v3"

    # A bad value is refused with the API's own message, and nothing is stored.
    type_into(browser, "#policy-slide", "soon")
    click(browser, "#policy-preview-button")
    wait_for(browser, lambda d: css(d, "#policy-message").text.startswith("Refused: 400"), what="the refusal")
    assert "policies.slide" in css(browser, "#policy-message").text
    assert len(httpx.get(url + "/history").json()["changes"]) == changes_before + 1


def test_a_pipeline_of_several_groups_offers_each_group_as_a_link(
        browser, served: Served, recorded: Ledger) -> None:  # type: ignore[no-untyped-def]
    """No group named and the ledger has two: the API refuses (400 AmbiguousConsumerGroup, its
    ``consumerGroups`` camelCase like every answer's names) and the page links each group."""
    from tests.ops_seed import seed_pipeline

    engine = make_engine(recorded.dsn)
    try:
        for group in ("two-a", "two-b"):
            seed_pipeline(engine, "two-groups", {recorded.topic: {0: 10}}, consumer_group=group)
    finally:
        engine.dispose()
    refused = httpx.get(f"{served.url}/api/v1/pipelines/two-groups/offsets")
    assert refused.status_code == 400 and refused.json()["consumerGroups"] == ["two-a", "two-b"], refused.text
    browser.get(served.url + "/pipelines/two-groups")
    wait_for(browser, lambda d: len(css_all(d, "#page-error a")) == 2, what="a link per consumer group")
    assert [a.text for a in css_all(browser, "#page-error a")] == ["two-a", "two-b"]
    click(browser, "#page-error a")
    wait_for(browser, lambda d: d.current_url.endswith("/pipelines/two-groups?group=two-a"), what="the group's page")
