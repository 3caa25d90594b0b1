"""SVG: deterministic (golden files), well-formed, escaped, elided, hover links that resolve."""
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gatherlens.trace import record_embedding, record_gather, record_take_along_dim
from golden_cases import GOLDEN, example_svg  # tests/golden_cases.py

GOLDEN_DIR = Path(__file__).parent / "golden"
NS = "{http://www.w3.org/2000/svg}"


@pytest.mark.parametrize("name,lang", GOLDEN, ids=[f"{n}-{lang}" for n, lang in GOLDEN])
def test_svg_matches_golden_file(name, lang):
    path = GOLDEN_DIR / f"{name}.{lang}.svg"
    assert path.exists(), f"missing {path}; run: .venv/bin/python scripts/regen_golden.py"
    got = example_svg(name, lang)
    assert got == example_svg(name, lang), "two renders of the same record differ"
    assert got == path.read_text(encoding="utf-8"), (
        f"{path.name} changed; if intended run .venv/bin/python scripts/regen_golden.py and "
        f"review the diff")


def _cells(svg):
    root = ET.fromstring(svg)
    return root, [g for g in root.iter(f"{NS}g") if "gl-cell" in g.get("class", "")]


def test_cells_carry_colour_and_index():
    rec = record_gather(torch.arange(12.0).view(3, 4), 0, torch.tensor([[2, 0, 1, 2]]))
    root, cells = _cells(rec.to_svg())
    by_key = {g.get("data-key"): g for g in cells}
    out = by_key["out-0-0"]
    assert out.get("data-src") == "src-2-0" and out.get("data-idx") == "idx-0-0"
    src_fill = by_key["src-2-0"].find(f"{NS}rect").get("fill")
    assert out.find(f"{NS}rect").get("fill") == src_fill != "#f2f2f2"
    texts = [t.text for t in out.iter(f"{NS}text")]
    assert texts == ["2", "8"]  # the index that picked it, the value copied
    assert by_key["src-1-0"].find(f"{NS}rect").get("fill") == "#f2f2f2"  # not picked: grey


@given(data=st.data(), R=st.integers(1, 6), C=st.integers(1, 6), n=st.integers(1, 4))
def test_every_hover_link_resolves(data, R, C, n):
    idx = torch.tensor(data.draw(st.lists(st.lists(st.integers(0, R - 1), min_size=C, max_size=C),
                                          min_size=n, max_size=n)))
    dim = 0
    if data.draw(st.booleans()):
        idx, dim = idx.clamp(max=C - 1)[:, :C], 1
        idx = idx[: min(n, R)]
    rec = record_gather(torch.arange(R * C).view(R, C), dim, idx)
    _, cells = _cells(rec.to_svg())
    keys = {g.get("data-key") for g in cells}
    outs = [g for g in cells if g.get("data-src")]
    assert len(outs) == idx.numel()
    for g in outs:
        assert g.get("data-src") in keys and g.get("data-idx") in keys


NASTY = st.lists(st.sampled_from(list("<>&\"'/ab =;%") + ["<script>", "]]>", "{{", "中"]),
                 min_size=1, max_size=8).map("".join)


@given(labels=st.lists(NASTY, min_size=3, max_size=3))
def test_labels_are_text_never_markup(labels):
    rec = record_embedding(torch.tensor([[1, 0, 2]]), torch.randn(3, 2), labels=labels)
    svg = rec.to_svg()
    root = ET.fromstring(svg)  # well-formed whatever the labels hold
    assert not [e for e in root.iter() if e.tag.split("}")[-1] in ("script", "foreignObject")]
    texts = " ".join((e.text or "") for e in root.iter()) + " ".join(
        v for e in root.iter() for v in e.attrib.values())
    for lab in labels:
        assert lab in texts  # the whole label survives as text (in a tooltip)


def test_script_label_is_escaped():
    rec = record_embedding(torch.tensor([0]), torch.randn(2, 2),
                           labels=["<script>alert(1)</script>"])
    svg = rec.to_svg()
    assert "<script" not in svg
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in svg


def test_large_tensors_elided_with_picked_rows_visible():
    W = torch.randn(50257, 768)
    ids = torch.tensor([[464, 3797, 50256, 3797]])
    svg = record_embedding(ids, W).to_svg()
    root, cells = _cells(svg)
    assert len(cells) < 400
    keys = {g.get("data-key") for g in cells}
    for i in (464, 3797, 50256):
        assert f"src-{i}-0" in keys and f"src-{i}-767" in keys
    assert "⋮" in svg and "…" in svg
    assert "(V, d) = (50257, 768)" in svg and "(B, S, d) = (1, 4, 768)" in svg


def test_many_slices_elided():
    x = torch.randn(7, 3, 4)
    rec = record_take_along_dim(x, torch.zeros(7, 3, 1, dtype=torch.long), dim=2)
    svg = rec.to_svg()
    assert "[0, :, :]" in svg and "[6, :, :]" in svg and "… 4 more" in svg
    assert "另有 4 片" in rec.to_svg(lang="zh")


def test_chinese_captions_and_repr():
    rec = record_gather(torch.arange(4.0).view(2, 2), 1, torch.tensor([[1], [0]]), lang="zh")
    svg = rec.to_svg()
    assert "源张量" in svg and "输出" in svg and "Noto Sans CJK SC" in svg
    assert rec._repr_svg_() == svg
    assert "source" in rec.to_svg(lang="en")
    with pytest.raises(ValueError, match="lang"):
        rec.to_svg(lang="fr")


@given(data=st.data(), shape=st.lists(st.integers(1, 4), min_size=1, max_size=4),
       n=st.integers(0, 3), lang=st.sampled_from(["en", "zh"]))
def test_any_record_draws_in_every_format(data, shape, n, lang):
    """Random gathers (any rank, empty outputs included) draw as SVG, HTML and terminal text."""
    from rich.console import Console

    from gatherlens.render.layout import Limits
    from gatherlens.trace import record_index_select

    x = torch.randn(shape)
    dim = data.draw(st.integers(0, len(shape) - 1), label="dim")
    ishape = [n if ax == dim else data.draw(st.integers(1, s), label="size")
              for ax, s in enumerate(shape)]
    idx = torch.randint(0, shape[dim], ishape)
    lim = Limits(rows=data.draw(st.integers(2, 6)), cols=data.draw(st.integers(2, 6)),
                 slices=data.draw(st.integers(1, 3)))
    for rec in (record_gather(x, dim, idx), record_index_select(x, dim, idx.reshape(-1)[:n])):
        root = ET.fromstring(rec.to_svg(lang=lang, limits=lim))
        assert root.tag == f"{NS}svg"
        assert rec.to_html(lang=lang, limits=lim).count("<script") == 1
        con = Console(record=True, width=300)
        rec.print_terminal(lang=lang, console=con, limits=lim)
        assert rec.call in con.export_text()
