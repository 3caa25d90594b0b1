"""Issue 20 in a real Chromium (Debian's, driven by playwright), on a tiny random Llama: a 2,048-token
text loads in the live page and a change of query answers from the kept run (the time is printed,
not asserted); clicking a generation step shows the tokens its pages hold, their dense weight and
the dense choice; the zh page renders its CJK text; no console error, no request but the page's
own server."""
import time
from pathlib import Path

import pytest
from browser_helpers import CHROMIUM, browser, needs_chromium, open_page  # noqa: F401 (browser: a fixture)

from tiny_models import make_tiny_llama

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
TEXT = "The cat sat on the mat because it was"
OWN = ("/", "/api/explain", "/api/generate", "/api/attention", "/api/heads")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"{CHROMIUM} missing: apt-get install chromium (Debian's build)"),
]




@pytest.fixture(scope="module")
def live_url(tmp_path_factory):
    pytest.importorskip("starlette")
    from gatherlens.serve import ServeSettings, create_app, http_protocol
    from serve_helpers import running_server

    model = str(make_tiny_llama(tmp_path_factory.mktemp("m") / "tiny-llama"))
    settings = ServeSettings(model=model, text=TEXT)
    with running_server(create_app(settings), http=http_protocol(settings)) as url:
        yield url


def _open(browser, url):
    return open_page(browser, url, width=1280, timeout_ms=300000)


def _clean(live_url, requests, errors):
    assert {u.split("?")[0] for u in requests} <= {live_url + p for p in OWN}, requests
    assert errors == [], errors


def test_a_2048_token_text_loads_and_a_query_change_answers(browser, live_url):
    from urllib.parse import quote

    text = "a " * 2046                                                      # [CLS] + 2,046 + [SEP]
    page, requests, errors = _open(browser, f"{live_url}/?text={quote(text)}&k=4")
    assert page.locator('select[name="query"] option').count() == 2048
    legend = page.locator("#fig-04-scores svg text").all_text_contents()
    assert any("rows 2032–2047 and keys 2000–2047 of 2048" in t for t in legend), legend[-3:]
    t0 = time.perf_counter()
    page.select_option('select[name="query"]', "1000")
    page.wait_for_function("() => [...document.querySelectorAll('#fig-04-scores svg text')]"
                           ".some(t => t.textContent.includes('rows 992–1007'))", timeout=60000)
    seconds = time.perf_counter() - t0
    print(f"\n2,048 tokens: query change drawn in {seconds:.3f} s "
          f"(the server's answer as the page timed it: {page.get_attribute('body', 'data-answer-ms')} ms)")
    assert page.locator('.gl-slot[data-slot="query"]').first.inner_text() == "1000"
    assert page.locator("#table-values tbody tr").count() == 4
    compare = page.locator("#fig-06-compare svg text").all_text_contents()
    assert any("query 1000" in t for t in compare) and page.locator(".gl-kc-offline").first.is_hidden()
    assert "2048" in page.locator("#gl-limits").inner_text()
    _clean(live_url, requests, errors)
    page.close()


def _generate_and_click(page, row: int):
    page.fill('input[name="max_new"]', "6")
    page.click('button[name="generate"]')
    page.wait_for_function("() => !document.querySelector('button[name=generate]').disabled"
                           " && document.querySelectorAll('#fig-steps svg').length", timeout=60000)
    y0, ch = 16 + 44, 18                                                     # explore.js: drawSteps' rows
    page.locator("#fig-steps svg").click(position={"x": 40, "y": y0 + row * ch + ch / 2})


PROMPT = "the cat sat on the mat because it was warm and the dog lay by the door " * 3   # past the budget of 16


def test_clicking_a_generation_step_shows_its_tokens(browser, live_url):
    from urllib.parse import quote

    page, requests, errors = _open(browser, f"{live_url}/?text={quote(PROMPT)}")
    _generate_and_click(page, 3)
    detail = page.locator("#gl-step-detail").inner_text()
    assert detail.startswith("step 3 →") and "of this step's dense attention weight" in detail, detail
    assert "With dense attention on the same text so far, the model would choose" in detail
    covered = page.locator("#gl-step-tokens .gl-covered")
    assert 0 < covered.count() < page.locator("#gl-step-tokens .gl-tok").count()   # some tokens, not all
    assert page.locator("#fig-steps .gl-step-picked").count() == 1
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#generate").screenshot(path=str(ARTIFACTS / "generation_step.png"))
    _generate_and_click(page, 0)
    assert "prefill" in page.locator("#gl-step-detail").inner_text()
    _clean(live_url, requests, errors)
    page.close()


def test_zh_page_renders_cjk(browser, live_url):
    page, requests, errors = _open(browser, live_url + "/?lang=zh")
    assert page.get_attribute("html", "lang") == "zh-CN"
    limits = page.locator("#gl-limits")
    assert "限制" in limits.inner_text() and limits.bounding_box()["width"] > 200
    compare = " ".join(page.locator("#fig-06-compare svg text").all_text_contents())
    assert "稠密" in compare and "稀疏" in compare
    _generate_and_click(page, 2)
    assert page.locator("#gl-step-detail").inner_text().startswith("第 2 步")
    width = page.evaluate("() => { const c = document.createElement('canvas').getContext('2d');"
                          " c.font = '16px ' + getComputedStyle(document.body).fontFamily;"
                          " return c.measureText('稠密稀疏').width; }")
    assert width > 40                                                        # four CJK glyphs, not empty boxes of 0
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "serve_long_zh.png"), full_page=False)
    _clean(live_url, requests, errors)
    page.close()
