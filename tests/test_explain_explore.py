"""The explorable report's data and page, on a tiny random Llama (3 layers, 4 query heads over 2
KV heads): the packed scores, picks and value columns are the model's, the page runs only the
scripts its Content-Security-Policy names, and the sentences carry slots the script can update.
The page itself, driven in Chromium: tests/test_serve_browser.py and test_explain_models.py."""
import base64
import hashlib
import json
import re

import numpy as np
import pytest
import torch

from gatherlens.render.explorer import Slot, csp, inline_scripts, json_block, plain, slotted
from gatherlens.report.build import build_report
from gatherlens.report.collect import collect
from gatherlens.report.scores import layer_scores
from tiny_models import make_tiny_llama

TEXT = "The cat sat on the mat because it was"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from gatherlens.models import load

    return load(str(make_tiny_llama(tmp_path_factory.mktemp("m") / "tiny3", layers=3)))


@pytest.fixture(scope="module")
def story(tiny):
    return collect(tiny, TEXT, top_k=3, layer=2, head=1)


def unpack(data: dict) -> dict:
    """The packed arrays back as numpy arrays (what the page's script decodes): every layer's own mask,
    its cells' 8-bit codes layer after layer, head after head."""
    N, H, Hkv, L = data["layers"], data["heads"], data["kv_heads"], data["L"]
    R = data["rows"][1] - data["rows"][0]
    masks = [np.frombuffer(base64.b64decode(m), np.uint8).reshape(R, L).astype(bool) for m in data["masks"]]
    allowed = np.stack([masks[m] for m in data["mask_of"]])                 # (N, R, L) each layer's own
    codes = np.frombuffer(base64.b64decode(data["scores"]), np.uint8)
    lo, hi = (np.frombuffer(base64.b64decode(data[n]), "<f4").reshape(N, H, R).astype(np.float64)
              for n in ("score_lo", "score_hi"))
    scores = np.full((N, H, R, L), -np.inf, np.float64)
    step = np.zeros((N, H, R, L))
    at = 0
    for layer in range(N):
        a = allowed[layer]
        rows, n = np.nonzero(a)[0], int(a.sum())                            # the query row of each cell
        c = codes[at:at + H * n].reshape(H, n)
        at += H * n
        scores[layer][:, a] = lo[layer][:, rows] + c * (hi - lo)[layer][:, rows] / 255
        step[layer][:, a] = ((hi - lo) / 510)[layer][:, rows]               # half a code: the bound per cell
    assert at == codes.size
    picks = np.frombuffer(base64.b64decode(data["picks"]), "<i2").reshape(N, H, R, -1)
    C = len(data["value_cols"])
    values = np.frombuffer(base64.b64decode(data["values"]), "<f2").reshape(N, Hkv, L, C)
    return dict(allowed=allowed, scores=scores, picks=picks, values=values, step=step)


def test_packed_scores_picks_and_values_are_the_models(tiny, story):
    data = json.loads(json.dumps(story.explore.pack()))     # survives JSON
    got = unpack(data)
    S = len(story.ids)
    assert (data["layers"], data["heads"], data["kv_heads"], data["Q"], data["L"]) == (3, 4, 2, S, S)
    assert data["run_k"] == 3 and data["causal"] and not data["dense_run"]
    assert np.array_equal(got["allowed"][0], np.tril(np.ones((S, S), bool)))   # the lower triangle only
    assert data["mask_of"] == [0, 0, 0] and len(data["masks"]) == 1             # one causal rule, kept once
    assert data["kinds"] == [{"kind": "full", "window": None}] * 3
    calls = []
    from gatherlens.models import observe_attention, use_dense_attention, use_topk_attention

    use_topk_attention(tiny.model, top_k=3)
    try:
        with torch.no_grad(), observe_attention(calls.append):
            tiny.model(tiny.encode(TEXT))
    finally:
        use_dense_attention(tiny.model)
    for layer, call in enumerate(calls):
        scores, allowed = layer_scores(call)                                  # (H, Q, L)
        exact = scores.numpy()
        a = allowed.numpy()
        assert np.all(np.abs(got["scores"][layer][a] - exact[a]) <= got["step"][layer][a] + 1e-6)  # 8-bit codes
        assert got["step"][layer].max() <= data["score_err"] + 1e-9
        assert np.array_equal(got["picks"][layer], call.selection.indices[0].numpy())
        v = call.value[0].float().numpy()                                     # (Hkv, L, Dv)
        np.testing.assert_allclose(got["values"][layer], v[..., data["value_cols"]], rtol=2e-3, atol=2e-3)
    assert data["value_cols"] == [0, 1, 2, 3, 4, 7]                           # Dv = 8: first five, last


