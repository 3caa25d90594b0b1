"""Issue 39 item 1 in a real Chromium, on a tiny random hybrid model (Gemma 3: sliding, global, sliding;
a window of 8) and a text longer than the window: for every layer, the score grid the page draws (offline
report and live page) and GET /api/attention are that layer's own mask, and the picks outlined are never
on a masked key; the sliding layers' window edge, the ring in the compare strip and in pages x steps; en
and zh; no console error."""
import base64
import json
from pathlib import Path
from urllib.parse import quote
from urllib.request import urlopen

import numpy as np
import pytest
from browser_helpers import CHROMIUM, browser, open_page  # noqa: F401 (browser: a fixture)

from tiny_models import HYBRID_TYPES, HYBRID_WINDOW, make_tiny_hybrid

TEXT = "the cat sat on the mat because it was warm and the dog lay by the door all day long"
W = HYBRID_WINDOW
KINDS = [t.split("_")[0] for t in HYBRID_TYPES]          # sliding, full, sliding

pytestmark = [pytest.mark.slow, pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} missing")]


def own_mask(kind: str, S: int) -> np.ndarray:
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    return (j <= i) & ((i - j < W) if kind == "sliding" else True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_hybrid(tmp_path_factory.mktemp("m") / "tiny-hybrid"))


@pytest.fixture(scope="module")
def live_url(model_dir):
    pytest.importorskip("starlette")
    from gatherlens.serve import ServeSettings, create_app, http_protocol
    from serve_helpers import running_server

    settings = ServeSettings(model=model_dir, text=TEXT)
    with running_server(create_app(settings), http=http_protocol(settings)) as url:
        yield url


GRID = """() => [...document.querySelectorAll('#fig-04-scores g.gl-score')].map(g =>
  [+g.dataset.q, +g.dataset.k, +g.dataset.ok, g.classList.contains('gl-kept') ? 1 : 0])"""


def _check_layer(page, layer: int, S: int) -> dict:
    """Select `layer`; the grid's cells equal its own mask, its kept cells lie inside it; returns the cells."""
    page.select_option('select[name="layer"]', str(layer))
    page.wait_for_function(f"() => document.querySelector('#fig-04-scores svg title').textContent.includes('layer {layer},')")
    cells = page.evaluate(GRID)
    mask = own_mask(KINDS[layer], S)
    assert cells and all(bool(mask[q, k]) == bool(ok) for q, k, ok, _ in cells), layer
    kept = [(q, k) for q, k, ok, kp in cells if kp]
    assert kept and all(mask[q, k] for q, k in kept), layer                   # picks never on masked keys
    title = page.locator("#fig-04-scores svg title").text_content()
    assert ("sliding 8" in title) == (KINDS[layer] == "sliding") and ("global" in title) == (KINDS[layer] == "full")
    assert (page.locator("#fig-04-scores .gl-window-edge").count() > 0) == (KINDS[layer] == "sliding")
    return {(q, k): ok for q, k, ok, _ in cells}


def test_offline_report_draws_each_layers_own_mask(browser, model_dir, tmp_path):
    from gatherlens.models import load
    from gatherlens.report.build import write_report
    from gatherlens.report.collect import collect

    story = collect(load(model_dir), TEXT, top_k=3)
    write_report(story, tmp_path / "r")
    page, _, errors = open_page(browser, tmp_path / "r" / "index.html")
    for layer in (1, 0, 2):
        _check_layer(page, layer, len(story.ids))
    assert errors == [], errors
    page.close()


def test_live_page_and_api_agree_with_each_layers_own_mask(browser, live_url):
    page, _, errors = open_page(browser, f"{live_url}/?text={quote(TEXT)}&k=3", timeout_ms=120000)
    S = page.locator('select[name="query"] option').count()
    for layer in (1, 0, 2):
        drawn = _check_layer(page, layer, S)
        body = json.load(urlopen(f"{live_url}/api/attention?text={quote(TEXT)}&k=3&layer={layer}&head=0&query=-1"))
        w = body["window"]
        r0, r1 = w["rows"]
        finite = np.isfinite(np.frombuffer(base64.b64decode(w["scores"]), "<f4").reshape(r1 - r0, S))
        assert np.array_equal(finite, own_mask(KINDS[layer], S)[r0:r1])
        assert all(drawn[q, k] == finite[q - r0, k] for (q, k) in drawn if r0 <= q < r1)
        page.wait_for_function("() => document.querySelector('#fig-06-compare svg title')"
                               f".textContent.includes('layer {layer},')", timeout=60000)
        strips = " ".join(page.locator("#fig-06-compare svg text").all_text_contents())
        assert ("ring: 8 keys" in strips) == (KINDS[layer] == "sliding"), strips
    assert errors == [], errors
    page.close()


def test_pages_x_steps_draws_the_ring_of_a_sliding_layer_in_zh(browser, live_url):
    page, _, errors = open_page(browser, f"{live_url}/?text={quote(TEXT)}&k=3&layer=0&lang=zh", timeout_ms=120000)
    assert page.locator('select[name="layer"] option').first.inner_text() == "0 · 滑动窗口 8"
    page.fill('input[name="max_new"]', "4")
    page.click('button[name="generate"]')
    page.wait_for_function("() => !document.querySelector('button[name=generate]').disabled"
                           " && document.querySelectorAll('#fig-steps svg').length", timeout=120000)
    assert page.locator("#fig-steps .gl-ring").count() >= 4 * (W // 4)       # every step: the pages of its ring
    assert "环里" in page.locator("#gl-ring-note").inner_text()
    page.select_option('select[name="layer"]', "1")
    page.wait_for_function("() => document.querySelectorAll('#fig-steps .gl-ring').length === 0")
    assert page.locator("#gl-ring-note").inner_text() == ""
    assert errors == [], errors
    page.close()
