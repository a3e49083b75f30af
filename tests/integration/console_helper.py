"""Browser-test helpers for the console: the served subprocess and Selenium lookups that wait on text."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from offset_ledger.devstack import free_port

SCREENSHOTS = Path(os.environ.get("OFFSET_LEDGER_SCREENSHOT_DIR", Path(__file__).resolve().parents[2] / "docs"))
WAIT = 30


@dataclass
class Ledger:
    dsn: str
    topic: str
    bootstrap: str


class Served:
    """``offset-ledger serve`` as a subprocess on a free loopback port."""

    def __init__(self, ledger: Ledger, token: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "OFFSET_LEDGER_DSN": ledger.dsn, "OFFSET_LEDGER_BOOTSTRAP_SERVERS": ledger.bootstrap}
        env.pop("OFFSET_LEDGER_API_TOKEN", None)
        if token:
            env["OFFSET_LEDGER_API_TOKEN"] = token
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from offset_ledger.cli.main import main; main()", "serve",
             "--port", str(self.port), "--log-level", "warning"],
            env=env, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"offset-ledger serve exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("offset-ledger serve did not answer /healthz") from None
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def wait_for(driver, predicate, timeout: float = WAIT, what: str = "condition") -> Any:  # type: ignore[no-untyped-def]
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    def attempt(d):  # type: ignore[no-untyped-def]
        try:
            return predicate(d)
        except (StaleElementReferenceException, NoSuchElementException):
            return False  # the page re-rendered between lookups; try again

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2).until(attempt)
    except Exception as exc:
        raise AssertionError(f"timed out waiting for {what}; page text:\n{_text(driver)[:3000]}") from exc


# What a person's pointer would hit at the centre of ``arguments[0]``: null when it is the element
# itself (or inside it), else a short description of the element on top. Chrome's own hit test at
# click time answers the same question, but only by failing the click.
_COVERED_BY = """
const node = arguments[0];
const box = node.getBoundingClientRect();
const hit = document.elementFromPoint(box.left + box.width / 2, box.top + box.height / 2);
if (hit === null || hit === node || node.contains(hit)) return null;
return hit.tagName.toLowerCase() + (hit.id ? "#" + hit.id : "") +
  (hit.className && typeof hit.className === "string" ? "." + hit.className.trim().split(/\\s+/).join(".") : "");
"""


def _ready(driver, selector: str, seen: dict[str, str]):  # type: ignore[no-untyped-def]
    """The element when a person could act on it now: shown, enabled, in view, on top."""
    node = css(driver, selector)
    if not node.is_displayed():
        seen["last"] = "not displayed"
        return False
    if not node.is_enabled():
        seen["last"] = "disabled"
        return False
    # Centre it: a control at the window's edge is where a re-render above shifts it out from
    # under the pointer, and where a sticky element would sit.
    driver.execute_script("arguments[0].scrollIntoView({block: 'center', inline: 'nearest'})", node)
    cover = driver.execute_script(_COVERED_BY, node)
    if cover:
        seen["last"] = f"covered by {cover}"
        return False
    return node


def _wait_naming(driver, predicate, timeout: float, what: str, seen: dict[str, str]):  # type: ignore[no-untyped-def]
    """``wait_for`` whose failure says what stood in the way the last time it looked."""
    try:
        return wait_for(driver, predicate, timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{what}: last seen {seen['last']}\n{exc}") from exc


def click(driver, selector: str, timeout: float = WAIT) -> None:  # type: ignore[no-untyped-def]
    """Click ``selector`` once a person could: shown, enabled, scrolled into view and not covered.

    The console re-renders its tables every few seconds, so on a loaded machine a control can move
    between the moment Selenium finds it and the click: Chrome then refuses the click (it would land
    on whatever moved there) and this tries again. A control that stays covered fails, naming what
    covers it: a real user would hit that too.
    """
    from selenium.common.exceptions import ElementClickInterceptedException, ElementNotInteractableException

    seen = {"last": "not found"}

    def attempt(d):  # type: ignore[no-untyped-def]
        node = _ready(d, selector, seen)
        if not node:
            return False
        try:
            node.click()
        except (ElementClickInterceptedException, ElementNotInteractableException) as exc:
            seen["last"] = exc.msg.splitlines()[0] if exc.msg else type(exc).__name__
            return False
        return True

    _wait_naming(driver, attempt, timeout, f"{selector} to be clickable", seen)


def type_into(driver, selector: str, keys: str, timeout: float = WAIT) -> None:  # type: ignore[no-untyped-def]
    """Type ``keys`` into ``selector`` once it is shown, enabled, in view and on top."""
    seen = {"last": "not found"}
    node = _wait_naming(driver, lambda d: _ready(d, selector, seen), timeout, f"{selector} to take input", seen)
    node.send_keys(keys)


def _text(driver) -> str:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    try:
        return str(driver.find_element(By.TAG_NAME, "body").text)
    except Exception:  # noqa: BLE001 - only for a failure message
        return "<no page>"


def css(driver, selector: str):  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def css_all(driver, selector: str) -> list[Any]:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def partition_positions(driver) -> dict[int, str]:  # type: ignore[no-untyped-def]
    return {int(r.get_attribute("data-partition")): r.find_element("css selector", "[data-col=position]").text
            for r in css_all(driver, "#partitions tbody tr[data-partition]")}


def screenshot(driver, name: str, min_height: int = 900) -> None:  # type: ignore[no-untyped-def]
    """A full-page PNG: the window grows to the document's height first (Chrome captures the viewport)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    driver.execute_script("window.scrollTo(0, 0)")
    driver.set_window_size(1280, min_height)  # so scrollHeight is the content's, not the window's
    time.sleep(0.2)
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    driver.set_window_size(1280, max(min_height, min(height + 40, 4000)))
    time.sleep(0.3)  # let the chart follow the resize
    driver.save_screenshot(str(SCREENSHOTS / name))
    driver.set_window_size(1280, 1000)


def api_positions(served: Served, topic: str) -> dict[str, int]:
    return dict(httpx.get(f"{served.url}/v1/getCurrentOffsets?pipelineName=orders").json()[topic])
