"""Headless system Chromium through selenium, for the browser tests
(tests/chromium_driver.py) and `make screenshot` (scripts/dashboard_screenshot.py).

Debian's `chromium` and `chromium-driver` (.ci/ensure-chromium installs them;
FEDMASK_CHROMIUM / FEDMASK_CHROMEDRIVER name others). Nothing is ever
downloaded: Selenium Manager is kept offline. The flags keep a closed
network quiet (no background connections, no QUIC, no sync).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = Path(os.environ.get("FEDMASK_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("FEDMASK_CHROMEDRIVER", "/usr/bin/chromedriver"))
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage")


def available() -> bool:
    """Both binaries are there and executable."""
    return os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)


@contextmanager
def driver(*extra_flags: str) -> Iterator[Any]:
    """A selenium Chrome driver with FLAGS and `extra_flags` on a fresh profile,
    quit and its profile removed afterwards. The caller checks `available()`."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never fetch anything
    profile = tempfile.mkdtemp(prefix="fedmask-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, *extra_flags, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    d = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield d
    finally:
        d.quit()
        shutil.rmtree(profile, ignore_errors=True)
