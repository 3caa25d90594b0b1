"""The sparse-prefill section in a real Chromium (Debian's, driven by playwright), on a tiny random Llama: the
offline page (en and zh) draws the block map of the chosen layer and head, the blocks it colours are the
model's, the layer and head controls redraw it, hovering a block names its tokens; the live page shows the
section once its checkbox is ticked. No console error, no request but the page's own."""
from pathlib import Path

import pytest
from browser_helpers import browser, needs_chromium, open_page  # noqa: F401 (browser: a fixture)

from gatherlens.ops.prefill.config import TOY
from tiny_models import make_tiny_llama

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
TEXT = ("It is a truth universally acknowledged, that a single man in possession of a good fortune must be in "
        "want of a wife. ") * 3                                              # 77 tokens: 5 blocks of 16
CHOOSING = TOY.replace(threshold=None, budget=3)

pytestmark = [pytest.mark.browser, needs_chromium]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_llama(tmp_path_factory.mktemp("m") / "tiny3", layers=3))


@pytest.fixture(scope="module")
def story(model_dir):
    from gatherlens.models import load
    from gatherlens.report.collect import collect

    return collect(load(model_dir), TEXT, top_k=2, layer=1, head=3, prefill=CHOOSING)


def _drawn(page) -> tuple[int, int]:
    """(gathered, skipped) blocks the drawn map colours: the widths of its runs, in blocks."""
    def blocks(cls):
        return sum(int(n) for n in page.eval_on_selector_all(
            f"#fig-prefill-map .{cls}", "els => els.map(e => e.getAttribute('data-n'))"))
    return blocks("gl-pf-kept"), blocks("gl-pf-skipped")


def _want(story, layer: int, group: int) -> tuple[int, int]:
    sel = story.prefill.selections[layer]
    kept, allowed = int(sel.blocks[0, group].sum()), int(sel.allowed().sum())
    return kept, allowed - kept


@pytest.mark.parametrize("lang,title,hover", [("en", "layer 1, head 3 (KV head 1)", "query block 4 (tokens 64–76)"),
                                              ("zh", "第 1 层，头 3（键/值头 1）", "查询块 4（token 64–76）")])
def test_offline_map_follows_layer_and_head(browser, story, tmp_path, lang, title, hover):
    from gatherlens.report.build import write_report

    write_report(story, tmp_path / "rep", lang=lang)
    page, requests, errors = open_page(browser, tmp_path / "rep" / "index.html", width=1200)
    fig = page.locator("#fig-prefill-map")
    assert title in fig.locator(".gl-fig-title").text_content()
    assert _drawn(page) == _want(story, 1, 1)
    assert page.locator('.gl-slot[data-slot="pf_kept"]').inner_text() == str(_want(story, 1, 1)[0])
    page.select_option('select[name="layer"]', "2")
    page.select_option('select[name="head"]', "0")
    assert _drawn(page) == _want(story, 2, 0)
    share = story.prefill.shares(2)[0]
    assert f"{share:.0%}" in fig.locator(".gl-fig-title").text_content()
    assert page.locator('.gl-slot[data-slot="pf_share"]').inner_text() == f"{share:.0%}"
    assert page.locator('.gl-slot[data-slot="pf_group"]').inner_text() == "0"
    fig.scroll_into_view_if_needed()
    box = fig.locator("svg").bounding_box()
    cw = min(28, 560 // 5)
    rect = page.eval_on_selector("#fig-prefill-map .gl-pf-kept", "e => [+e.getAttribute('x'), +e.getAttribute('y')]")
    page.mouse.move(box["x"] + rect[0] + cw / 2, box["y"] + rect[1] + 4 * cw + cw / 2)   # the last query block's row
    assert hover in fig.locator(".gl-figinfo").inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#prefill").screenshot(path=str(ARTIFACTS / f"browser_prefill_{lang}.png"))
    assert all(u.startswith(("file://", "data:")) for u in requests), requests
    assert errors == [], errors
    page.close()


def test_live_page_shows_the_map_when_its_checkbox_is_ticked(browser, model_dir):
    pytest.importorskip("starlette")
    from gatherlens.serve import ServeSettings, create_app, http_protocol
    from serve_helpers import running_server

    settings = ServeSettings(model=model_dir, text=TEXT)
    with running_server(create_app(settings), http=http_protocol(settings)) as url:
        page, requests, errors = open_page(browser, url + "/", width=1280, timeout_ms=120000)
        assert page.locator("#prefill").count() == 0
        page.check('input[name="prefill"]')
        page.wait_for_function("() => document.querySelectorAll('#fig-prefill-map .gl-pf-kept').length",
                               timeout=60000)
        assert page.is_checked('input[name="prefill"]')                      # the fresh page keeps the choice
        kept, skipped = _drawn(page)
        assert kept + skipped == 15 and kept >= 5                            # 5 blocks a side; the sink column kept
        page.select_option('select[name="layer"]', "0")
        assert "layer 0" in page.locator("#fig-prefill-map .gl-fig-title").text_content()
        assert {u.split("?")[0] for u in requests} <= {url + p for p in ("/", "/api/explain", "/api/attention")}
        assert errors == [], errors
        page.close()
