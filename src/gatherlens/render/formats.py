"""One function draws anything drawable in any format: the door `drawable.py` opens from below.

    >>> draw(record, "svg", lang="zh")                 # == render_svg(record, lang="zh")
    >>> draw(sel, "html", head=1)                      # a selection: its record first (trace.as_record)
    >>> draw(sel, "png", path="pages.png", scale=2.0)

Formats: "record" (the GatherRecord itself), "svg", "html", "html_fragment" (what a notebook
embeds), "png" (needs `path`), "terminal" (a rich renderable) and "print" (to the terminal).
Options that choose what to record (`batch`, `head`, `query`, `labels`) go to
`trace.as_record`; the rest go to the renderer. `lang` defaults to the record's own.

A picture file's content by its suffix (`drawable.FILE_FORMATS`, the one table): `picture_file(".png",
svg, html)`, from any picture's two drawers.
"""
from __future__ import annotations

from gatherlens.drawable import FILE_FORMATS
from gatherlens.errors import GatherValueError
from gatherlens.render.html import render_html, render_html_fragment
from gatherlens.render.png import png_bytes, render_png
from gatherlens.render.quantized import FORMATS as QUANTIZED_FORMATS
from gatherlens.render.svg import render_svg
from gatherlens.render.terminal import print_terminal, render_terminal
from gatherlens.trace.convert import as_record
from gatherlens.trace.quantized import QuantizedGatherRecord
from gatherlens.trace.record import GatherRecord

__all__ = ["draw", "FORMATS", "RECORD_OPTIONS", "picture_file"]

FORMATS = {
    "svg": render_svg,
    "html": render_html,
    "html_fragment": render_html_fragment,
    "png": render_png,
    "terminal": render_terminal,
    "print": print_terminal,
}
RECORD_OPTIONS = ("batch", "head", "query", "labels")


def draw(obj, fmt: str = "svg", **options):
    """Draw a GatherRecord, or anything `trace.as_record` turns into one, as `fmt`."""
    if fmt == "record":
        return as_record(obj, **options)
    if fmt not in FORMATS:
        raise GatherValueError(f"fmt = {fmt!r} must be 'record' or one of {tuple(FORMATS)}")
    build = {name: options.pop(name) for name in RECORD_OPTIONS if name in options}
    lang = options.pop("lang", None)
    if lang is not None and not isinstance(obj, GatherRecord):
        build["lang"] = lang  # a selection's captions are written in the language it is drawn in
    record = as_record(obj, **build)
    if isinstance(record, QuantizedGatherRecord):  # a gather from GGUF blocks: its own picture
        return QUANTIZED_FORMATS[fmt](record, lang=lang or record.lang, **options)
    return FORMATS[fmt](record, lang=lang or record.lang, **options)


def picture_file(suffix: str, svg, html) -> str | bytes:
    """What a picture file ending in `suffix` holds: `picture_file(".png", rec.to_svg, rec.to_html)` -> PNG bytes.

    The format is `drawable.FILE_FORMATS[suffix]`; `svg` and `html` are the picture's drawers (called
    with no arguments, only the one needed); a PNG is the SVG rasterised (`png_bytes`, scale 2).
    """
    fmt = FILE_FORMATS.get(suffix.lower())
    if fmt is None:
        raise GatherValueError(f"suffix = {suffix!r} must be one of {', '.join(FILE_FORMATS)}")
    return {"svg": svg, "html": html, "png": lambda: png_bytes(svg())}[fmt]()
