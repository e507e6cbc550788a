"""The console's browser for its end-to-end tests: headless Chromium (Debian's `chromium` and
`chromium-driver`, which `make install` installs) driven by Selenium, and the waits and lookups
the console's test modules share. Every wait has a deadline (WebDriverWait); nothing sleeps."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
# Without a network, Chromium waits on refused connections (updates, sync, QUIC probes): these
# flags keep it from trying any.
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1280,1000",
]
WAIT_SECONDS = 60.0


@contextmanager
def chromium(profile: Path, downloads: Path) -> Iterator[WebDriver]:
    """A headless Chromium with its own profile, saving downloads to `downloads` without asking
    (skipped, or failed on CI, when the browser is not installed)."""
    if not (Path(CHROMIUM).is_file() and Path(CHROMEDRIVER).is_file()):
        message = "chromium and chromedriver are missing: `make install` installs Debian's chromium and chromium-driver"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                              "download.prompt_for_download": False})
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    try:
        yield driver
    finally:
        driver.quit()


def until(driver: WebDriver, condition: Callable[[WebDriver], Any], message: str, timeout: float = WAIT_SECONDS) -> Any:
    def checked(d: WebDriver) -> Any:
        try:
            return condition(d)
        except StaleElementReferenceException:  # the page redrew the element: look again
            return None
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(checked, message)
    except TimeoutException:
        # What the page showed, for the failure's message: its error line and a screenshot.
        shot = Path(os.environ.get("CONSOLE_SCREENSHOTS") or "/tmp") / "console-timeout.png"
        driver.save_screenshot(str(shot))
        error = driver.find_elements(By.ID, "error")
        shown = error[0].text if error else ""
        raise AssertionError(f"timed out after {timeout} s waiting for {message}; page error: {shown!r}; "
                             f"url {driver.current_url}; screenshot {shot}") from None


def by_id(driver: WebDriver, element_id: str) -> WebElement:
    return driver.find_element(By.ID, element_id)


def visible(driver: WebDriver, element_id: str) -> bool:
    return by_id(driver, element_id).is_displayed()


def batch_row(driver: WebDriver, batch_id: str) -> WebElement | None:
    rows = driver.find_elements(By.CSS_SELECTOR, f'#batches-table tr[data-batch-id="{batch_id}"]')
    return rows[0] if rows else None


def row_progress(driver: WebDriver, batch_id: str) -> tuple[int, int] | None:
    row = batch_row(driver, batch_id)
    if row is None:
        return None
    bar = row.find_element(By.TAG_NAME, "progress")
    return int(float(bar.get_attribute("value"))), int(float(bar.get_attribute("max")))


def sign_in(driver: WebDriver, origin: str, key: str) -> None:
    driver.get(origin + "/")
    if not visible(driver, "sign-in-view"):
        return
    field = by_id(driver, "api-key")
    field.clear()
    field.send_keys(key)
    by_id(driver, "sign-in-form").submit()
    until(driver, lambda d: visible(d, "batches-view"), "the batches view after signing in")


def open_batch(driver: WebDriver, origin: str, batch_id: str) -> None:
    driver.get(f"{origin}/#/batches/{batch_id}")
    until(driver, lambda d: visible(d, "batch-view") and by_id(d, "batch-title").text == batch_id
          and by_id(d, "batch-view").get_attribute("aria-busy") == "false", "the batch view loaded")


def result_rows(driver: WebDriver) -> list[WebElement]:
    return driver.find_elements(By.CSS_SELECTOR, "#results-table tbody tr")


def screenshot(driver: WebDriver, shots: Path, name: str) -> None:
    driver.save_screenshot(str(shots / f"{name}.png"))


def csp_violations(driver: WebDriver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if "Content Security Policy" in entry["message"]]
