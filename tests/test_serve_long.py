"""Issue 20 on a tiny random Llama (2 layers, 4 query heads over 2 KV heads): long texts (the kept
run, the window around the query, GET /api/attention), dense / top-k / sparse side by side, the
clickable generation step (the dense weight on the pages each step read, the dense choice), the
offline page's compact scores and the limits it states. Every fast number against a plain
reference; the Chromium side: tests/test_browser_long.py."""
import base64
import json

import numpy as np
import pytest
import torch

from gatherlens.ops.sparse.config import TOY
from gatherlens.report.collect import collect
from gatherlens.report.defaults import LIVE_MAX_TOKENS, MAX_PICKS, MAX_TOKENS
from gatherlens.report.explore import dequantize_rows, quantize_rows
from gatherlens.report.keep_compare import keep_comparison
from gatherlens.report.scores import layer_scores
from gatherlens.report.window import WINDOW_KEYS, WINDOW_ROWS, attention_window, kept_keys
from tiny_models import make_tiny_llama

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")
from starlette.testclient import TestClient  # noqa: E402

from gatherlens.serve import ServeSettings, create_app  # noqa: E402

TEXT = "The cat sat on the mat because it was"
LONG = "the cat sat on the mat " * 100            # 602 tokens with [CLS] and [SEP]: past the offline limit


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_llama(tmp_path_factory.mktemp("m") / "tiny"))


@pytest.fixture(scope="module")
def lm(model_dir):
    from gatherlens.models import load

    return load(model_dir)


@pytest.fixture(scope="module")
def story(lm):
    return collect(lm, TEXT, top_k=3, layer=1, head=2)


@pytest.fixture(scope="module")
def long_story(lm):
    return collect(lm, LONG, top_k=4, layer=1, head=3, max_tokens=LIVE_MAX_TOKENS)


@pytest.fixture(scope="module")
def client(model_dir):
    app = create_app(ServeSettings(model=model_dir, text=TEXT))
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as c:
        yield c


def _reference_topk(row: torch.Tensor, k: int) -> list[int]:
    """Best first, ties to the lower key, only allowed keys (the model's rule, written plainly)."""
    keys = [j for j in range(row.numel()) if row[j] > float("-inf")]
    return sorted(keys, key=lambda j: (-float(row[j]), j))[:k]


# -- the kept run and the window ---------------------------------------------------------------------
def test_kept_run_gives_the_report_scores(story):
    t, e = story.tensors, story.explore
    N, Hq, Q, L = t.shape
    assert (N, Hq, Q, L) == tuple(e.scores.shape) and t.run_k == 3
    for layer in range(N):
        assert torch.equal(t.layer_scores(layer), e.scores[layer])             # the same rule, bit for bit
        assert torch.equal(t.picks[layer].long(), e.picks[layer])
        for head in range(Hq):
            torch.testing.assert_close(t.scores(layer, head, range(3, 8)), e.scores[layer, head, 3:8])


