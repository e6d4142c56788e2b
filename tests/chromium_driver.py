"""Headless Chromium for browser tests: Debian's `chromium` and
`chromium-driver` (.ci/ensure-chromium installs them), driven by selenium
through the system chromedriver; nothing is ever downloaded (Selenium
Manager is kept offline). When the binaries are missing a test FAILS under
CI (env CI set) and skips with the reason otherwise, like the PostgreSQL
fixture."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest


def _load_headless_chromium() -> Any:
    """scripts/headless_chromium.py: the one place the driver is built (also for `make screenshot`)."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "headless_chromium.py"
    spec = importlib.util.spec_from_file_location("headless_chromium", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("headless_chromium", mod)
    spec.loader.exec_module(mod)
    return mod


_hc = _load_headless_chromium()
CHROMIUM: Path = _hc.CHROMIUM
CHROMEDRIVER: Path = _hc.CHROMEDRIVER


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@contextmanager
def chromium() -> Iterator[Any]:
    """A selenium Chrome driver on a fresh profile, quit and removed afterwards."""
    if not _hc.available():
        message = f"no {CHROMIUM} and {CHROMEDRIVER} (run .ci/ensure-chromium)"
        if _in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    with _hc.driver("--window-size=1280,1400") as driver:
        yield driver


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
