"""The one door from below into `render/`: pictures of data that lives in `ops/` and `trace/`.

    >>> class MySelection(Drawable): ...      # and register a builder with trace.as_record
    >>> MySelection(...).to_svg()             # == gatherlens.render.draw(obj, "svg")

The mixin gives a class `.to_record()`, `.to_svg()`, `.to_html()`, `.to_png(path)`,
`.to_terminal()`, `.print_terminal()` and the Jupyter hooks. Every one of them is a single call
of `gatherlens.render.draw(obj, fmt, **options)`, imported when a picture is asked for
(`draw_lazily`), so this module imports nothing at load time and `ops/` and `trace/` stay below
`render/`. Options that choose what to record (`batch`, `head`, `query`, `labels`) go to
`gatherlens.trace.as_record`; the others (`lang`, `limits`, `scale`, `console`) to the renderer.

A picture file's suffix names its format here too (`FILE_FORMATS`, the one table: commands check an
output path against it before any slow work); `gatherlens.render.picture_file` writes each format.
"""
from __future__ import annotations

# a picture file's suffix -> the format it holds (a `draw` format; "png" is the SVG rasterised)
FILE_FORMATS = {".svg": "svg", ".html": "html", ".htm": "html", ".png": "png"}


def picture_suffixes(*formats: str) -> tuple[str, ...]:
    """`picture_suffixes("svg", "html")` -> ('.svg', '.html', '.htm'): the suffixes of those formats (all without)."""
    return tuple(s for s, fmt in FILE_FORMATS.items() if not formats or fmt in formats)


def draw_lazily(obj, fmt: str, **options):
    """`gatherlens.render.draw(obj, fmt, **options)`, importing render on first use."""
    from gatherlens.render import draw

    return draw(obj, fmt, **options)


class Drawable:
    """Mixin: every picture of an object is the picture of its record (`trace.as_record`)."""

    def to_record(self, **kw):
        """The GatherRecord this object is drawn from (see `gatherlens.trace.as_record`)."""
        return draw_lazily(self, "record", **kw)

    def to_svg(self, lang: str | None = None, **kw) -> str:
        """A standalone, deterministic SVG document."""
        return draw_lazily(self, "svg", lang=lang, **kw)

    def to_html(self, lang: str | None = None, **kw) -> str:
        """A self-contained HTML page (no network): hover an output cell to see its source."""
        return draw_lazily(self, "html", lang=lang, **kw)

    def to_png(self, path, lang: str | None = None, scale: float = 2.0, **kw):
        """Write a PNG (cairosvg) and return its path."""
        return draw_lazily(self, "png", path=path, lang=lang, scale=scale, **kw)

    def to_terminal(self, lang: str | None = None, **kw):
        """A rich renderable (print it with rich.print or a rich Console)."""
        return draw_lazily(self, "terminal", lang=lang, **kw)

    def print_terminal(self, lang: str | None = None, console=None, **kw) -> None:
        """Print the coloured terminal view."""
        draw_lazily(self, "print", lang=lang, console=console, **kw)

    def _repr_svg_(self) -> str:
        return self.to_svg()

    def _repr_html_(self) -> str:
        return draw_lazily(self, "html_fragment")
