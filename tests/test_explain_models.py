"""`gatherlens explain` on the two real models (slow): the README's main command on SmolLM2
(default sentence), a short text on MiniLM, and the SmolLM2 report opened in Debian's Chromium
(renders, fetches nothing, logs no error; screenshot in artifacts/)."""
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gatherlens.commands.explain import explain
from gatherlens.report.collect import DEFAULT_TEXT

CHROMIUM = "/usr/bin/chromium"
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
    assert names == sorted(["01-embedding.svg", "03-heads.svg", "04-scores.svg", "05-score-gather.svg",
                            "06-value-gather.svg", "07-next-token.svg", "story.json", "index.html"])
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


@pytest.mark.browser
@pytest.mark.skipif(not Path(CHROMIUM).exists(),
                    reason=f"{CHROMIUM} missing: apt-get install chromium (Debian's build)")
def test_smollm2_report_in_chromium(smollm2_report):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright missing: pip install playwright")
    out, _ = smollm2_report
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            requests, errors = [], []
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto((out / "index.html").as_uri())
            page.wait_for_load_state("load")

            assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
            assert errors == []
            assert page.locator("h2").count() == 7
            assert page.locator("section svg").count() == 6  # every figure drawn on the page
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
        finally:
            browser.close()
