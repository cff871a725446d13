"""A headless Chromium for the dashboard's browser tests: Debian's ``chromium`` driven by Playwright
for Python through ``executable_path`` (Playwright's own browser download is never used)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def chromium_path() -> str | None:
    """SHARDQ_TEST_CHROMIUM, else the first Chromium on PATH."""
    given = os.environ.get("SHARDQ_TEST_CHROMIUM")
    if given:
        return given
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@contextmanager
def chromium() -> Iterator[Any]:
    """A launched browser; without a Chromium binary (or Playwright) the test skips, or fails under CI
    (scripts/test installs Debian's chromium when it runs as root)."""
    path = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        why = f"Playwright for Python is not installed ({exc})"
        path = None
    else:
        why = "no Chromium binary (install Debian's chromium, or set SHARDQ_TEST_CHROMIUM)"
    if path is None:
        if _in_ci():
            pytest.fail(f"CI needs a browser: {why}", pytrace=False)
        pytest.skip(why)
    with sync_playwright() as playwright:
        # As root, Chromium needs --no-sandbox; elsewhere it is harmless for a throwaway headless run.
        browser = playwright.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()
