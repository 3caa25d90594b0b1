"""`gatherlens explain` on the two real models (slow): the README's main command on SmolLM2
(default sentence), a short text on MiniLM, and the SmolLM2 report opened in Debian's Chromium
(renders, fetches nothing, logs no error; screenshot in artifacts/)."""
import json
from pathlib import Path

import pytest
from browser_helpers import CHROMIUM, browser, needs_chromium, open_page  # noqa: F401 (browser: a fixture)
from click.testing import CliRunner

from gatherlens.commands.explain import explain
from gatherlens.report.collect import DEFAULT_TEXT

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"

pytestmark = pytest.mark.slow


def _run(args):
    res = CliRunner().invoke(explain, args)
    if res.exit_code != 0 and "is not installed" in res.output:
        pytest.skip(res.output.strip())
    assert res.exit_code == 0, res.output
    return res


@pytest.fixture(scope="module")
def smollm2_report(tmp_path_factory):
    """The README's main command: `gatherlens explain` (default text, default model SmolLM2)."""
    out = tmp_path_factory.mktemp("explain") / "gatherlens-report"
    res = _run(["--out", str(out)])
    return out, res.stdout


@pytest.fixture(scope="module")
def minilm_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("explain") / "minilm"
    res = _run(["A cat sat.", "--model", "minilm", "--top-k", "3", "--out", str(out)])
    return out, res.stdout


def test_smollm2_default_report(smollm2_report):
    out, stdout = smollm2_report
    for part in ("smollm2 (LlamaForCausalLM)", "grouped-query: 9 query heads over 3 KV heads",
                 "kv0 ← q0 q1 q2 | kv1 ← q3 q4 q5 | kv2 ← q6 q7 q8", "table (49,152, 576)",
                 "top-4 keys of query", "next token after", "topk_attention", "index.html"):
        assert part in stdout, part
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(["00-model-map.svg", "01-embedding.svg", "02-rope.svg", "02-heads-gallery.svg", "03-heads.svg",
                            "04-scores.svg", "05-score-gather.svg", "06-value-gather.svg", "06-compare.svg",
                            "07-next-token.svg", "08-sampling.svg", "story.json", "index.html"])
    data = json.loads((out / "story.json").read_text(encoding="utf-8"))
    assert data["text"] == DEFAULT_TEXT and data["model_class"] == "LlamaForCausalLM"
    assert data["heads"]["query"] == 9 and data["heads"]["kv"] == 3
    assert [e["kind"] for e in data["embeddings"]] == ["word"]
    rows = {(g["op"], g["module"]): g for g in data["gathers"]}
    assert rows[("embedding", "model.embed_tokens")]["count"] == 1
    assert rows[("topk_attention", "model.layers.*.self_attn")]["count"] == 30
    assert len(data["prediction"]["topk"]) == 5 and len(data["prediction"]["dense"]) == 5
    assert data["attention"]["layer"] == 15  # the middle layer by default


def test_minilm_report_shows_three_lookups_and_no_prediction(minilm_report):
    out, stdout = minilm_report
    assert "minilm (BertModel)" in stdout and "multi-head: 12 query heads over 12 KV heads" in stdout
    assert "is an encoder: no next-token prediction" in stdout
    for module in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        assert f"embedding gather embeddings.{module}" in stdout
    names = {p.name for p in out.iterdir()}
    assert {"01-embedding.svg", "02-position.svg", "02-token-type.svg"} <= names
    assert "07-next-token.svg" not in names
    data = json.loads((out / "story.json").read_text(encoding="utf-8"))
    assert [e["kind"] for e in data["embeddings"]] == ["word", "position", "token_type"]
    assert data["tokens"][0] == "[CLS]" and data["prediction"] is None
    assert data["embeddings"][1]["ids"] == list(range(len(data["ids"])))  # positions 0..S-1
    assert set(data["embeddings"][2]["ids"]) == {0}                       # one segment






def _open(browser, path):
    return open_page(browser, path, width=1280)


@pytest.mark.browser
@needs_chromium
def test_smollm2_report_in_chromium(smollm2_report, browser):
    out, _ = smollm2_report
    page, requests, errors = _open(browser, out / "index.html")
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
    assert errors == []
    assert page.locator("h2").count() == 11  # the map, the article's seven sections, the head gallery, RoPE, sampling
    assert page.locator("section svg").count() >= 7  # every figure drawn on the page
    for sel in ("#fig-01-embedding svg", "#fig-04-scores svg", "#fig-06-value-gather svg"):
        box = page.locator(sel).bounding_box()
        assert box and box["width"] > 200 and box["height"] > 100, sel
    assert page.locator("#fig-04-scores .gl-kept").count() > 0  # top-k cells outlined
    # hover highlighting works inside the report: an output cell of the embedding lookup
    cell = page.locator("#fig-01-embedding .gl-cell.gl-out").first
    src = cell.get_attribute("data-src")
    cell.hover()
    assert "hl" in (page.get_attribute(f'#fig-01-embedding [data-key="{src}"]', "class") or "")
    assert "←" in page.locator("#fig-01-embedding .gl-info").inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "explain_report.png"), full_page=True)
    page.close()


