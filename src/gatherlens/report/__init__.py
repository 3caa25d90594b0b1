"""The report of `gatherlens explain`: the article's story told on the user's text, with a real model.

    >>> from gatherlens.models import load
    >>> from gatherlens.report import write_report
    >>> from gatherlens.report.collect import collect
    >>> story = collect(load("smollm2"), "The cat sat on the mat because it was", top_k=4)
    >>> write_report(story, "gatherlens-report", lang="en")     # index.html + one .svg per figure

`collect` runs the model once under `gatherlens.trace()`; `sections` tells the story one
section per step (words from gatherlens.i18n, figures drawn by gatherlens.render: records, and
for the score grid and the head groups render.report_figures); `build` puts the sections on one
self-contained page and writes it with one SVG per figure. The terminal summary of `explain` is
render.summary. render reads no report object: `records` copies what its figures and the summary
show into plain records (gatherlens.trace.story_records).
"""
from __future__ import annotations

from gatherlens.lazy import lazy_exports

from gatherlens.report.defaults import DEFAULT_TEXT, MAX_TOKENS

# `collect` (the function) is imported from gatherlens.report.collect: the package attribute of
# that name is the submodule once it is imported, so exporting the function here would be fragile.
_LAZY = {
    "Story": "gatherlens.report.collect",
    "build_report": "gatherlens.report.build",
    "write_report": "gatherlens.report.build",
}
__all__ = ["Story", "build_report", "write_report", "DEFAULT_TEXT", "MAX_TOKENS"]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
