"""A real browser for the dashboard's tests: Debian's headless Chromium, driven over WebDriver.

``.ci/run`` installs the ``chromium`` and ``chromium-driver`` packages; selenium (a dev dependency)
speaks WebDriver to the driver. The browser is started with nothing that reaches past the machine:
no background networking, updates, sync or QUIC, and a profile of its own for each test.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless=new",
    "--no-sandbox",  # the tests run as root, where Chromium's sandbox will not start
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1600",
)
T = TypeVar("T")

_TABLE = """
return Array.from(document.getElementById(arguments[0]).rows, (tr) => Array.from(tr.cells, (td) => td.textContent));
"""


class Browser:
    """One headless Chromium with one tab. Reads go through small scripts, one round trip each, so
    that a table is read whole, as the page held it at one moment."""

    def __init__(self, driver: webdriver.Chrome) -> None:
        self.driver = driver

    def open(self, url: str) -> None:
        self.driver.get(url)

    def wait(self, predicate: Callable[[], T | None], what: str, timeout: float = 15.0) -> T:
        """Poll ``predicate`` (a stale element counts as not yet) until it is truthy; fail after ``timeout``."""
        deadline = time.monotonic() + timeout
        last: object = None
        while True:
            try:
                value = predicate()
            except StaleElementReferenceException:  # the page rebuilt what was being read
                value = None
            if value:
                return value
            last = value
            if time.monotonic() > deadline:
                pytest.fail(f"the page did not show {what} within {timeout}s (last: {last!r}); {self.status()!r}")
            time.sleep(0.05)

    def wait_text(self, element_id: str, ok: Callable[[str], bool], what: str, timeout: float = 15.0) -> str:
        """Wait until the element's text satisfies ``ok`` (an empty text never does); returns it."""
        return self.wait(lambda: text if ok(text := self.text(element_id)) else None, what, timeout)

    def element(self, element_id: str) -> WebElement:
        return self.driver.find_element(By.ID, element_id)

    def text(self, element_id: str) -> str:
        """The element's text as the DOM holds it (``textContent``: hidden or not)."""
        text: str = self.driver.execute_script("return document.getElementById(arguments[0]).textContent", element_id)
        return text

    def hidden(self, element_id: str) -> bool:
        hidden: bool = self.driver.execute_script("return document.getElementById(arguments[0]).hidden", element_id)
        return hidden

    def status(self) -> str:
        """The page's connection status line (``live · updated …``, ``unreachable``, ``needs a token``)."""
        try:
            return self.text("status")
        except Exception:  # no page yet
            return ""

    def live(self) -> bool:
        """Whether the page's last refresh reached the control plane."""
        return self.status().startswith("live")

    def rows(self, tbody_id: str) -> list[list[str]]:
        """The text of every cell of a table body, row by row."""
        rows: list[list[str]] = self.driver.execute_script(_TABLE, tbody_id)
        return rows

    def cards(self) -> dict[str, str]:
        """The overview's cards: label -> value."""
        pairs = self.driver.execute_script(
            "return Array.from(document.querySelectorAll('#stats .card'),"
            " (c) => [c.querySelector('.label').textContent, c.querySelector('.value').textContent])"
        )
        return dict(pairs)

    def fill(self, selector: str, value: str) -> None:
        """Type ``value`` into a form field (CSS selector), replacing what it held."""
        field = self.driver.find_element(By.CSS_SELECTOR, selector)
        field.clear()
        field.send_keys(value)

    def click(self, selector: str) -> None:
        self.driver.find_element(By.CSS_SELECTOR, selector).click()

    def open_job(self, job_id: str) -> None:
        """Click a job's id in the jobs table (its row must be on the page)."""
        self.wait(lambda: self._job_button(job_id), f"job {job_id} in the list").click()
        self.wait(lambda: self.text("detail-title") == f"Job {job_id}" and self.detail(), f"the detail of {job_id}")

    def _job_button(self, job_id: str) -> WebElement | None:
        for button in self.driver.find_elements(By.CSS_SELECTOR, "#jobs button[data-job-id]"):
            if button.get_attribute("data-job-id") == job_id:
                return button
        return None

    def detail(self) -> dict[str, str]:
        """The detail panel's fields: label -> text."""
        cells = self.driver.execute_script(
            "return Array.from(document.querySelectorAll('#detail-fields > *'), (n) => n.textContent)"
        )
        return dict(zip(cells[::2], cells[1::2], strict=True))

    def confirm(self, accept: bool) -> str:
        """Answer the ``window.confirm`` dialog the page opened; returns its question."""

        def dialog() -> Any:
            try:
                return self.driver.switch_to.alert
            except NoAlertPresentException:
                return None

        alert = self.wait(dialog, "a confirmation dialog", timeout=5)
        question: str = alert.text
        if accept:
            alert.accept()
        else:
            alert.dismiss()
        return question

    def script_errors(self) -> list[str]:
        """What the page's script threw or logged as an error since the last call (failed requests,
        which the page shows to the user, are not counted)."""
        entries = self.driver.get_log("browser")  # type: ignore[no-untyped-call]
        return [e["message"] for e in entries if e["level"] == "SEVERE" and e.get("source") != "network"]


def _installed() -> None:
    """Skip without Chromium and its driver (fail instead under CI=true: these tests must run there)."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        reason = f"{' and '.join(missing)} not installed: apt-get install chromium chromium-driver (.ci/run does)"
        if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
            pytest.fail(f"{reason}; CI=true: the dashboard's browser tests must run")
        pytest.skip(reason)


@contextmanager
def chromium() -> Iterator[Browser]:
    """A fresh headless Chromium (its own empty profile), quit on exit."""
    _installed()
    profile = tempfile.mkdtemp(prefix="corral-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield Browser(driver)
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