def _page_data(out: Path) -> dict:
    html = (out / "index.html").read_text(encoding="utf-8")
    return json.loads(html.split('id="gl-data">', 1)[1].split("</script>", 1)[0])


def _top_keys(data: dict, layer: int, head: int, query: int, k: int) -> list[int]:
    """Top-k of the page's own 8-bit scores for one (layer, head, query), decoded as the page's
    script decodes them (lo + code * (hi - lo) / 255 per query row), ties to the lower key."""
    import base64

    import numpy as np

    x = data["explore"]
    R = x["rows"][1] - x["rows"][0]
    masks = [np.frombuffer(base64.b64decode(m), np.uint8).reshape(R, x["L"]).astype(bool) for m in x["masks"]]
    cells = [int(masks[m].sum()) for m in x["mask_of"]]                      # each layer's own mask
    at = sum(cells[:layer]) * x["heads"] + head * cells[layer]               # layer after layer, head after head
    codes = np.frombuffer(base64.b64decode(x["scores"]), np.uint8)[at:at + cells[layer]]
    lo, hi = (np.frombuffer(base64.b64decode(x[n]), "<f4").reshape(x["layers"], x["heads"], R).astype(np.float64)
              for n in ("score_lo", "score_hi"))
    allowed = masks[x["mask_of"][layer]]
    rows = np.nonzero(allowed)[0]  # the query row of each stored cell
    row = np.full((R, x["L"]), -np.inf, np.float64)
    row[allowed] = lo[layer, head, rows] + codes * (hi - lo)[layer, head, rows] / 255
    keys = [j for j in range(x["L"]) if row[query, j] > -np.inf]
    return sorted(keys, key=lambda j: (-float(row[query, j]), j))[:k]


@pytest.mark.browser
@needs_chromium
def test_smollm2_report_explores_layer_29_head_8(smollm2_report, browser):
    out, _ = smollm2_report
    page, requests, errors = _open(browser, out / "index.html")
    titles = lambda: page.locator(".gl-fig-title").all_text_contents()  # noqa: E731
    assert all("layer 15, head 0" in t for t in titles())
    before = page.locator("#fig-04-scores svg").inner_html()
    page.select_option('select[name="layer"]', "29")
    page.select_option('select[name="head"]', "8")
    assert all("layer 29, head 8" in t for t in titles()) and len(titles()) == 4
    assert page.locator("#fig-04-scores svg").inner_html() != before
    data = _page_data(out)
    last = len(data["tokens"]) - 1
    keys = [int(x) for x in page.locator("#table-values tbody tr td:first-child").all_text_contents()]
    assert keys == _top_keys(data, 29, 8, last, 4)            # k = 4: what the model ran with
    page.fill('input[name="k"]', "7")
    assert any("top-7" in t for t in titles())
    keys = [int(x) for x in page.locator("#table-values tbody tr td:first-child").all_text_contents()]
    assert keys == _top_keys(data, 29, 8, last, 7) and len(keys) == 7
    assert page.locator("#fig-04-scores .gl-kept-outline").count() == sum(min(7, i + 1) for i in range(last + 1))
    assert "The model ran with top-4" in page.locator("#gl-knote").inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "explain_layer29_head8.png"), full_page=True)
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == [] and errors == []
    page.close()


@pytest.mark.browser
@needs_chromium
def test_minilm_report_explores_too(minilm_report, browser):
    out, _ = minilm_report
    page, requests, errors = _open(browser, out / "index.html")
    page.select_option('select[name="layer"]', "5")
    page.select_option('select[name="head"]', "11")
    page.select_option('select[name="query"]', "0")
    page.fill('input[name="k"]', "2")
    titles = page.locator(".gl-fig-title").all_text_contents()
    assert all("layer 5, head 11" in t for t in titles) and len(titles) == 4
    data = _page_data(out)
    assert not data["explore"]["causal"]                      # bidirectional: query 0 sees every key
    keys = [int(x) for x in page.locator("#table-values tbody tr td:first-child").all_text_contents()]
    assert keys == _top_keys(data, 5, 11, 0, 2) and max(keys) > 0
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == [] and errors == []
    page.close()
