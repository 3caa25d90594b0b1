"""The head gallery: the rules that tag a head (report/heads.py) on score matrices whose answer is
known, measure_layer against a plain per-query reference, the small maps, the SVG and its atlas
PNG drawn from a record, and the report's gallery section on a tiny random Llama."""
import html
import io
import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from gatherlens.errors import GatherValueError
from gatherlens.render.gallery import TAG_COLOURS, gallery_svg
from gatherlens.render.palette_png import data_uri, palette_png
from gatherlens.render.theme import MASKED, weight_colour
from gatherlens.report.heads import RULES, HeadRules, gallery_data, head_gallery, measure_layer
from gatherlens.trace.head_records import HEAD_TAGS, HeadGallery, HeadTile

NEG = float("-inf")
DOCS = Path(__file__).resolve().parent.parent / "docs"


def causal(scores: torch.Tensor) -> torch.Tensor:
    """(H, L, L) scores with the upper triangle not allowed."""
    L = scores.shape[-1]
    return scores.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), NEG)


def own_picks(scores: torch.Tensor, k: int) -> torch.Tensor:
    """(H, Q, k) the top-k keys of each row, -1 where fewer than k keys are allowed."""
    top = torch.topk(scores, k, dim=-1)
    return top.indices.masked_fill(top.values == NEG, -1)


def one_hot_head(L: int, key_of) -> torch.Tensor:
    """(L, L) scores: each query t puts all its weight on key key_of(t) (10 against -10)."""
    s = torch.full((L, L), -10.0)
    for t in range(L):
        s[t, key_of(t)] = 10.0
    return s


# a text with repeats: "a b c d a b c d a b c d" -> query t's token appeared at t - 4, t - 8
IDS = [5, 6, 7, 8] * 3
L = len(IDS)


@pytest.fixture(scope="module")
def known():
    """Five heads whose tag is known: sink, previous, copying, broad (uniform), mixed (self)."""
    induction = lambda t: t - 3 if t >= 4 else 0          # noqa: E731 - the key after the copy at t - 4
    heads = [one_hot_head(L, lambda t: 0), one_hot_head(L, lambda t: max(t - 1, 0)),
             one_hot_head(L, induction), torch.zeros(L, L), one_hot_head(L, lambda t: t)]
    scores = causal(torch.stack(heads))                                   # (5, L, L)
    return scores, measure_layer(2, scores, own_picks(scores, 2), IDS)


def test_known_heads_get_their_tags(known):
    _, tiles = known
    assert [t.tag for t in tiles] == ["sink", "previous", "copying", "broad", "mixed"]
    assert [(t.layer, t.head) for t in tiles] == [(2, h) for h in range(5)]
    sink, prev, copy, broad, mixed = tiles
    assert sink.sink == pytest.approx(1, abs=1e-6) and sink.previous == pytest.approx(0, abs=1e-6)
    assert prev.previous == pytest.approx(1, abs=1e-6) and prev.sink == pytest.approx(0, abs=1e-6)
    assert copy.copying == pytest.approx(1, abs=1e-6)
    assert broad.entropy == pytest.approx(1, abs=1e-6) and broad.copying < 0.5
    assert mixed.entropy == pytest.approx(0, abs=1e-6) and mixed.sink < 1e-6 and mixed.previous < 1e-6
    assert all(t.kept == pytest.approx(1, abs=1e-5) for t in tiles[:3] + [tiles[4]])   # one key each
    uniform = sum(min(2, t + 1) / (t + 1) for t in range(L)) / L                       # 2 of t + 1 keys
    assert broad.kept == pytest.approx(uniform, abs=1e-6)


def test_copying_is_undefined_without_a_repeat_and_short_texts_are_mixed():
    s = causal(torch.stack([one_hot_head(6, lambda t: 0)]))
    (tile,) = measure_layer(0, s, own_picks(s, 1), [1, 2, 3, 4, 5, 6])
    assert tile.copying is None and tile.tag == "sink"
    s = causal(torch.zeros(1, 2, 2))                                       # no query at position >= 2
    (tile,) = measure_layer(0, s, own_picks(s, 1), [1, 2])
    assert (tile.sink, tile.previous, tile.copying, tile.entropy, tile.tag) == (None, None, None, None, "mixed")


