"""The explorer's sparse-prefill section on a tiny random Llama (3 layers, 4 query heads over 2 KV heads): the
packed block maps are the model's selections bit for bit and the same on every run, the section sits after
the value gather in en and zh (an encoder gets a line instead), `explain --sparse-prefill` puts it on the page
and writes prefill-map.svg, and `serve` adds it when asked (?prefill=1, or serve --sparse-prefill).
The page itself in Chromium: tests/test_browser_prefill.py."""
import base64
import json

import numpy as np
import pytest
from click.testing import CliRunner

from gatherlens.ops.prefill.config import TOY
from gatherlens.report.build import build_report, page_data, story_data
from gatherlens.report.collect import collect
from gatherlens.report.sections import sections
from tiny_models import make_tiny_llama

TEXT = ("It is a truth universally acknowledged, that a single man in possession of a good fortune must be in "
        "want of a wife. ") * 3                                              # 77 tokens: 5 blocks of 16
CHOOSING = TOY.replace(threshold=None, budget=3)                             # the sink, the diagonal and one more


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_llama(tmp_path_factory.mktemp("m") / "tiny3", layers=3))


@pytest.fixture(scope="module")
def tiny(model_dir):
    from gatherlens.models import load

    return load(model_dir)


@pytest.fixture(scope="module")
def story(tiny):
    return collect(tiny, TEXT, top_k=2, layer=1, head=3, prefill=CHOOSING)


def bits(b64: str, n: int) -> np.ndarray:
    """The page's bits back (bit i: byte i // 8, bit i % 8, little endian)."""
    return np.unpackbits(np.frombuffer(base64.b64decode(b64), np.uint8), bitorder="little")[:n].astype(bool)


def unpack(d: dict) -> np.ndarray:
    """(layers, heads, nq, nk) int: 2 gathered, 1 allowed and skipped, 0 not allowed (what explore.js draws)."""
    nq, nk, H = d["nq"], d["nk"], d["heads"]
    masks = [bits(m, nq * nk).reshape(nq, nk) for m in d["allowed"]]
    cells = [int(masks[i].sum()) for i in d["allowed_of"]]
    kept = bits(d["kept"], H * sum(cells))
    out, at = np.zeros((len(d["layers"]), H, nq, nk), int), 0
    for n, i in enumerate(d["allowed_of"]):
        for h in range(H):
            out[n, h][masks[i]] = 1 + kept[at:at + cells[n]]
            at += cells[n]
    return out


