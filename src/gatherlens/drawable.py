"""The drawing doors of data that lives below `render/`.

    >>> class MySelection(Drawable):
    ...     def to_record(self, **kw): ...     # -> gatherlens.trace.GatherRecord
    >>> MySelection().to_svg()

A class supplies `to_record()`; the mixin gives it `.to_svg()`, `.to_html()`, `.to_png(path)` and
the Jupyter hooks, all drawn from that record. This module imports nothing, so `ops/` can use it
without importing `trace/` or `render/` at load time.
"""
from __future__ import annotations


class Drawable:
    """Mixin: every picture of an object is the picture of its `to_record()`."""

    def to_record(self, **kw):  # pragma: no cover - supplied by the class
        raise NotImplementedError

    def to_svg(self, **kw) -> str:
        return self.to_record().to_svg(**kw)

    def to_html(self, **kw) -> str:
        return self.to_record().to_html(**kw)

    def to_png(self, path, **kw):
        return self.to_record().to_png(path, **kw)

    def _repr_svg_(self) -> str:
        return self.to_svg()

    def _repr_html_(self) -> str:
        return self.to_record()._repr_html_()
