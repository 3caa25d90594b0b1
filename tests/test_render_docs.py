"""The guide's figures exist and are what scripts/make_figures.py draws today."""
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDES = [ROOT / "docs" / "guide.md", ROOT / "docs" / "guide.zh.md"]


def _make_figures():
    spec = importlib.util.spec_from_file_location("make_figures",
                                                  ROOT / "scripts" / "make_figures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.name)
def test_guide_figures_exist(guide):
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", guide.read_text(encoding="utf-8"))
    assert len(links) >= 9
    for link in links:
        assert (guide.parent / link).exists(), link
    lang = "zh" if ".zh." in guide.name else "en"
    drawn = [link for link in links if not link.endswith(".png")]  # .png: screenshots of the explorer
    assert len(drawn) >= 9 and all(f".{lang}.svg" in link for link in drawn)


def test_committed_figures_are_current():
    mf = _make_figures()
    figs = mf.OUT
    for lang in ("en", "zh"):
        for name, make in mf.FIGURES.items():
            path = figs / f"{name}.{lang}.svg"
            assert path.read_text(encoding="utf-8") == make(lang).to_svg(lang=lang), (
                f"{path.name} is stale: run .venv/bin/python scripts/make_figures.py")
    readme = (figs / "readme_embedding.svg").read_text(encoding="utf-8")
    assert readme == mf.embedding("en").to_svg()
