"""Issue 39 item 2 in a real Chromium, on a tiny random hybrid Gemma 3 with a plain chat template: the sampling
picture follows its sliders (GET /api/sample), the chat sends a message through the chat template and each token
of the reply, clicked, shows the candidates it was drawn from and the pages the chosen layer read; en and zh;
no console error, no request but the page's own server."""
from pathlib import Path
from urllib.parse import quote

import pytest
from browser_helpers import CHROMIUM, browser, open_page  # noqa: F401 (browser: a fixture)

from tiny_models import make_tiny_hybrid

TEXT = "the cat sat on the mat because it was warm and the dog lay by the door all day long"
OWN = ("/", "/api/explain", "/api/attention", "/api/sample", "/api/chat")

pytestmark = [pytest.mark.slow, pytest.mark.browser,
              pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} missing")]


@pytest.fixture(scope="module")
def live_url(tmp_path_factory):
    pytest.importorskip("starlette")
    from gatherlens.serve import ServeSettings, create_app, http_protocol
    from serve_helpers import running_server

    model = str(make_tiny_hybrid(tmp_path_factory.mktemp("m") / "tiny-hybrid"))
    settings = ServeSettings(model=model, text=TEXT)
    with running_server(create_app(settings), http=http_protocol(settings)) as url:
        yield url


def _set_range(page, name: str, value: str):
    page.eval_on_selector(f'#gl-sampling input[name="{name}"]',
                          "(el, v) => { el.value = v; el.dispatchEvent(new Event('input', {bubbles: true})); }", value)


@pytest.mark.parametrize("lang, cut, chosen", [("en", "top-k: 1", "chosen"), ("zh", "top-k：1", "选中")])
def test_sampling_sliders_and_chat(browser, live_url, lang, cut, chosen):
    page, requests, errors = open_page(browser, f"{live_url}/?text={quote(TEXT)}&k=3&lang={lang}", timeout_ms=120000)
    fig = page.locator("#fig-08-sampling")
    assert "top-k" in fig.locator("svg").text_content()
    _set_range(page, "top_k", "1")
    page.wait_for_function(f"() => document.querySelector('#fig-08-sampling svg').textContent.includes('{cut}')")
    assert page.locator('#gl-sampling output[name="top_k_out"]').inner_text() == "1"
    _set_range(page, "top_k", "40")
    _set_range(page, "temperature", "1.2")
    page.wait_for_function("() => document.querySelector('#fig-08-sampling svg').textContent.includes('T = 1.2')")
    page.fill('#gl-gen input[name="max_new"]', "5")
    page.fill('#gl-chat input[name="message"]', "hello there")
    page.click('#gl-chat button[name="send"]')
    page.wait_for_function("() => document.querySelectorAll('#gl-chat-log .gl-chat-msg.assistant .gl-chat-tok').length === 5"
                           " && document.getElementById('gl-chat-status').textContent === ''", timeout=120000)
    assert page.locator("#gl-chat-log .gl-chat-msg.user").inner_text() == "hello there"
    page.locator("#gl-chat-log .gl-chat-tok").nth(2).click()
    detail = page.locator("#gl-chat-detail")
    assert page.locator("#gl-chat-detail table tr").count() >= 6                     # a header and 5 candidates
    assert chosen in detail.locator("table").inner_text()
    page.select_option('select[name="layer"]', "1")                                  # the global layer: its pages
    page.locator("#gl-chat-log .gl-chat-tok").nth(2).click()
    assert any(w in page.locator(".gl-chat-pages").inner_text() for w in ("pages", "页"))
    assert {u.split("?")[0] for u in requests} <= {live_url + p for p in OWN}, requests
    assert errors == [], errors
    page.close()
