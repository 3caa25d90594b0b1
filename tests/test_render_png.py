"""PNG via cairosvg, including Chinese captions (needs a CJK font: fonts-noto-cjk or similar)."""
import pytest
import torch

from gatherlens.errors import GatherValueError
from gatherlens.render import png
from gatherlens.render.mistakes import mistakes_png
from gatherlens.trace import record_embedding

MAGIC = b"\x89PNG\r\n\x1a\n"


def test_png_written(tmp_path):
    rec = record_embedding(torch.tensor([[3, 1]]), torch.randn(5, 4), labels=["a", "<b>"])
    path = rec.to_png(tmp_path / "emb.png")
    data = path.read_bytes()
    assert data.startswith(MAGIC) and len(data) > 2000


@pytest.mark.skipif(png.font_for("zh") is None,
                    reason="no CJK font installed (apt-get install fonts-noto-cjk)")
def test_chinese_png_uses_a_cjk_font(tmp_path):
    rec = record_embedding(torch.tensor([[3, 1]]), torch.randn(5, 4), labels=["猫", "狗"],
                           lang="zh")
    path = rec.to_png(tmp_path / "zh.png", scale=1)
    assert path.read_bytes().startswith(MAGIC)
    split = png._split_cjk_runs(rec.to_svg(), png.font_for("zh"))
    assert f'font-family="{png.font_for("zh")}">源张量</tspan>' in split
    # the CJK font really draws glyphs: the same text in a Latin-only font looks different
    svg = ('<svg xmlns="http://www.w3.org/2000/svg" width="80" height="30">'
           '<text x="2" y="20" font-size="16" font-family="{}">中文</text></svg>')
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    png.svg_to_png(svg.format("DejaVu Sans"), a, scale=1)
    import cairosvg

    cairosvg.svg2png(bytestring=svg.format("DejaVu Sans").encode(), write_to=str(b), scale=1)
    assert a.read_bytes() != b.read_bytes()


def test_missing_cjk_font_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(png, "font_for", lambda lang: None)
    rec = record_embedding(torch.tensor([1]), torch.randn(2, 2), lang="zh")
    with pytest.raises(GatherValueError, match="fonts-noto-cjk"):
        rec.to_png(tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_mistakes_png(tmp_path):
    assert mistakes_png(tmp_path / "m.png", "en", scale=1).read_bytes().startswith(MAGIC)
