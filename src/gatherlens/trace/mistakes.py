"""The article's two gather mistakes and the fix, as data (render/mistakes.py draws them).

    >>> m = article_mistakes(lang="zh")
    >>> m.error                          # PyTorch's own words for mistake 1
    'Index tensor must have the same number of dimensions as input tensor'
    >>> m.silent.meta["finding"].kind    # diagnose_gather's finding on mistake 2
    'scalar_per_token'
    >>> m.fix.to_svg()                   # the fix, W[ids]

1. `torch.gather(W, 0, ids.unsqueeze(-1).expand(-1, -1, d))`: a 3-D index on a 2-D table raises
   "Index tensor must have the same number of dimensions as input tensor".
2. `W.gather(0, ids)`: runs while seq_len <= d and returns out[b, s] = W[ids[b, s], s], one scalar
   per token (its record: each token gets one cell, from a different column).
3. The fix, `W[ids]`: each token id picks its whole row.

The toy table holds W[r, c] = r + c / 10, so every value says where it came from.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gatherlens.trace.builders import record_embedding, record_gather
from gatherlens.trace.diagnose import diagnose_gather
from gatherlens.trace.record import GatherRecord

__all__ = ["ArticleMistakes", "article_mistakes", "toy_table", "V", "D", "TOKENS", "IDS"]

V, D = 8, 5
TOKENS = ["I", "like", "tea"]
IDS = [[5, 2, 7]]


def toy_table() -> torch.Tensor:
    """(V, d) table with W[r, c] = r + c / 10."""
    return torch.arange(V).unsqueeze(1) + torch.arange(D).unsqueeze(0) / 10  # (V, d)


@dataclass
class ArticleMistakes:
    """The two mistakes and the fix, run for real on the toy table."""

    error: str                      # what torch.gather raised for mistake 1
    index_shape: tuple[int, ...]    # (B, S, d): mistake 1's 3-D index
    table_shape: tuple[int, ...]    # (V, d): the 2-D table it was given
    silent: GatherRecord            # mistake 2; diagnose_gather's finding in meta["finding"]
    fix: GatherRecord               # W[ids]


def _ndim_error(W: torch.Tensor, bad_index: torch.Tensor) -> str:
    """PyTorch's own words for a 3-D index on a 2-D table, checked each time they are shown."""
    try:
        torch.gather(W, 0, bad_index)
    except RuntimeError as e:
        assert "same number of dimensions" in str(e), str(e)
        return str(e)
    raise AssertionError("torch.gather accepted a 3-D index on a 2-D table")


def article_mistakes(lang: str = "en") -> ArticleMistakes:
    """Run both mistakes and the fix on the toy table; records carry captions in `lang`."""
    W = toy_table()  # (V, d)
    ids = torch.tensor(IDS)  # (B, S)
    bad_index = ids.unsqueeze(-1).expand(-1, -1, D)  # (B, S, d): 3-D, W is 2-D
    error = _ndim_error(W, bad_index)
    silent = record_gather(W, 0, ids, name="W", index_name="ids", call="W.gather(0, ids)",
                           lang=lang)
    silent.meta["finding"] = diagnose_gather(W, 0, ids, warn=False)
    silent.output_row_labels = None
    silent.source_axes, silent.index_axes, silent.output_axes = ("V", "d"), ("B", "S"), ("B", "S")
    fix = record_embedding(ids, W, labels=TOKENS, lang=lang)
    return ArticleMistakes(error=error, index_shape=tuple(bad_index.shape),
                           table_shape=tuple(W.shape), silent=silent, fix=fix)
