"""The picture of a gather from GGUF blocks, in every format `render.draw` offers.

    >>> rec = record_quantized_embedding(ids, QuantizedTable.from_gguf(path, "token_embd.weight"))
    >>> quantized_svg(rec, lang="zh"); quantized_html(rec); rec.to_png("q.png"); rec.print_terminal()

The geometry is quantized_scene.py's; the SVG is drawn with the one template environment (templates/
quantized.svg.j2, autoescaped), fonts and colours from theme.py, words from i18n.py. `draw` sends a
QuantizedGatherRecord here (FORMATS), so `rec.to_svg()` and friends work as for every record.
"""
from __future__ import annotations

from pathlib import Path

from markupsafe import Markup
from rich.console import Console, Group
from rich.text import Text

from gatherlens.i18n import check_lang, text
from gatherlens.render.html import svg_fragment
from gatherlens.render.png import svg_to_png
from gatherlens.render.quantized_scene import code_label, quantized_scene
from gatherlens.render.templates import render_template
from gatherlens.render.theme import FONTS, MONO, colour, fmt_value

__all__ = ["quantized_svg", "quantized_html", "quantized_terminal", "FORMATS"]


def quantized_svg(rec, lang: str = "en") -> str:
    """A standalone, deterministic SVG of the record."""
    scene = quantized_scene(rec, check_lang(lang))
    return render_template("quantized.svg.j2", s=scene, font=FONTS[lang], mono=MONO)


def quantized_html(rec, lang: str = "en") -> str:
    """An offline HTML page around the SVG (hover a cell for its bytes, code and value)."""
    return render_template("page.html.j2", lang=lang, title=quantized_scene(rec, check_lang(lang)).label,
                           hint=text("qg_hint", lang), svg=Markup(quantized_svg(rec, lang)), font=FONTS[lang],
                           mono=MONO)


def _fragment(rec, lang: str = "en") -> str:
    return svg_fragment(quantized_svg(rec, lang))


def _png(rec, path: str | Path, lang: str = "en", scale: float = 2.0) -> Path:
    return svg_to_png(quantized_svg(rec, lang), path, scale=scale)


def quantized_terminal(rec, lang: str = "en") -> Group:
    """The same story as text: each id's row, then the written-out block's codes and values."""
    scene = quantized_scene(rec, check_lang(lang))
    lines = [Text(scene.label, style="bold"), Text(rec.describe(lang), style="dim")]
    for i, row in enumerate(rec.ids.reshape(-1).tolist()[:8]):
        row_text = text("qg_row", lang, row=row)
        lines.append(Text.assemble((f" {row} ", f"black on {colour(i)}"), f" {row_text} ({rec.row_bytes} B)"))
    terms = rec.terms
    lines.append(Text(text("qg_codes", lang, bits=terms.bits, formula=terms.formula), style="bold"))
    values = rec.focus_values().tolist()
    lines.append(Text("  ".join(f"{code_label(terms, k)}→{fmt_value(w)}" for k, w in enumerate(values))))
    return Group(*lines)


def _print(rec, lang: str = "en", console: Console | None = None) -> None:
    (console or Console()).print(quantized_terminal(rec, lang))


FORMATS = {"svg": quantized_svg, "html": quantized_html, "html_fragment": _fragment, "png": _png,
           "terminal": quantized_terminal, "print": _print}
