"""PNG: the SVG rasterised by cairosvg (cairo does the drawing; no browser needed).

    >>> render_png(record, "gather.png", lang="zh")

cairosvg reads only the first family of a font-family list and draws each text run with that one
font (no glyph fallback). So before rasterising, runs of Chinese characters are put in their own
<tspan> with an installed CJK font: the one fontconfig reports for `:lang=zh` (Debian:
fonts-noto-cjk or fonts-droid-fallback; the latter has no Latin glyphs, hence the split runs).
Without any CJK font a Chinese PNG would show boxes, so we raise a clear error naming the
package instead.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

from gatherlens.errors import GatherValueError
from gatherlens.render.theme import text_width

CJK_PACKAGES = "fonts-noto-cjk (or fonts-droid-fallback, fonts-wqy-microhei)"


@lru_cache(maxsize=None)
def font_for(lang: str) -> str | None:
    """The family name fontconfig offers for `lang` ("zh", "en"), or None if none is installed."""
    if shutil.which("fc-list") is None:
        return None
    try:
        res = subprocess.run(["fc-list", f":lang={'zh' if lang == 'zh' else 'en'}", "family"],
                             capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    families = sorted({ln.split(",")[0].strip() for ln in res.stdout.splitlines() if ln.strip()})
    if not families:
        return None
    prefer = ["Noto Sans CJK SC", "Source Han Sans SC", "WenQuanYi Micro Hei",
              "Droid Sans Fallback", "DejaVu Sans"]
    for name in prefer:
        if name in families:
            return name
    return families[0]


def _needs_cjk(svg: str) -> bool:
    return re.search(r"[\u2e80-\u9fff\uff00-\uffef]", svg) is not None


_CJK = re.compile(r"([\u2e80-\u9fff\u3000-\u303f\uff00-\uffef]+)")
_SVG = "http://www.w3.org/2000/svg"


def _split_cjk_runs(svg: str, family: str) -> str:
    """Give every run of CJK characters in a <text> its own tspan in `family`."""
    import xml.etree.ElementTree as ET

    ET.register_namespace("", _SVG)
    root = ET.fromstring(svg)
    latin = font_for("en") or "sans-serif"
    root.set("font-family", latin)
    for node in root.iter(f"{{{_SVG}}}text"):
        content = node.text or ""
        if len(node) or not _CJK.search(content):
            continue
        node.text = None
        anchor = node.get("text-anchor", "start")
        if anchor != "start":  # cairosvg misplaces anchored text made of several tspans
            w = text_width(content, float(node.get("font-size", "12")))
            node.set("x", str(int(float(node.get("x", "0")) - (w if anchor == "end" else w / 2))))
            node.attrib.pop("text-anchor")
        for part in _CJK.split(content):
            if not part:
                continue
            span = ET.SubElement(node, f"{{{_SVG}}}tspan")
            span.text = part
            if _CJK.fullmatch(part):
                span.set("font-family", family)
    return ET.tostring(root, encoding="unicode")


def png_bytes(svg: str, scale: float = 2.0) -> bytes:
    """An SVG string rasterised to PNG bytes with the installed fonts that cover its text.

    >>> Path("g.png").write_bytes(png_bytes(render_svg(record)))   # what svg_to_png writes
    """
    import cairosvg

    if _needs_cjk(svg):
        family = font_for("zh")
        if family is None:
            raise GatherValueError(
                f"no font with Chinese glyphs is installed, so a zh PNG would show boxes; "
                f"install one, e.g. `apt-get install {CJK_PACKAGES}`, or use lang='en'"
            )
        svg = _split_cjk_runs(svg, family)
    return cairosvg.svg2png(bytestring=svg.encode("utf-8"), scale=scale)


def svg_to_png(svg: str, path: str | Path, scale: float = 2.0) -> Path:
    """Rasterise an SVG string to `path` (png_bytes) and return the path."""
    path = Path(path)
    path.write_bytes(png_bytes(svg, scale=scale))
    return path


def render_png(record, path: str | Path, lang: str = "en", scale: float = 2.0, **kw) -> Path:
    """Write one record as a PNG and return the path."""
    from gatherlens.render.svg import render_svg

    return svg_to_png(render_svg(record, lang=lang, **kw), path, scale=scale)
