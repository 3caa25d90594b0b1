"""The article's two gather mistakes drawn beside the fix (one figure).

    >>> Path("mistakes.svg").write_text(mistakes_svg(lang="zh"))

1. `torch.gather(W, 0, ids.unsqueeze(-1).expand(-1, -1, d))`: a 3-D index on a 2-D table raises
   "Index tensor must have the same number of dimensions as input tensor" (explained in words).
2. `W.gather(0, ids)`: runs while seq_len <= d and returns out[b, s] = W[ids[b, s], s], one scalar
   per token (drawn: each token gets one cell, from a different column).
3. The fix, `W[ids]`: each token id picks its whole row (drawn).

The toy table holds W[r, c] = r + c / 10, so every value says where it came from.
"""
from __future__ import annotations

from pathlib import Path

import torch

from gatherlens.render.i18n import text
from gatherlens.render.scene import TextBox

V, D = 8, 5
TOKENS = ["I", "like", "tea"]
IDS = [[5, 2, 7]]


def toy_table() -> torch.Tensor:
    """(V, d) table with W[r, c] = r + c / 10."""
    return torch.arange(V).unsqueeze(1) + torch.arange(D).unsqueeze(0) / 10  # (V, d)


def mistakes_blocks(lang: str = "en") -> list:
    """Text boxes and records, in order: the error, the silent mistake, the fix."""
    from gatherlens.trace.builders import record_embedding, record_gather
    from gatherlens.trace.diagnose import diagnose_gather

    W = toy_table()  # (V, d)
    ids = torch.tensor(IDS)  # (B, S)
    B, S = ids.shape
    bad_index = ids.unsqueeze(-1).expand(-1, -1, D)  # (B, S, d): 3-D, W is 2-D
    try:
        torch.gather(W, 0, bad_index)
        raise AssertionError("torch.gather accepted a 3-D index on a 2-D table")  # never
    except RuntimeError as e:  # PyTorch's own words, checked at draw time
        assert "same number of dimensions" in str(e)
    silent = record_gather(W, 0, ids, name="W", index_name="ids", call="W.gather(0, ids)",
                           lang=lang)
    silent.meta["finding"] = diagnose_gather(W, 0, ids, warn=False)
    silent.output_row_labels = None
    silent.source_axes, silent.index_axes, silent.output_axes = ("V", "d"), ("B", "S"), ("B", "S")
    fix = record_embedding(ids, W, labels=TOKENS, lang=lang)
    return [
        TextBox(text("mistake_ndim_title", lang),
                text("mistake_ndim_body", lang, idx=f"(B, S, d) = {(B, S, D)}",
                     src=f"(V, d) = {(V, D)}"), tone="error"),
        TextBox(text("mistake_silent_title", lang), text("mistake_silent_body", lang),
                tone="warn"),
        silent,
        TextBox(text("mistake_fix_title", lang), text("mistake_fix_body", lang), tone="ok"),
        fix,
    ]


def mistakes_svg(lang: str = "en") -> str:
    from gatherlens.render.svg import render_blocks_svg

    return render_blocks_svg(mistakes_blocks(lang), lang=lang, title=text("mistakes_title", lang))


def mistakes_html(lang: str = "en") -> str:
    from gatherlens.render.html import render_blocks_html

    return render_blocks_html(mistakes_blocks(lang), lang=lang, title=text("mistakes_title", lang))


def mistakes_png(path: str | Path, lang: str = "en", scale: float = 2.0) -> Path:
    from gatherlens.render.png import svg_to_png

    return svg_to_png(mistakes_svg(lang), path, scale=scale)