def test_the_detailed_head_is_the_explorers_cell_for_cell(story):
    a, e = story.attention, story.explore
    assert torch.equal(a.scores, e.scores[a.layer, a.head])
    assert torch.equal(a.indices, e.picks[a.layer, a.head, :, : a.indices.shape[-1]])


def test_top_k_off_runs_dense_and_keeps_every_allowed_key(tiny):
    s = collect(tiny, TEXT, top_k=None, layer=1)
    S = len(s.ids)
    assert s.dense_run and s.top_k == S and s.explore.pack()["dense_run"]
    kept = (s.explore.picks[1, 0] >= 0).sum(-1)                               # (Q,)
    assert kept.tolist() == list(range(1, S + 1))                            # causal: i + 1 keys
    p = s.prediction
    assert [t[0] for t in p.top] == [t[0] for t in p.dense_top]              # k = L is dense


def test_page_runs_only_the_scripts_its_policy_names(story):
    html = build_report(story).html
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html).group(1)
    assert "unsafe-inline" not in policy.split("script-src", 1)[1].split(";")[0]
    assert "default-src 'none'" in policy and "connect-src" not in policy   # offline: no fetch at all
    scripts = inline_scripts(html)
    assert len(scripts) >= 2
    for js in scripts:
        digest = base64.b64encode(hashlib.sha256(js.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in policy
    assert "connect-src 'self'" in csp(scripts, connect_self=True)


def test_controls_and_drawn_figures_are_on_the_page(story):
    html = build_report(story).html
    for name in ("layer", "head", "query", "k"):
        assert f'name="{name}"' in html
    assert html.count('<option value="2" selected>') >= 1                    # layer 2 is chosen
    for draw in ("heads", "scores", "gather", "values"):
        assert f'data-draw="{draw}"' in html
    assert 'id="table-values"' in html and 'id="gl-knote"' in html
    data = json.loads(html.split('id="gl-data">', 1)[1].split("</script>", 1)[0])
    assert data["sel"] == {"layer": 2, "head": 1, "query": len(story.ids) - 1, "k": 3}
    assert data["strings"]["ex_k_moved"].count("{run}") == 2 and data["theme"]["picked"]
    assert data["live"] is None


def test_slots_keep_the_sentence_whole_and_escaped():
    sentence = "Query {q} ({tok}) holds {mass:.1%}".format(q=Slot("query", 8), tok=Slot("tok", "<b>"),
                                                          mass=Slot("mass", 0.1234))
    html = str(slotted(sentence))
    assert '<span class="gl-slot" data-slot="query" data-fmt="">8</span>' in html
    assert '<span class="gl-slot" data-slot="tok" data-fmt="">&lt;b&gt;</span>' in html
    assert 'data-fmt=".1%">12.3%</span>' in html
    assert plain(sentence) == "Query 8 (<b>) holds 12.3%"


def test_json_block_cannot_close_its_script_element():
    raw = str(json_block({"t": "</script><script>alert(1)</script>", "u": "a&b\u2028"}))
    assert "<" not in raw and ">" not in raw and "&" not in raw and "\u2028" not in raw
    assert json.loads(raw) == {"t": "</script><script>alert(1)</script>", "u": "a&b\u2028"}