def test_packed_maps_are_the_models_selections_bit_for_bit(tiny, story):
    from gatherlens.models.attention.prefill import prefill_selections

    data = json.loads(json.dumps(story.prefill.pack()))                     # survives JSON
    assert (data["layers"], data["heads"], data["q_heads"], data["nq"], data["nk"], data["block"]) == \
        ([0, 1, 2], 2, 4, 5, 5, 16)
    assert data["allowed_of"] == [0, 0, 0] and len(data["allowed"]) == 1    # one causal map, shared by the layers
    assert data["q_spans"][-1] == [64, 76] and data["k_spans"][0] == [0, 15]
    got = unpack(data)
    sels = prefill_selections(tiny.model, tiny.encode(TEXT), CHOOSING)      # a second run: the same maps
    for n, layer in enumerate(data["layers"]):
        sel = sels[layer]
        allowed = sel.allowed().numpy()                                      # (nq, nk)
        want = np.where(allowed, 1 + sel.blocks[0].numpy(), 0)               # (H, nq, nk)
        assert np.array_equal(got[n], want)
    assert (got == 1).any() and (got == 2).any()                             # the budget skipped some blocks
    assert data == collect(tiny, TEXT, top_k=2, layer=1, head=3, prefill=CHOOSING).prefill.pack()
    share = (got == 2).sum() / (got > 0).sum()
    assert data["kept_share"] == pytest.approx(share, abs=1e-6)
    assert len(base64.b64decode(data["kept"])) == -(-int((got > 0).sum()) // 8)   # one bit per allowed block


def test_a_prompt_of_whole_blocks_prefills(tiny):
    """96 tokens = 6 blocks of 16 exactly: transformers' transposed keys reach the blocked path."""
    story = collect(tiny, "a " * 94, top_k=2, prefill=TOY)
    assert len(story.ids) == 96 and story.prefill.pack()["nq"] == 6


@pytest.mark.parametrize("lang,title,words", [("en", "5b. Sparse prefill", "were gathered"),
                                              ("zh", "5b. 稀疏预填充", "占")])
def test_the_section_follows_the_value_gather(story, lang, title, words):
    parts = sections(story, lang)
    ids = [s.id for s in parts]
    assert ids[ids.index("values") + 1] == "prefill" and ids[-3:] == ["prediction", "sampling", "gathers"]
    sec = parts[ids.index("prefill")]
    assert sec.title.startswith(title)
    fig = sec.figures[0]
    assert (fig.name, fig.draw, fig.filename) == ("prefill-map", "prefill", "prefill-map.svg")
    assert fig.svg.startswith("<svg") and "<image" in fig.svg                # the file: the run's layer and head
    share = str(sec.body[-1])
    assert words in share and 'data-slot="pf_share"' in share and 'data-slot="pf_kept"' in share
    shares = story.prefill.shares(1)                                          # head 3 reads KV head 1's map
    assert f">{shares[1]:.0%}<" in share
    assert sec.body[0].count("{") == 0 and ("at most" not in sec.body[0])    # budget 3: "the best 3"


def test_no_prefill_no_section_and_an_encoder_gets_a_line(story):
    import dataclasses

    from gatherlens.report.prefill import PrefillMaps

    assert "prefill" not in [s.id for s in sections(dataclasses.replace(story, prefill=None))]
    enc = dataclasses.replace(story, prefill=PrefillMaps({}, 4, TOY, causal=False))
    sec = next(s for s in sections(enc, "en") if s.id == "prefill")
    assert "encoder" in sec.body[0] and not sec.figures
    assert page_data(enc, "en")["prefill"] is None and story_data(enc)["prefill"] is None


def test_page_and_story_json_carry_the_maps(story):
    report = build_report(story, lang="zh")
    assert 'data-draw="prefill"' in report.html and 'href="#prefill"' in report.html
    data = page_data(story, "zh")
    assert data["prefill"] == story.prefill.pack()
    assert data["strings"]["ex_prefill_kept"] == "已 gather" and data["theme"]["block"]["skipped"] == "#e2e2e2"
    summary = story_data(story)["prefill"]
    assert summary["block_size"] == 16 and summary["budget"] == 3 and len(summary["layers"]) == 3
    assert summary["layers"][1]["kept_share"] == [round(s, 6) for s in story.prefill.shares(1)]


def test_explain_sparse_prefill_puts_the_section_on_the_page(model_dir, tmp_path):
    from gatherlens.cli import main

    out = tmp_path / "report"
    res = CliRunner().invoke(main, ["explain", TEXT, "--model", model_dir, "--out", str(out), "--layer", "2",
                                    "--head", "1", "--sparse-prefill", "--lang", "zh"])
    assert res.exit_code == 0, res.output
    html = (out / "index.html").read_text()
    assert '<section id="prefill">' in html and "--sparse-prefill" in html  # the section; the rerun command
    assert "第 2 层，第 0 个头" in (out / "prefill-map.svg").read_text()     # query head 1 -> KV head 0's map
    assert json.loads((out / "story.json").read_text())["prefill"]["block_size"] == TOY.block_size
    assert "sparse prefill:" in res.output and "prefill-map.svg: layer 2" in res.output
    again = CliRunner().invoke(main, ["explain", TEXT, "--model", model_dir, "--out", str(out), "--force"])
    assert again.exit_code == 0, again.output
    assert not (out / "prefill-map.svg").exists()                             # --force removes the stale map
    assert '<section id="prefill">' not in (out / "index.html").read_text()


def test_serve_adds_the_section_when_asked(model_dir):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from gatherlens.serve import ServeSettings, create_app
    from gatherlens.serve.params import explain_params

    s = ServeSettings(model=model_dir, text=TEXT)
    assert not explain_params({}, s).prefill and explain_params({"prefill": "1"}, s).prefill
    assert explain_params({}, ServeSettings(model=model_dir, sparse_prefill=True)).prefill
    with TestClient(create_app(s), base_url="http://127.0.0.1") as c:
        on = c.get("/api/explain", params={"prefill": "1", "explore": "1", "html": "1"}).json()
        off = c.get("/api/explain", params={"explore": "1", "html": "1"}).json()
        bad = c.get("/api/explain", params={"prefill": "maybe"})
    assert on["page"]["prefill"]["nq"] == 5 and on["prefill"]["block_size"] == TOY.block_size
    assert '<section id="prefill">' in on["html"] and 'name="prefill" checked' in on["html"]
    assert off["page"]["prefill"] is None and off["prefill"] is None and '<section id="prefill">' not in off["html"]
    assert bad.status_code == 400 and "prefill" in bad.json()["error"]


def test_serve_command_passes_sparse_prefill(monkeypatch):
    pytest.importorskip("uvicorn")
    import contextlib

    import uvicorn

    from gatherlens.commands.serve import serve

    seen = {}

    @contextlib.contextmanager
    def prepared(settings):
        seen["settings"] = settings
        yield None

    monkeypatch.setattr("gatherlens.serve.prepared", prepared)
    monkeypatch.setattr("gatherlens.serve.create_app", lambda settings, loader=None: None)
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: None)
    res = CliRunner().invoke(serve, ["--sparse-prefill"])
    assert res.exit_code == 0, res.output
    assert seen["settings"].sparse_prefill
