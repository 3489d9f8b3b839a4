"""Playwright driving Debian's Chromium (``scripts/browser`` installs it) against real
server and Worker processes. Playwright never downloads a browser here: it launches
``/usr/bin/chromium``; where that is missing, these tests are skipped with the reason (a
skip that fails ``scripts/test`` and CI: ``tests.support.skips``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.support.rig import rig, worker_language

__all__ = ["rig", "worker_language"]

CHROMIUM = Path(os.environ.get("DEX_TEST_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).parents[2] / "artifacts" / "screenshots"
TIMEOUT_MS = 15_000
"""How long any wait on the page may take before the test fails."""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: run scripts/browser")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    expect.set_options(timeout=TIMEOUT_MS)
    opened = context.new_page()
    refused: list[str] = []  # what the console's Content-Security-Policy kept from running
    opened.on(
        "console",
        lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None,
    )
    yield opened
    context.close()
    assert refused == [], refused


def screenshot(page: Page, name: str) -> None:
    """Keep what the page looks like now (artifacts/screenshots, not committed)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / f"{name}.png", full_page=True)
