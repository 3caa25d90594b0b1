"""Issue 39 items 3 and 4: the gathers a model runs itself, each recorded from a real run of a tiny random
model, and the model map. MoE routing (Mixtral, Qwen3-MoE: the router's own top-k, per token and per expert),
RoPE's cos rows gathered by position_ids (bit-equal to what the model computed), Gemma's scaled rows (equal to
W[ids] x sqrt(d)); the map places each gather on its stage and says which are gatherlens' change."""
import xml.etree.ElementTree as ET

import pytest
import torch

from gatherlens.report.collect import collect
from tiny_models import make_tiny_hybrid, make_tiny_llama, make_tiny_moe

TEXT = "the cat sat on the mat because it was warm and the dog lay by the door all day long"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from gatherlens.models import load

    root = tmp_path_factory.mktemp("m")
    return {"gemma3": load(str(make_tiny_hybrid(root / "gemma3"))),
            "mixtral": load(str(make_tiny_moe(root / "mixtral", "mixtral"))),
            "qwen3_moe": load(str(make_tiny_moe(root / "qwen3", "qwen3_moe"))),
            "llama": load(str(make_tiny_llama(root / "llama")))}


@pytest.fixture(scope="module")
def stories(models):
    return {name: collect(lm, TEXT, top_k=3) for name, lm in models.items()}


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
def test_moe_routing_is_the_routers_own_choice(models, stories, name):
    r = stories[name].moe
    T = len(stories[name].ids)
    assert r is not None and r.layers == 2 and r.experts == 4 and r.top_k == 2 and r.probs.shape == (T, 4)
    assert torch.equal(r.index, r.probs.topk(2, dim=-1).indices)               # index = topk(softmax(logits))
    picked = r.probs.gather(-1, r.index)                                     # (T, k) their probabilities
    renorm = name == "mixtral" or models[name].model.config.norm_topk_prob     # Mixtral: over the k picked
    torch.testing.assert_close(r.weights, picked / picked.sum(-1, keepdim=True) if renorm else picked)
    assert sorted(t for e in r.per_expert for t in e) == sorted(list(range(T)) * 2)   # each token in k experts
    from gatherlens.models.hf_adapter import moe_routers

    from gatherlens.models import use_dense_attention, use_topk_attention

    seen = {}
    layer, gate = next((l, g) for l, g in moe_routers(models[name].model) if l == r.layer)
    handle = gate.register_forward_hook(lambda m, a, out: seen.update(index=out[2]))   # returns None
    use_topk_attention(models[name].model, top_k=3)          # the run again, as collect ran it
    try:
        with torch.no_grad():
            models[name].model(models[name].encode(TEXT))
    finally:
        handle.remove()
        use_dense_attention(models[name].model)
    assert torch.equal(seen["index"].long(), r.index)                        # the router's own picks, recorded


@pytest.mark.parametrize("name", ["gemma3", "mixtral", "qwen3_moe", "llama"])
def test_rope_rows_gathered_by_position_are_the_models(stories, name):
    rec = stories[name].rope_record
    T = len(stories[name].ids)
    assert rec is not None and rec.meta["equal"] and rec.source.shape[0] == T
    assert rec.index.tolist() == list(range(T)) and torch.equal(rec.output, rec.source[rec.index])


def test_gemma_scales_the_gathered_rows_and_others_do_not(stories):
    rec = stories["gemma3"].embed_scale
    assert rec is not None and rec.equal and abs(rec.scale - 32 ** 0.5) < 1e-6
    torch.testing.assert_close(rec.out, rec.rows * rec.scale)
    assert all(stories[n].embed_scale is None for n in ("mixtral", "qwen3_moe", "llama"))
    assert all(stories[n].moe is None for n in ("gemma3", "llama"))


@pytest.mark.parametrize("lang, words", [("en", ["expert 3", "top-2 of 4 experts", "Mixture of experts"]),
                                         ("zh", ["专家 3", "前 2 个", "混合专家"])])
def test_sections_and_figures_of_the_new_gathers(stories, lang, words):
    from gatherlens.report.build import build_report

    rep = build_report(stories["mixtral"], lang=lang)
    names = [f.name for f in rep.figures]
    assert names[:2] == ["00-model-map", "01-embedding"] and "02-rope" in names and "07-moe-routing" in names
    moe = next(f for f in rep.figures if f.name == "07-moe-routing").svg
    assert all(w in rep.html for w in words) and 'data-src="ex-' in moe
    for f in rep.figures:
        ET.fromstring(f.svg)
    gemma = build_report(stories["gemma3"], lang=lang)
    assert "02-embedding-scale" in [f.name for f in gemma.figures] and 'id="embedding-scale"' in gemma.html


def test_the_map_places_each_gather_and_marks_gatherlens_changes(stories):
    from gatherlens.render.model_map import model_map_svg
    from gatherlens.report.model_map import model_map

    m = model_map(stories["mixtral"])
    got = {g.key: (g.stage, g.target, g.ours) for g in m.gathers}
    assert got["embedding"] == ("embed", "embedding", False) and got["rope"] == ("attention", "rope", False)
    assert got["moe"] == ("mlp", "moe", False) and got["next"] == ("head", "prediction", False)
    assert got["topk"] == ("attention", "scores", True) and got["pages"][2] and got["prefill"] == ("attention", "", True)
    assert model_map(stories["mixtral"], live=True).gathers[[g.key for g in m.gathers].index("pages")].target == "generate"
    g = {x.key for x in model_map(stories["gemma3"]).gathers}
    assert "scale" in g and "moe" not in g and m.mlp == "moe"
    for lang, ours in (("en", "gatherlens&#39; change"), ("zh", "gatherlens 的改动")):
        svg = model_map_svg(m, lang)
        root = ET.fromstring(svg)
        links = root.findall(".//{http://www.w3.org/2000/svg}a")
        assert {a.get("href") for a in links} == {"#embedding", "#rope", "#scores", "#fig-06-compare", "#moe",
                                                  "#prediction"}
        assert ours in svg and svg.count('class="gl-map-gather gl-off gl-ours"') == 1      # prefill: off here
    assert "× 3 layers: 2 sliding 8, 1 global" in model_map_svg(model_map(stories["gemma3"]), "en")


def test_moe_routing_of_a_gguf_run_from_its_blocks(tmp_path):
    """Any MoE GGUF: a tiny Qwen3-MoE written to GGUF (Q8_0) and run from its blocks routes through
    models/gguf/moe.py's ExpertRouter, which the same hook records."""
    pytest.importorskip("gguf")
    from tiny_gguf import tiny_model, write_gguf

    from gatherlens.models import load
    from gatherlens.report.model_map import model_map

    path = write_gguf(tiny_model("qwen3moe"), "qwen3moe", "Q8_0", tmp_path / "tiny-Q8_0.gguf")
    lm = load(str(path), quantized=True)
    s = collect(lm, "the cat sat on the mat", top_k=2)
    r = s.moe
    assert r is not None and r.layers == 2 and r.experts == 4 and r.top_k == 2
    assert torch.equal(r.index, r.probs.topk(2, dim=-1).indices)
    assert "moe" in {g.key for g in model_map(s).gathers}
