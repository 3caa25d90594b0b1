"""The HTML page in a real Chromium (Debian's, driven by playwright): it renders, fetches
nothing, logs no error, and hovering an output cell highlights its source and index cells."""
from pathlib import Path

import pytest
from browser_helpers import CHROMIUM, browser, needs_chromium, open_page  # noqa: F401 (browser: a fixture)
import torch

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"{CHROMIUM} missing: apt-get install chromium (Debian's build)"),
]




def _open(browser, path):
    return open_page(browser, path, width=1200)


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


# -- the explorable report and the live explorer (a tiny random Llama: 2 layers, 4 heads over 2 KV) --
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tiny_models import make_tiny_llama

    return str(make_tiny_llama(tmp_path_factory.mktemp("m") / "tiny-llama"))


EXPLORE_TEXT = "The cat sat on the mat because it was"


def _expected_keys(story, layer, head, query, k):
    """The keys the page must show: top-k of the scores it carries, as it decodes them (8-bit codes
    per row, report/explore.py), ties to the lower key."""
    row = story.explore.stored_scores()[layer, head, query]                   # (L,)
    keys = [j for j in range(row.numel()) if row[j] > float("-inf")]
    return sorted(keys, key=lambda j: (-float(row[j]), j))[:k]


def _svg_titles(page):
    return page.locator(".gl-fig-title").all_text_contents()


def test_offline_report_follows_layer_head_query_and_k(browser, tiny_model, tmp_path):
    from gatherlens.models import load
    from gatherlens.report.build import write_report
    from gatherlens.report.collect import collect

    story = collect(load(tiny_model), EXPLORE_TEXT, top_k=2, layer=1, head=3)
    write_report(story, tmp_path / "rep")
    page, requests, errors = _open(browser, tmp_path / "rep" / "index.html")
    S = len(story.ids)
    assert any("layer 1, head 3" in t for t in _svg_titles(page))
    assert page.locator("#fig-04-scores .gl-kept-outline").count() == sum(min(2, i + 1) for i in range(S))
    run_keys = [int(x) for x in page.locator("#table-values tbody tr td:first-child").all_text_contents()]
    assert run_keys == story.attention.indices[-1].tolist()                    # the model's own picks
    assert "what the model ran with" in page.locator("#gl-knote").inner_text()

    page.select_option('select[name="layer"]', "0")
    page.select_option('select[name="head"]', "2")
    page.select_option('select[name="query"]', "6")
    page.fill('input[name="k"]', "4")
    titles = _svg_titles(page)
    assert len(titles) == 4 and all("layer 0, head 2" in t for t in titles), titles
    assert any("top-4" in t for t in titles) and any("query 6" in t for t in titles)
    keys = [int(x) for x in page.locator("#table-values tbody tr td:first-child").all_text_contents()]
    assert keys == _expected_keys(story, 0, 2, 6, 4)
    assert page.locator("#fig-04-scores .gl-kept-outline").count() == sum(min(4, i + 1) for i in range(S))
    note = page.locator("#gl-knote").inner_text()
    assert "selection k would make from this run's scores" in note and "top-2" in note
    assert page.locator('.gl-slot[data-slot="layer"]').first.inner_text() == "0"
    assert page.locator('.gl-slot[data-slot="query"]').first.inner_text() == "6"
    page.locator("#fig-04-scores svg").click(position={"x": 5, "y": 5})     # outside the grid: no change
    assert page.input_value('select[name="query"]') == "6"
    assert all(u.startswith(("file://", "data:")) for u in requests), requests
    assert errors == [], errors
    page.close()


@pytest.fixture(scope="module")
def live_url(tiny_model):
    from gatherlens.serve import ServeSettings, create_app
    from serve_helpers import running_server

    with running_server(create_app(ServeSettings(model=tiny_model, text=EXPLORE_TEXT))) as url:
        yield url


def _open_url(browser, url):
    return open_page(browser, url, width=1280)


def test_served_page_updates_as_you_type_and_generates(browser, live_url):
    page, requests, errors = _open_url(browser, live_url + "/")
    assert "was" in page.locator(".chip").all_inner_texts()
    page.select_option('select[name="layer"]', "0")
    page.locator('textarea[name="text"]').fill("A dog ran in the park")
    page.wait_for_function("() => [...document.querySelectorAll('.chip')].some(c => c.textContent === 'dog')",
                           timeout=60000)
    assert "was" not in page.locator(".chip").all_inner_texts()
    assert all("layer 0" in t for t in _svg_titles(page))                      # the reader's layer is kept
    page.fill('input[name="max_new"]', "6")
    page.click('button[name="generate"]')
    page.wait_for_function("() => !document.querySelector('button[name=generate]').disabled"
                           " && document.querySelectorAll('#fig-steps svg').length", timeout=60000)
    assert "6 tokens generated" in page.locator("#gl-gen-status").inner_text()
    rows = page.locator("#fig-steps text").all_text_contents()
    assert sum(t.startswith(("1 ", "5 ")) for t in rows) == 2                  # a row per step
    assert page.locator("#fig-steps .gl-read").count() > 6                    # the pages each step read
    assert page.locator("#gl-gen-text").inner_text().startswith("A dog ran in the park")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "serve_live.png"), full_page=True)
    assert {u.split("?")[0] for u in requests} <= {live_url + p for p in ("/", "/api/explain", "/api/generate", "/api/attention")}
    assert errors == [], errors
    page.close()
