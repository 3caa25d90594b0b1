"""Issue 39 item 1 on a tiny random hybrid model (Gemma 3: sliding, global, sliding; a window of 8; a
text of 20+ tokens): every layer keeps its own mask and kind in the run, the page's data, the API and
the pictures; the model's picks never land on a key its layer masks; a sliding layer's "sparse" is its
ring. The Chromium side: tests/test_browser_hybrid.py."""
import base64
import json

import numpy as np
import pytest
import torch

from gatherlens.report.collect import collect
from tiny_models import HYBRID_TYPES, HYBRID_WINDOW, make_tiny_hybrid

TEXT = "the cat sat on the mat because it was warm and the dog lay by the door all day long"
W = HYBRID_WINDOW


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_hybrid(tmp_path_factory.mktemp("m") / "tiny-hybrid"))


@pytest.fixture(scope="module")
def lm(model_dir):
    from gatherlens.models import load

    return load(model_dir)


@pytest.fixture(scope="module")
def story(lm):
    return collect(lm, TEXT, top_k=3, layer=1)


def own_mask(kind: str, S: int) -> torch.Tensor:
    """(S, S) bool: the causal rule, and for a sliding layer the last W keys (transformers' rule)."""
    i, j = torch.arange(S).unsqueeze(1), torch.arange(S).unsqueeze(0)
    return (j <= i) & ((i - j < W) if kind == "sliding" else True)


def test_every_layer_keeps_its_own_mask_and_kind(story):
    t = story.tensors
    S = len(story.ids)
    assert S > 2 * W
    assert [(k.kind, k.window) for k in t.kinds] == [("sliding", W), ("full", None), ("sliding", W)]
    assert t.mask_of == (0, 1, 0) and t.causal
    for layer, name in enumerate(HYBRID_TYPES):
        assert torch.equal(t.allowed(layer), own_mask(name.split("_")[0], S)), layer


def test_picks_never_land_on_masked_keys(story):
    t = story.tensors
    N, Hq, Q, L = t.shape
    for layer in range(N):
        allowed = t.allowed(layer)
        for h in range(Hq):
            for q in range(Q):
                keys = [j for j in t.picks[layer, h, q].tolist() if j >= 0]
                assert keys and all(bool(allowed[q, j]) for j in keys), (layer, h, q, keys)
                assert len(keys) == min(3, int(allowed[q].sum()))


def test_page_data_carries_each_layers_mask_and_kind(story):
    from gatherlens.report.build import build_report, story_data

    x = story.explore.pack()
    assert x["mask_of"] == [0, 1, 0] and len(x["masks"]) == 2
    assert x["kinds"] == [{"kind": "sliding", "window": W}, {"kind": "full", "window": None},
                          {"kind": "sliding", "window": W}]
    S = len(story.ids)
    for m, kind in ((0, "sliding"), (1, "full")):
        got = np.frombuffer(base64.b64decode(x["masks"][m]), np.uint8).reshape(S, S).astype(bool)
        assert np.array_equal(got, own_mask(kind, S).numpy())
    assert story_data(story)["layer_kinds"] == x["kinds"]
    html = build_report(story).html
    assert '<option value="0">0 · sliding 8</option>' in html and '<option value="1" selected>1 · global</option>' in html
    assert html.count('class="gl-kind-mark gl-kind-sliding"') == 2 and "Above each layer: G = global" in html


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_score_grid_file_draws_the_window_edge_on_sliding_layers(lm, lang):
    from gatherlens.render.report_figures import scores_svg
    from gatherlens.report.records import score_grid

    for layer, edge in ((0, True), (1, False)):
        s = collect(lm, TEXT, top_k=3, layer=layer)
        svg = scores_svg(score_grid(s.attention, s.shown_tokens, s.tensors), lang)
        assert ('class="gl-window-edge"' in svg) == edge
        assert (svg.count('fill="#f4e2c4"') > 0) == edge                       # keys the window hides
        assert ("sliding 8" in svg or "滑动窗口 8" in svg) == edge and (("global" in svg or "全局" in svg) != edge)


def test_sliding_layers_sparse_is_its_ring(story):
    from gatherlens.ops.sparse.config import TOY
    from gatherlens.render.keep_compare import keep_comparison_svg
    from gatherlens.report.keep_compare import keep_comparison

    t = story.tensors
    q = t.shape[2] - 1
    ring = keep_comparison(t, story.shown_tokens, 0, 0, q, 3, TOY)
    assert ring.ring == (q - W + 1, q + 1) and ring.pages == () and ring.sparse_error == 0.0
    assert abs(ring.sparse_mass - 1.0) < 1e-5 and ring.kind == "sliding" and ring.window == W
    assert "ring: 8 keys" in keep_comparison_svg(ring, "en") and "环：8 个键" in keep_comparison_svg(ring, "zh")
    full = keep_comparison(t, story.shown_tokens, 1, 0, q, 3, TOY)
    assert full.ring is None and full.pages


def test_attention_api_answers_each_layers_own_mask(model_dir):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from gatherlens.serve import ServeSettings, create_app

    S = None
    with TestClient(create_app(ServeSettings(model=model_dir, text=TEXT)), base_url="http://127.0.0.1") as c:
        for layer, kind in enumerate(("sliding", "full", "sliding")):
            r = c.get("/api/attention", params={"text": TEXT, "k": 3, "layer": layer, "head": 1, "query": -1})
            assert r.status_code == 200, r.text
            w = r.json()["window"]
            S = S or r.json()["compare"]["keys"]
            r0, r1 = w["rows"]
            scores = np.frombuffer(base64.b64decode(w["scores"]), "<f4").reshape(r1 - r0, S)
            mask = own_mask(kind, S).numpy()[r0:r1]
            assert np.array_equal(np.isfinite(scores), mask), layer             # -inf exactly where masked
            assert w["kind"] == {"kind": kind, "window": W if kind == "sliding" else None}
            for row, picks in zip(mask, w["picks"]):
                assert all(row[j] for j in picks if j >= 0)
            assert (r.json()["compare"]["ring"] is not None) == (kind == "sliding")
        heads = c.get("/api/heads", params={"text": TEXT, "k": 3}).json()
        assert [k["kind"] for k in heads["layer_kinds"]] == ["sliding", "full", "sliding"]
        assert json.loads(json.dumps(heads))["layers"] == 3
