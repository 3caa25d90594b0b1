"""Issue 39 item 5 on a phone-sized screen (400 x 800, touch) in a real Chromium: no sideways page scroll,
the sticky control bar at most 12% of the screen and opaque, figures scaled to the width, a tap in place of
a hover (the score grid's cell line, the gather figures' hover), and the live page's en/zh switch; en and zh,
no console error. A tiny random hybrid Gemma 3 (sliding, global, sliding)."""
from pathlib import Path
from urllib.parse import quote

import pytest
from browser_helpers import CHROMIUM, browser  # noqa: F401 (browser: a fixture)

from tiny_models import make_tiny_hybrid

TEXT = "the cat sat on the mat because it was warm and the dog lay by the door all day long"

pytestmark = [pytest.mark.slow, pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} missing")]

LAYOUT = """() => {
  const d = document.documentElement, bar = document.getElementById('gl-controls');
  const bg = getComputedStyle(bar).backgroundColor;
  const figs = [...document.querySelectorAll('.figure > svg, .gl-draw > svg, .gatherlens > svg')]
    .map(s => s.getBoundingClientRect()).filter(r => r.width > 0);
  return {scroll: d.scrollWidth - d.clientWidth, bar: bar.getBoundingClientRect().height / window.innerHeight,
          opaque: !bg.startsWith('rgba') || bg.endsWith(', 1)'), figs: figs.length,
          widest: Math.max(...figs.map(r => r.right))};
}"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_hybrid(tmp_path_factory.mktemp("m") / "tiny-hybrid"))


def _phone(browser, where):
    page = browser.new_page(viewport={"width": 400, "height": 800}, is_mobile=True, has_touch=True)
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(where.as_uri() if isinstance(where, Path) else where, timeout=120000)
    page.wait_for_load_state("load")
    return page, errors


def _check_layout(page):
    m = page.evaluate(LAYOUT)
    assert m["scroll"] <= 0, m                                    # no sideways scroll of the page
    assert m["bar"] <= 0.12 and m["opaque"], m                    # a compact, opaque control bar
    assert m["figs"] >= 5 and m["widest"] <= 400, m               # figures scaled to the screen


@pytest.mark.parametrize("lang, cell", [("en", "query 21"), ("zh", "查询 21")])
def test_offline_report_on_a_phone(browser, model_dir, tmp_path, lang, cell):
    from gatherlens.models import load
    from gatherlens.report.build import write_report
    from gatherlens.report.collect import collect

    write_report(collect(load(model_dir), TEXT, top_k=3, layer=1), tmp_path / "r", lang=lang)
    page, errors = _phone(browser, tmp_path / "r" / "index.html")
    _check_layout(page)
    grid = page.locator("#fig-04-scores svg")
    grid.scroll_into_view_if_needed()
    box = grid.bounding_box()
    page.touchscreen.tap(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.85)   # a cell, scaled
    line = page.locator("#fig-04-scores .gl-figinfo").inner_text()
    assert cell in line or line.startswith(("query", "查询")), line
    fig = page.locator("#fig-01-embedding .gl-cell[data-src]").first
    fig.scroll_into_view_if_needed()
    fig.tap()
    assert page.locator("#fig-01-embedding .gl-info").inner_text() != ""   # a tap shows where it came from
    assert errors == [], errors
    page.close()


def test_live_page_on_a_phone_switches_language(browser, model_dir):
    pytest.importorskip("starlette")
    from gatherlens.serve import ServeSettings, create_app, http_protocol
    from serve_helpers import running_server

    settings = ServeSettings(model=model_dir, text=TEXT)
    with running_server(create_app(settings), http=http_protocol(settings)) as url:
        page, errors = _phone(browser, f"{url}/?text={quote(TEXT)}&k=3")
        _check_layout(page)
        assert page.get_attribute("html", "lang") == "en"
        with page.expect_navigation(timeout=120000):
            page.select_option('select[name="lang"]', "zh")
        assert page.get_attribute("html", "lang") == "zh-CN"
        assert page.locator('select[name="layer"] option').first.inner_text() == "0 · 滑动窗口 8"
        assert page.locator("textarea#gl-text").input_value() == TEXT       # the same text, now in Chinese
        _check_layout(page)
        assert errors == [], errors
        page.close()
