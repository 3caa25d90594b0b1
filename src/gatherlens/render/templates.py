"""The one jinja2 environment every picture and page is drawn with (templates in templates/).

    >>> svg = render_template("figure.svg.j2", s=place([layout(rec)]), font=FONTS["en"], mono=MONO)

Autoescaping is on for every template, so a label such as a `<script>` token lands in the SVG or
HTML as text, never as markup; StrictUndefined turns a missing value into an error, not a blank.
Used by svg.py, html.py, report_figures.py and the `explain` report's page.
"""
from __future__ import annotations

from functools import lru_cache

import jinja2

__all__ = ["environment", "render_template"]


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The template environment: package templates, autoescape for every template."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("gatherlens.render", "templates"),
        autoescape=True,
        trim_blocks=False,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )


def render_template(name: str, **context) -> str:
    """Render the template `name` (e.g. "figure.svg.j2") with `context`."""
    return environment().get_template(name).render(**context)