def test_long_text_keeps_no_grids_and_its_window_is_the_rows_around_the_query(long_story):
    s, t = long_story, long_story.tensors
    S = len(s.ids)
    assert S == 602 and s.explore is None and t.shape == (2, 4, S, S)
    w = attention_window(t, 1, 3, 300, 4)
    assert w["rows"] == [300 - WINDOW_ROWS // 2, 300 + WINDOW_ROWS // 2]
    assert w["keys"] == [w["rows"][1] - WINDOW_KEYS, w["rows"][1]]           # causal: ending at the last row
    rows = np.frombuffer(base64.b64decode(w["scores"]), "<f4").reshape(WINDOW_ROWS, S)
    assert torch.equal(torch.from_numpy(rows.copy()), t.scores(1, 3, range(*w["rows"])))
    assert w["picks"] == t.picks[1, 3, 292:308].tolist()
    full = t.layer_scores(1)[3]                                              # (Q, L)
    assert w["picks"][8][:4] == _reference_topk(full[300], 4)                # the model's own top-4
    V = t.value[1, 1]                                                        # head 3 reads KV head 1
    for j, cols in w["values"].items():
        assert cols == V[int(j), [0, 1, 2, 3, 4, 7]].tolist()
    assert sorted(int(j) for j in w["values"]) == sorted({0, *w["picks"][8][:4]})
    assert attention_window(t, 1, 3, 300, 4) == w                            # the same data, the same answer
    assert attention_window(t, 0, 0, 0, 4)["rows"] == [0, WINDOW_ROWS]        # kept inside the text
    with pytest.raises(Exception, match=r"query 602 is outside \[0, 602\)"):
        attention_window(t, 0, 0, 602, 4)


def test_kept_keys_at_another_k_follow_the_models_rule(long_story):
    t = long_story.tensors
    row = t.scores(0, 1, [450])[0]
    assert kept_keys(t, 0, 1, 450, 4, row) == [j for j in t.picks[0, 1, 450].tolist() if j >= 0]
    for k in (1, 7, 30):
        assert kept_keys(t, 0, 1, 450, k, row) == _reference_topk(row, k)


# -- dense, top-k and sparse side by side ---------------------------------------------------------------
def test_keep_comparison_against_plain_references(long_story):
    t, toks = long_story.tensors, long_story.shown_tokens
    rec = keep_comparison(t, toks, 1, 3, 500, 4, TOY)
    row = t.scores(1, 3, [500])[0].double()
    V = t.value[1, 1].double()                                               # (L, Dv)
    dense = torch.softmax(row, -1)
    torch.testing.assert_close(rec.dense.double(), dense, rtol=1e-5, atol=1e-7)
    assert rec.dense[501:].sum() == 0 and rec.query == 500 and rec.query_token == toks[500]
    assert list(rec.topk) == _reference_topk(row, 4)
    o = dense @ V

    def err(keys):
        w = torch.softmax(row[keys], -1)
        return float((w @ V[keys] - o).norm() / o.norm())

    assert rec.topk_error == pytest.approx(err(list(rec.topk)), rel=1e-4, abs=1e-6)
    # sparse: page 0 and the newest page, whole pages within the budget, the output over their keys
    P, n = TOY.page_size, 501
    assert rec.pages[0] == 0 and rec.pages[-1] == (n - 1) // P and len(rec.pages) * P <= TOY.budget
    assert rec.sparse_tokens == tuple(j for p in rec.pages for j in range(p * P, min(p * P + P, n)))
    assert rec.sparse_error == pytest.approx(err(list(rec.sparse_tokens)), rel=1e-4, abs=1e-6)
    assert rec.sparse_mass == pytest.approx(float(dense[list(rec.sparse_tokens)].sum()), rel=1e-5)
    assert rec.topk_mass == pytest.approx(float(dense[list(rec.topk)].sum()), rel=1e-5)


def test_keep_comparison_figure_is_drawn_from_the_record(long_story):
    from gatherlens.render.keep_compare import keep_comparison_svg

    rec = keep_comparison(long_story.tensors, long_story.shown_tokens, 1, 3, 500, 4, TOY)
    svg = keep_comparison_svg(rec, "zh")
    assert svg == keep_comparison_svg(rec, "zh")                             # same record, same bytes
    assert svg.count('class="gl-strip ') == 3 and svg.count('class="gl-mark"') == len(rec.topk) + len(rec.pages)
    assert "稠密" in svg and "稀疏" in svg and "每格是相邻 2 个键的权重之和" in svg   # 602 keys, 2 per cell
    en = keep_comparison_svg(rec, "en")
    assert f"top-k keeps 4 keys" in en and f"{rec.sparse_mass:.1%} of the dense weight" in en


# -- the offline page: 8-bit scores, its size and limits in the page ---------------------------------------
def test_quantized_rows_stay_within_half_a_code():
    g = torch.Generator().manual_seed(0)
    allowed = torch.ones(7, 7, dtype=torch.bool).tril()
    cells = (torch.randn(3, 2, 7, 7, generator=g) * 6)[:, :, allowed]        # (3, 2, 28)
    rows = allowed.nonzero()[:, 0]
    codes, lo, hi = quantize_rows(cells, rows)
    back = dequantize_rows(codes, lo, hi, rows)
    bound = ((hi - lo).double() / 510).gather(-1, rows.expand(cells.shape))
    assert codes.dtype == torch.uint8 and bool(((back - cells.double()).abs() <= bound + 1e-6).all())
    for r in range(7):                                                       # each row spans its own min..max
        sel = rows == r
        assert torch.equal(lo[..., r], cells[..., sel].amin(-1)) and torch.equal(hi[..., r], cells[..., sel].amax(-1))


@pytest.mark.parametrize("lang, words", [("en", ["Limits:", "8-bit codes", f"up to {MAX_TOKENS} tokens"]),
                                         ("zh", ["限制：", "8 位编码", f"不超过 {MAX_TOKENS} 个 token"])])
def test_offline_page_states_its_limits_and_size(story, lang, words):
    from gatherlens.report.build import build_report

    html = build_report(story, lang=lang).html
    limits = html.split('id="gl-limits">', 1)[1].split("</p>", 1)[0]
    for w in words:
        assert w in limits, (w, limits)
    data = json.loads(html.split('id="gl-data">', 1)[1].split("</script>", 1)[0])
    x = data["explore"]
    assert x["v"] == 3 and 0 < x["score_err"] < 1
    cells = sum(int(story.explore.allowed(layer).sum()) for layer in range(2))
    assert len(base64.b64decode(x["scores"])) == 4 * cells                   # one byte a cell of each layer's own mask
    assert 'id="fig-06-compare"' in html and "gl-kc-offline" in html


# -- the API ------------------------------------------------------------------------------------------------
def test_attention_api_answers_from_the_kept_run(client, lm):
    r = client.get("/api/explain", params={"text": LONG, "k": 4, "html": 1})
    assert r.status_code == 200, r.text
    data = json.loads(r.json()["html"].split('id="gl-data">', 1)[1].split("</script>", 1)[0])
    assert data["explore"]["remote"] and data["explore"]["window"]["query"] == 601
    a = client.get("/api/attention", params={"text": LONG, "k": 4, "layer": 0, "head": 1, "query": 123})
    assert a.status_code == 200, a.text
    body = a.json()
    assert body["cached"] is True and body["svg"].startswith("<svg")
    fresh = collect(lm, LONG, top_k=4, max_tokens=LIVE_MAX_TOKENS).tensors
    assert body["window"] == json.loads(json.dumps(attention_window(fresh, 0, 1, 123, 4)))
    c = body["compare"]
    assert (c["layer"], c["head"], c["query"], c["keys"]) == (0, 1, 123, 602) and c["topk"] == body["window"]["picks"][8][:4]
    health = client.get("/api/health").json()["runs"]
    assert health["runs"] >= 1 and health["bytes"] <= health["max_bytes"]


@pytest.mark.parametrize("params, words", [
    ({"text": "a " * 2100}, ["text has 2102 tokens", f"within [1, {LIVE_MAX_TOKENS}] tokens"]),
    ({"text": LONG, "k": 40}, ["k = 40 with 602 tokens", f"the limit is {MAX_PICKS:,}", "use k in [1, 27]"]),
    ({"text": LONG, "topk": 0}, ["top-k off", "use k in [1, 27]"]),
    ({"text": TEXT, "query": 11}, ["query 11 is outside the token positions [-11, 11)"]),
    ({"text": TEXT, "head": 4}, ["head 4 is outside the query heads [-4, 4)"]),
], ids=["over-the-live-limit", "k-too-big-for-a-long-text", "dense-long", "query", "head"])
def test_attention_api_bad_input_is_a_400_naming_the_range(client, params, words):
    r = client.get("/api/attention", params=params)
    assert r.status_code == 400, r.text
    for w in words:
        assert w in r.json()["error"], (w, r.json()["error"])


def test_run_cache_keeps_the_newest_within_its_bytes(long_story, story):
    from gatherlens.serve.runs import RunCache

    big, small = long_story.tensors, story.tensors
    runs = RunCache(max_bytes=big.nbytes + small.nbytes)
    runs.put("a", big, []), runs.put("b", small, [])
    assert list(runs.runs) == ["a", "b"]
    runs.get("a")                                                            # used: now the newest
    runs.put("c", small, [])
    assert list(runs.runs) == ["a", "c"] and runs.nbytes <= runs.max_bytes
    runs.put("d", big, [])
    assert list(runs.runs) == ["d"] or runs.nbytes <= runs.max_bytes


# -- the clickable generation step ---------------------------------------------------------------------------
def test_read_mass_against_a_plain_loop():
    from gatherlens.serve.step_detail import read_mass

    g = torch.Generator().manual_seed(1)
    q, K = torch.randn(4, 8, generator=g), torch.randn(2, 13, 8, generator=g)   # Hq 4 over Hkv 2
    read = torch.rand(2, 13, generator=g) > 0.5
    got = read_mass(q, K, 0.3, read)
    for h in range(4):
        w = torch.softmax((K[h // 2] @ q[h]).double() * 0.3, -1)
        assert float(got[h]) == pytest.approx(float(w[read[h // 2]].sum()), rel=1e-5, abs=1e-7)


def test_generation_detail_masses_and_dense_choices(lm):
    from gatherlens.serve.decode import decode_steps
    from gatherlens.serve.step_detail import dense_choices

    events = list(decode_steps(lm, TEXT, 8, 16, 4, detail=True))
    start, steps, done = events[0][1], [d for k, d in events if k == "step"], events[-1][1]
    S = start["prompt_tokens"]
    assert start["tokens"][0] == "[CLS]" and len(start["tokens"]) == S
    for s in steps:
        assert len(s["mass"]) == 2 and all(len(m) == 4 for m in s["mass"])    # [layer][query head]
        assert all(0 < x <= 1 + 1e-5 for m in s["mass"] for x in m)
        if s["length"] <= 16:                                                # the budget covers the cache
            assert all(x == pytest.approx(1.0, abs=1e-5) for m in s["mass"] for x in m)
    new = tuple([start["token_id"]] if "token_id" in start else []) or None
    ids = [e for e in events if e[0] == "step"]
    assert len(ids) == 7
    dense = done["dense"]
    assert [d["step"] for d in dense] == list(range(8)) and dense[0]["same"]     # the prompt's step is dense
    tokens = tuple(d["token_id"] for d in dense[:1]) + tuple(s["token_id"] for s in steps)
    assert tokens[0] == dense[0]["token_id"] and new is None
    assert dense == dense_choices(lm, lm.encode(TEXT), tokens)               # the same forward, the same answer


def test_dense_choices_against_one_forward_per_prefix(lm):
    from gatherlens.serve.step_detail import dense_choices

    prompt = lm.encode(TEXT)                                                 # (1, S)
    new = (5, 17, 9, 30)
    got = dense_choices(lm, prompt, new)
    with torch.no_grad():
        for i, d in enumerate(got):
            ids = torch.cat([prompt, torch.tensor([list(new[:i])], dtype=prompt.dtype)], 1)   # (1, S + i)
            logits = lm.model(input_ids=ids).logits[0, -1].float()           # (V,)
            top2 = logits.topk(2).values
            if float(top2[0] - top2[1]) > 1e-4:                              # no near-tie: the same choice
                assert d["token_id"] == int(logits.argmax())
            assert d["same"] == (d["token_id"] == new[i])
            assert d["p"] == pytest.approx(float(torch.softmax(logits, -1).max()), abs=1e-4)


def test_generate_stream_carries_the_detail(model_dir):
    from serve_helpers import running_server

    with running_server(create_app(ServeSettings(model=model_dir, text=TEXT))) as url:
        with httpx.stream("GET", f"{url}/api/generate", params={"text": TEXT, "max_new": 5}, timeout=120) as r:
            events = [(line.split(":", 1)[1].strip(), None) if line.startswith("event:") else json.loads(line[5:])
                      for line in r.iter_lines() if line.startswith(("event:", "data:"))]
    data = events[1::2]
    assert "tokens" in data[0] and all("mass" in d for d in data[1:-1])
    assert len(data[-1]["dense"]) == 5 and data[-1]["message"] == "5 tokens generated"
