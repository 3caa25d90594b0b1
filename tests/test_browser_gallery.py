"""The head gallery in a real Chromium (Debian's, driven by playwright), on SmolLM2: the offline
report lists every one of its 30 x 9 heads, and clicking one switches the sections below to that
layer and head; the same on the live `gatherlens serve` page in Chinese. No console error, no
request outside the page (offline) or its server (live)."""
from pathlib import Path

import pytest
from browser_helpers import CHROMIUM, browser, needs_chromium, open_page  # noqa: F401 (browser: a fixture)
from installed import installed

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
DRAWN = ("03-heads", "04-scores", "05-score-gather", "06-value-gather")   # the figures drawn per head
TEXT = "The cat sat on the mat. The cat sat on the hat because it was"

pytestmark = [
    pytest.mark.browser, pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"{CHROMIUM} missing: apt-get install chromium (Debian's build)"),
]




@pytest.fixture(scope="module")
def smollm2():
    from gatherlens.models import load

    installed("smollm2")  # skips only when the model package is missing
    return load("smollm2")


def _open(browser, url):
    return open_page(browser, url, width=1320)


def _click_opens(page, layer: int, head: int, title_words: str):
    """Click the thumbnail of (layer, head): the controls, every drawn figure and the outline follow."""
    tile = page.locator(f'#fig-02-heads-gallery .gl-thumb[data-layer="{layer}"][data-head="{head}"]')
    tile.locator('use[href="#gl-frame"]').click()          # its frame (the map's box holds the whole atlas)
    assert page.input_value('select[name="layer"]') == str(layer)
    assert page.input_value('select[name="head"]') == str(head)
    titles = [page.locator(f"#fig-{name} .gl-fig-title").text_content() for name in DRAWN]
    assert all(title_words in t for t in titles), titles
    assert page.locator(".gl-thumb.gl-chosen").count() == 1
    assert "gl-chosen" in tile.get_attribute("class")
    assert page.get_attribute(".gl-gallery-sel", "transform") == tile.get_attribute("transform")
    assert page.locator('.gl-slot[data-slot="layer"]').first.inner_text() == str(layer)


def _every_head(page) -> list[tuple[int, int]]:
    pairs = page.eval_on_selector_all("#fig-02-heads-gallery .gl-thumb",
                                      "els => els.map(e => [+e.dataset.layer, +e.dataset.head])")
    return sorted(tuple(p) for p in pairs)


def test_gallery_lists_every_head_and_a_click_opens_it(browser, smollm2, tmp_path):
    from gatherlens.report.build import write_report
    from gatherlens.report.collect import collect
    from gatherlens.serve import ServeSettings, create_app
    from serve_helpers import running_server

    story = collect(smollm2, TEXT, top_k=4)
    write_report(story, tmp_path / "rep")
    page, requests, errors = _open(browser, (tmp_path / "rep" / "index.html").as_uri())
    assert _every_head(page) == [(l, h) for l in range(30) for h in range(9)]        # 270 heads
    assert page.locator(".gl-thumb.gl-chosen").get_attribute("data-layer") == "15"  # the report's head
    _click_opens(page, 7, 4, "layer 7, head 4")
    page.locator('.gl-thumb[data-layer="3"][data-head="1"] use[href="#gl-frame"]').hover()
    assert "layer 3, head 1:" in page.locator("#fig-02-heads-gallery .gl-figinfo").inner_text()
    page.select_option('select[name="layer"]', "22")                              # and back: the controls
    assert page.locator(".gl-thumb.gl-chosen").get_attribute("data-layer") == "22"  # move the outline
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#fig-02-heads-gallery").screenshot(path=str(ARTIFACTS / "browser_gallery.png"))
    assert all(u.startswith(("file://", "data:")) for u in requests), requests
    assert errors == [], errors
    page.close()

    settings = ServeSettings(model="smollm2", text=TEXT)
    with running_server(create_app(settings, loader=lambda name: smollm2)) as url:
        page, requests, errors = _open(browser, url + "/?lang=zh")
        assert page.locator("textarea").count() == 1 and page.locator("#user-text").count() == 0
        assert _every_head(page) == [(l, h) for l in range(30) for h in range(9)]
        assert "头 8" in page.locator("#fig-02-heads-gallery").inner_text()
        _click_opens(page, 29, 8, "第 29 层，头 8")
        assert all(u.startswith(url) for u in requests), requests
        assert errors == [], errors
        page.close()