def test_rules_are_ordered_and_inclusive():
    assert RULES.tag(sink=0.9, previous=0.0, copying=RULES.copying, entropy=0.0) == "copying"
    assert RULES.tag(sink=0.49, previous=RULES.previous, copying=0.39, entropy=0.99) == "previous"
    assert RULES.tag(sink=RULES.sink, previous=0.1, copying=None, entropy=0.99) == "sink"
    assert RULES.tag(sink=0.2, previous=0.2, copying=None, entropy=RULES.broad) == "broad"
    assert RULES.tag(sink=0.2, previous=0.2, copying=0.1, entropy=0.5) == "mixed"
    assert set(HEAD_TAGS) == {"sink", "previous", "copying", "broad", "mixed"}
    for bad, said in (({"sink": 0}, "sink = 0 is outside the valid range (0, 1]"),
                      ({"broad": 1.5}, "broad = 1.5"), ({"grid": 0}, "grid = 0 is outside the valid range [1, 256]"),
                      ({"levels": 1}, "levels = 1")):
        with pytest.raises(GatherValueError, match=re.escape(said)):
            HeadRules(**bad)


def reference(scores, picks, ids, rules):
    """Plain per-query loops: the shares and the grid of one head, as the module doc defines them."""
    Q, L = scores.shape
    dense = torch.softmax(scores.double(), -1).nan_to_num(0.0)
    s, p, c, e, kept = [], [], [], [], []
    key_ids = ids[len(ids) - L:]
    for i in range(Q):
        t = i + L - Q
        allowed = [j for j in range(L) if scores[i, j] > NEG]
        if allowed:
            kept.append(sum(float(dense[i, j]) for j in picks[i].tolist() if j >= 0))
        if t < 2 or len(allowed) < 2:
            continue
        s.append(float(dense[i, 0]))
        p.append(float(dense[i, t - 1]))
        targets = [q + 1 for q in range(t) if key_ids[q] == key_ids[t] and q + 1 <= t - 2]
        if targets:
            c.append(sum(float(dense[i, j]) for j in targets))
        w = [float(dense[i, j]) for j in allowed]
        e.append(-sum(x * math.log(x) for x in w if x > 0) / math.log(len(allowed)))
    mean = lambda xs: sum(xs) / len(xs) if xs else None                   # noqa: E731
    gq, gk = min(rules.grid, Q), min(rules.grid, L)
    grid = []
    for b in range(gq):
        rows = [i for i in range(Q) if i * gq // Q == b]
        line = []
        for a in range(gk):
            cols = [j for j in range(L) if j * gk // L == a]
            seen = any(scores[i, j] > NEG for i in rows for j in cols)
            w = sum(float(dense[i, j]) for i in rows for j in cols) / len(rows)
            line.append(round(min(w, 1.0) * (rules.levels - 1)) if seen else -1)
        grid.append(tuple(line))
    return mean(s), mean(p), mean(c), mean(e), mean(kept), tuple(grid)


@pytest.mark.parametrize("L, Q, grid", [(9, 9, 16), (40, 40, 16), (23, 23, 5), (12, 5, 16)])
def test_measure_layer_matches_the_plain_reference(L, Q, grid):
    torch.manual_seed(L * 7 + Q)
    raw = torch.randn(3, Q, L) * 3                                         # (H, Q, L)
    off = L - Q
    mask = torch.ones(Q, L, dtype=torch.bool).tril(diagonal=off)
    scores = raw.masked_fill(~mask, NEG)
    ids = torch.randint(0, 4, (L,)).tolist()                              # many repeats
    picks = own_picks(scores, 3)
    rules = HeadRules(grid=grid)
    for tile, h in zip(measure_layer(1, scores, picks, ids, rules), range(3)):
        s, p, c, e, kept, g = reference(scores[h], picks[h], ids, rules)
        for got, want in ((tile.sink, s), (tile.previous, p), (tile.copying, c), (tile.entropy, e),
                          (tile.kept, kept)):
            assert (got is None) == (want is None) and (want is None or got == pytest.approx(want, abs=1e-5))
        assert len(tile.grid) == min(grid, Q) and len(tile.grid[0]) == min(grid, L)
        diff = [abs(a - b) for ra, rb in zip(tile.grid, g) for a, b in zip(ra, rb)]
        assert max(diff) <= 1 and sum(diff) <= 2                         # float32 vs float64 at a .5 edge
        assert all((a < 0) == (b < 0) for ra, rb in zip(tile.grid, g) for a, b in zip(ra, rb))
        assert tile.tag == rules.tag(s, p, c, e)


def test_maps_of_known_heads(known):
    _, tiles = known
    sink, prev = tiles[0].grid, tiles[1].grid
    top = RULES.levels - 1
    assert all(row[0] == top for row in sink)                             # every query on key 0
    assert all(v == -1 for r, row in enumerate(sink) for c, v in enumerate(row) if c > r)  # causal
    assert [prev[r][r - 1] for r in range(1, L)] == [top] * (L - 1)


# -- the picture ---------------------------------------------------------------------------------
def small_gallery(layers=3, heads=2, chosen=(2, 1)) -> HeadGallery:
    tiles = []
    for layer in range(layers):
        for head in range(heads):
            tag = HEAD_TAGS[(layer * heads + head) % len(HEAD_TAGS)]
            grid = tuple(tuple(-1 if c > r else (r + c + layer) % 16 for c in range(4)) for r in range(4))
            tiles.append(HeadTile(layer=layer, head=head, tag=tag, kept=0.5 + 0.01 * head, sink=0.1,
                                  previous=0.2, copying=None, entropy=0.3, grid=grid))
    return HeadGallery(layers=layers, heads=heads, top_k=4, dense_run=False, levels=16,
                       tiles=tuple(tiles), layer=chosen[0], head=chosen[1])


def atlas_pixels(svg: str):
    from PIL import Image

    uri = re.search(r'href="data:image/png;base64,([^"]+)"', svg).group(1)
    import base64

    img = Image.open(io.BytesIO(base64.b64decode(uri))).convert("RGB")
    return img, lambda x, y: "#%02x%02x%02x" % img.getpixel((x, y))


@pytest.mark.parametrize("lang, head_word, short", [("en", "head 1", "sink"), ("zh", "头 1", "首词")])
def test_gallery_svg_is_drawn_from_its_record(lang, head_word, short):
    g = small_gallery()
    svg = gallery_svg(g, lang)
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    thumbs = [e for e in root.iter(f"{ns}g") if e.get("class") == "gl-thumb"]
    assert len(thumbs) == 6
    assert [(int(t.get("data-layer")), int(t.get("data-head"))) for t in thumbs] == [(l, h) for l in range(3) for h in range(2)]
    assert [t.get("data-tag") for t in thumbs] == [t.tag for t in g.tiles]
    for t, tile in zip(thumbs, g.tiles):
        texts = [x.text for x in t.iter(f"{ns}text")]
        frame = next(u for u in t.iter(f"{ns}use") if u.get("href") == "#gl-frame")  # after its hit box
        assert texts[1] == f"{tile.kept:.0%}" and frame.get("stroke") == TAG_COLOURS[tile.tag]
        view = t.find(f"{ns}svg").get("viewBox")
        assert view == f"{tile.layer * 4} {tile.head * 4} 4 4"               # its own block of the atlas
    sel = next(e for e in root.iter(f"{ns}rect") if e.get("class") == "gl-gallery-sel")
    assert sel.get("transform") == thumbs[2 * 2 + 1].get("transform")      # the chosen head: layer 2, head 1
    assert head_word in svg and f">{short}<" in svg and "top-4" in svg
    img, px = atlas_pixels(svg)
    assert img.size == (3 * 4, 2 * 4)
    for tile in g.tiles:
        for r in range(4):
            for c in range(4):
                v = tile.grid[r][c]
                want = MASKED if v < 0 else weight_colour(v / 15)
                assert px(tile.layer * 4 + c, tile.head * 4 + r) == want


def test_gallery_of_smollm2_size_has_270_thumbnails():
    """30 x 9 tiles of 16 x 16 blocks: the count, and what it adds to a page."""
    g = small_gallery(layers=30, heads=9, chosen=(15, 0))
    tiles = tuple(HeadTile(**{**t.__dict__, "grid": tuple(tuple(-1 if c > r else (r * c) % 16 for c in range(16))
                                                          for r in range(16))}) for t in g.tiles)
    svg = gallery_svg(HeadGallery(**{**g.__dict__, "tiles": tiles}), "en")
    assert svg.count('class="gl-thumb"') == 270
    assert len(svg.encode()) < 120_000                                     # ~0.4 KB a head, the maps in one PNG


def test_palette_png_round_trips_and_checks_its_input():
    from PIL import Image

    rows = [[0, 1, 2], [2, 1, 0]]
    png = palette_png(rows, ["#ffffff", "#2154a0", "#e4e4e4"])
    img = Image.open(io.BytesIO(png))
    assert img.mode == "P" and img.size == (3, 2) and [img.getpixel((x, y)) for y in range(2) for x in range(3)] == [0, 1, 2, 2, 1, 0]
    assert png == palette_png(rows, ["#ffffff", "#2154a0", "#e4e4e4"])     # the same bytes every time
    assert data_uri(png).startswith("data:image/png;base64,iVBOR")
    with pytest.raises(GatherValueError, match=r"rows\[1\] must hold 3 indices in \[0, 2\]"):
        palette_png([[0, 1, 2], [0, 3, 0]], ["#ffffff", "#2154a0", "#e4e4e4"])
    with pytest.raises(GatherValueError, match="palette has 0 colours"):
        palette_png([[0]], [])


# -- in the report: a tiny random Llama (2 layers, 4 query heads over 2 KV heads) ----------------
@pytest.fixture(scope="module")
def story(tmp_path_factory):
    from gatherlens.models import load
    from gatherlens.report.collect import collect
    from tiny_models import make_tiny_llama

    lm = load(str(make_tiny_llama(tmp_path_factory.mktemp("m") / "tiny")))
    return collect(lm, "the cat sat on the mat and the cat sat on the hat", top_k=3, layer=1, head=2)


def test_head_gallery_of_a_story_is_its_explore_data_measured(story):
    g = head_gallery(story)
    x = story.explore
    assert (g.layers, g.heads, g.top_k, g.layer, g.head, g.dense_run) == (2, 4, 3, 1, 2, False)
    for layer in range(2):
        again = measure_layer(layer, x.scores[layer], x.picks[layer], story.ids)
        assert [g.tile(layer, h) for h in range(4)] == again
    att = story.attention                                                 # the detailed head's kept share
    Q = att.scores.shape[0]
    masses = [float(att.dense[i, [j for j in att.indices[i].tolist() if j >= 0]].sum()) for i in range(Q)]
    assert g.tile(1, 2).kept == pytest.approx(sum(masses) / Q, abs=1e-5)
    assert g.tile(1, 2).copying is not None                               # "the cat sat on the" repeats
    data = json.loads(json.dumps(gallery_data(g)))
    assert len(data["tiles"]) == 8 and data["rules"]["copying"] == RULES.copying
    assert data["tiles"][6]["map"] == [list(r) for r in g.tile(1, 2).grid]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_report_has_the_gallery_section_and_file(story, lang, tmp_path):
    from gatherlens.report.build import build_report, write_report

    report = build_report(story, lang=lang)
    page = report.html
    assert '<section id="gallery">' in page and page.index('id="gallery"') < page.index('id="gl-controls"')
    assert page.count('class="gl-thumb"') == 8 and 'id="fig-02-heads-gallery"' in page
    fig = next(f for f in report.figures if f.name == "02-heads-gallery")
    assert fig.svg == gallery_svg(head_gallery(story), lang)
    size = re.search(r"(\d+\.\d KiB)", html.unescape(page.split('id="gallery"', 1)[1])).group(1)
    assert size == f"{len(fig.svg.encode()) / 1024:.1f} KiB"              # the page says what it adds
    words = ("copying (induction)", "40%", "first-token sink") if lang == "en" else ("复制（归纳）", "40%", "首词汇聚")
    for w in words:
        assert w in html.unescape(page), w
    names = {p.name for p in write_report(story, tmp_path / "r", lang=lang)}
    assert "02-heads-gallery.svg" in names
    assert 'id="user-text"' in page                                        # offline: the text is shown once


def test_the_guide_states_the_rules_as_the_code_has_them():
    for name in ("guide.md", "guide.zh.md"):
        guide = (DOCS / name).read_text(encoding="utf-8")
        for value in (RULES.copying, RULES.previous, RULES.sink):
            assert f"{value:.0%}" in guide, (name, value)
        assert f"{RULES.broad:.0%}" in guide and "figures/gallery.png" in guide


def test_a_long_run_is_measured_on_evenly_spaced_rows(story):
    """Past HeadRules.rows queries (long live texts) a head is measured on that many rows, evenly
    spaced: the same as measure_layer on those rows of the full grid, at their positions."""
    from gatherlens.report.heads import measured_rows

    rules = HeadRules(rows=5)
    S = len(story.ids)
    rows = measured_rows(S, rules)
    assert rows.tolist()[0] == 0 and rows.tolist()[-1] == S - 1 and len(set(rows.tolist())) == 5
    assert measured_rows(S, HeadRules(rows=S)).tolist() == list(range(S))
    g = head_gallery(story, rules)
    x = story.explore
    for layer in range(2):
        want = measure_layer(layer, x.scores[layer][:, rows], x.picks[layer][:, rows], story.ids, rules,
                             positions=rows)
        got = [g.tile(layer, h) for h in range(4)]
        for a, b in zip(got, want):
            assert a.tag == b.tag and a.grid == b.grid
            assert a.kept == pytest.approx(b.kept, abs=1e-6) and a.sink == pytest.approx(b.sink, abs=1e-6)
