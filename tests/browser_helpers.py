"""The one home of the browser tests' setup: Debian's chromium through playwright, a page that
records every request and console error.

    from browser_helpers import CHROMIUM, browser, needs_chromium, open_page   # browser: a fixture
    page, requests, errors = open_page(browser, path_or_url)
"""
from __future__ import annotations

from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
needs_chromium = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                    reason=f"{CHROMIUM} missing: apt-get install chromium (Debian's build)")


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright missing: pip install playwright")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield b
        b.close()


def open_page(browser, where, width: int = 1280, timeout_ms: float = 30000):
    """A new page on `where` (a Path or a URL), loaded: (page, requested URLs, console errors)."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    requests, errors = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(where.as_uri() if isinstance(where, Path) else where, timeout=timeout_ms)
    page.wait_for_load_state("load")
    return page, requests, errors
