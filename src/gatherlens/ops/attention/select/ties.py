"""The tie rule of every top-k selection, in one place.

    >>> above = torch.tensor([[False, True, False, False]])      # keys above the k-th value
    >>> tied = torch.tensor([[True, False, True, True]])         # keys equal to it
    >>> keep_ties(above, tied, 3)                                # k = 3: the two lowest-index ties
    tensor([[ True,  True,  True, False]])

Rule (documented in `topk_attention`): keys are ranked by (logit descending, key index ascending);
only finite logits are allowed; a row with fewer than k allowed keys keeps those. So a row keeps
every key above its k-th largest allowed value, then the keys equal to it, lowest index first,
until k are kept. The functions take numpy arrays or torch tensors alike; the C++ kernel
(threshold_select.cpp, `find_cut`) and the plain reference (naive.py: a stable sort) follow the
same rule and are tested against these.
"""
from __future__ import annotations

from gatherlens.ops.dtypes import NEG_INF

__all__ = ["keep_ties", "keep_at_cut", "tie_across_cut"]


def keep_ties(above, tied, k: int):
    """above, tied (..., L) bool -> keep (..., L): all of above, then the first tied keys until k."""
    need = k - above.sum(-1)[..., None]                         # (..., 1) ties still to take
    return above | (tied & (tied.cumsum(-1) <= need))          # (..., L)


def keep_at_cut(x, edge, k: int):
    """x (..., L), edge (..., 1) each row's k-th largest allowed value -> keep (..., L), the rule.

    An edge of -inf (fewer than k allowed keys) keeps every finite key.
    """
    above = x > edge                                            # (..., L)
    tied = (x == edge) & (edge > NEG_INF)                       # (..., L) never a forbidden key
    return keep_ties(above, tied, k)


def tie_across_cut(edge, below):
    """edge (...) the k-th largest, below (...) the largest value outside a top-k set -> bool (...):
    the set may hold the wrong ones of several equal values (a finite tie across the cut)."""
    return (below == edge) & (edge > NEG_INF)
