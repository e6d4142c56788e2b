"""Headless Chromium for browser tests: Debian's `chromium` and
`chromium-driver` (.ci/ensure-chromium installs them), driven by selenium
through the system chromedriver; nothing is ever downloaded (Selenium
Manager is kept offline). When the binaries are missing a test FAILS under
CI (env CI set) and skips with the reason otherwise, like the PostgreSQL
fixture."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path(os.environ.get("FEDMASK_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("FEDMASK_CHROMEDRIVER", "/usr/bin/chromedriver"))
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,1400")


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@contextmanager
def chromium() -> Iterator[Any]:
    """A selenium Chrome driver on a fresh profile, quit and removed afterwards."""
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        message = f"no {CHROMIUM} and {CHROMEDRIVER} (run .ci/ensure-chromium)"
        if _in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never fetch anything
    profile = tempfile.mkdtemp(prefix="fedmask-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(driver: Any, condition: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    """Poll `condition` (a stale element counts as not yet) until truthy;
    AssertionError naming `what` and the page's status line otherwise."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    def check(_: Any) -> Any:
        try:
            return condition()
        except StaleElementReferenceException:
            return False

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1).until(check)
    except TimeoutException:
        status = driver.find_element("id", "status-msg").text
        raise AssertionError(f"timed out waiting for {what} (status line: {status!r})") from None
