"""The HTML page in a real Chromium (Debian's, driven by playwright): it renders, fetches
nothing, logs no error, and hovering an output cell highlights its source and index cells."""
from pathlib import Path

import pytest
import torch

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"{CHROMIUM} missing: apt-get install chromium (Debian's build)"),
]


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright missing: pip install playwright")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield b
        b.close()


def _open(browser, path: Path):
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    requests, errors = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, requests, errors


def _classes(page, key):
    return page.get_attribute(f'[data-key="{key}"]', "class") or ""


def test_page_renders_offline_and_hover_highlights(browser, tmp_path):
    from gatherlens.trace import record_embedding

    W = torch.arange(40.0).view(10, 4)  # (V, d)
    rec = record_embedding(torch.tensor([[3, 1, 4]]), W,
                           labels=["The", "<script>alert(1)</script>", "sat"])
    path = tmp_path / "embedding.html"
    path.write_text(rec.to_html(), encoding="utf-8")
    page, requests, errors = _open(browser, path)
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))

    assert page.locator("svg.gl-figure").count() == 1
    assert page.locator(".gl-cell").count() > 40
    box = page.locator("svg.gl-figure").bounding_box()
    assert box and box["width"] > 300 and box["height"] > 200
    # the token is text: shown, never run
    assert "<script>alert(1)</script>" in page.locator("svg.gl-figure").text_content()
    assert page.locator("script").count() == 1  # only the page's own hover script

    out = page.locator('[data-key="out-0-1-2"]')  # token 1 ("<script>...", id 1), column 2
    assert out.get_attribute("data-src") == "src-1-2"
    assert "hl" not in _classes(page, "src-1-2")
    out.hover()
    assert "hl" in _classes(page, "out-0-1-2")
    assert "hl" in _classes(page, "src-1-2")
    assert "hl" in _classes(page, "idx-0-1-0")
    assert "hl" not in _classes(page, "src-3-2")
    assert "emb[0, 1, 2] = 6 ← W[1, 2]" in page.locator(".gl-info").inner_text()
    stroke = page.eval_on_selector('[data-key="src-1-2"] rect',
                                   "e => getComputedStyle(e).strokeWidth")
    assert stroke in ("3px", "3")

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "browser_embedding_hover.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 5000

    page.mouse.move(1, 1)  # leaving clears the highlight
    assert "hl" not in _classes(page, "src-1-2")

    assert all(u.startswith(("file://", "data:")) for u in requests), requests
    assert errors == [], errors
    assert dialogs == []
    page.close()


def test_mistakes_page_in_chinese(browser, tmp_path):
    from gatherlens.render.mistakes import mistakes_html

    path = tmp_path / "mistakes.html"
    path.write_text(mistakes_html("zh"), encoding="utf-8")
    page, requests, errors = _open(browser, path)
    assert "RuntimeError" in page.content()
    page.locator('[data-key="b2-out-0-1"]').hover()  # the silent W.gather(0, ids), token 1
    assert "hl" in _classes(page, "b2-src-2-1")      # row ids[1] = 2, column 1: one scalar
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "browser_mistakes_zh.png"), full_page=True)
    assert all(u.startswith(("file://", "data:")) for u in requests), requests
    assert errors == [], errors
    page.close()
