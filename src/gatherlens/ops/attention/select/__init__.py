"""The one home of top-k selection: which keys each row of logits keeps.

    >>> vals, idx = select_topk(logits, 8)                       # any tensor, best first (exact_topk.py)
    >>> vals, idx, w, lse = topk_rows(x, 8, weights=True)        # CPU rows, with softmax weights
    >>> rank, idx = topk_summed_rows(s, 8)                       # share_selection: summed head rows

- `ties.py`: the tie rule (logit descending, then key index ascending; finite logits only) that
  every path below calls, and the C++ kernel and naive.py follow.
- `exact_topk.py`: `select_topk`, `keep_mask`, `indices_to_mask` for any device and autograd,
  over `partial.py` (an unordered top-k set: numpy's introselect on CPU, torch.topk elsewhere).
- `threshold_select.py`: `topk_rows`, `topk_weights_` for the CPU fast path: the C++ operators
  (`threshold_kernel.py`, `threshold_select.cpp`, built by ops/native.py) or numpy
  (`threshold_numpy.py`), the same keys.
- `summed_rows.py`: `topk_summed_rows`, share_selection's ranking.
- `workers.py`: the one worker pool (row blocks, and the CPU path's prefill chunks).
"""
from gatherlens.ops.attention.select.exact_topk import indices_to_mask, keep_mask, select_topk
from gatherlens.ops.attention.select.summed_rows import topk_summed_rows
from gatherlens.ops.attention.select.threshold_select import topk_rows, topk_weights_
from gatherlens.ops.attention.select.ties import keep_at_cut, keep_ties, tie_across_cut
from gatherlens.ops.attention.select.workers import in_workers, map_row_ranges

__all__ = ["select_topk", "keep_mask", "indices_to_mask", "topk_rows", "topk_weights_", "topk_summed_rows",
           "keep_ties", "keep_at_cut", "tie_across_cut", "map_row_ranges", "in_workers"]
