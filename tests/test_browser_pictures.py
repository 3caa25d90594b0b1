"""Issue 39 items 3 and 4 in a real Chromium: the model map at the top of the page (each tag a link to the
figure that draws its gather, the tag of the section in view marked, the model's own apart from gatherlens'
change), the MoE routing picture (tiny random Mixtral: a tap on a picked cell lights its expert's row) and the
RoPE row gather (its output cells point at the cos table's rows); en and zh, offline and live; no console error."""
from pathlib import Path
from urllib.parse import quote

import pytest
from browser_helpers import CHROMIUM, browser, open_page  # noqa: F401 (browser: a fixture)

from tiny_models import make_tiny_hybrid, make_tiny_moe

TEXT = "the cat sat on the mat because it was warm and the dog lay by the door all day long"

pytestmark = [pytest.mark.slow, pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} missing")]


@pytest.fixture(scope="module")
def mixtral_dir(tmp_path_factory):
    return str(make_tiny_moe(tmp_path_factory.mktemp("m") / "tiny-mixtral", "mixtral"))


@pytest.mark.parametrize("lang, expert, ours", [("en", "expert 2", "gatherlens' change"),
                                                ("zh", "专家 2", "gatherlens 的改动")])
def test_map_moe_and_rope_pictures_offline(browser, mixtral_dir, tmp_path, lang, expert, ours):
    from gatherlens.models import load
    from gatherlens.report.build import write_report
    from gatherlens.report.collect import collect

    write_report(collect(load(mixtral_dir), TEXT, top_k=3), tmp_path / "r", lang=lang)
    page, requests, errors = open_page(browser, tmp_path / "r" / "index.html")
    assert page.locator("main section").first.get_attribute("id") == "map"          # the map comes first
    tags = page.locator("#fig-00-model-map a.gl-map-gather")
    assert tags.count() == 6 and page.locator("#fig-00-model-map a.gl-ours").count() == 2
    assert ours in page.locator("#fig-00-model-map svg").text_content()
    page.locator('#fig-00-model-map a[data-key="moe"]').click()
    page.wait_for_function("() => location.hash === '#moe'")
    page.wait_for_function("() => document.querySelector('#fig-00-model-map a[data-key=moe]').classList.contains('gl-here')")
    picked = page.locator('#fig-07-moe-routing .gl-cell[data-src="ex-2"]').first
    picked.click()                                                                     # a tap, as on a phone
    assert expert in page.locator("#fig-07-moe-routing .gl-info").inner_text()
    assert page.locator('#fig-07-moe-routing .gl-cell.hl[data-key="ex-2"]').count() == 1   # its expert's row lit
    page.locator('#fig-00-model-map a[data-key="rope"]').click()
    page.wait_for_function("() => document.querySelector('#fig-00-model-map a[data-key=rope]').classList.contains('gl-here')")
    out = page.locator('#fig-02-rope .gl-cell[data-src="src-5-0"]').first
    out.hover()
    assert "cos_table[5, 0]" in page.locator("#fig-02-rope .gl-info").inner_text()
    assert page.locator('#fig-02-rope .gl-cell.hl[data-key="src-5-0"]').count() == 1
    assert all(u.startswith("file:") for u in requests) and errors == [], (requests, errors)
    page.close()


def test_live_map_sends_sparse_pages_to_generate(browser, tmp_path_factory):
    pytest.importorskip("starlette")
    from gatherlens.serve import ServeSettings, create_app, http_protocol
    from serve_helpers import running_server

    model = str(make_tiny_hybrid(tmp_path_factory.mktemp("h") / "tiny-hybrid"))
    settings = ServeSettings(model=model, text=TEXT)
    with running_server(create_app(settings), http=http_protocol(settings)) as url:
        page, _, errors = open_page(browser, f"{url}/?text={quote(TEXT)}&k=3&lang=zh", timeout_ms=120000)
        tag = page.locator('#fig-00-model-map a[data-key="pages"]')
        assert tag.get_attribute("href") == "#generate" and "稀疏页" in tag.text_content()
        assert page.locator('#fig-00-model-map [data-key="scale"]').count() == 1        # Gemma's scaled rows
        tag.click()
        page.wait_for_function("() => document.body.getAttribute('data-here') === 'generate'")
        assert errors == [], errors
        page.close()
