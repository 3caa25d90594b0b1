"""The part of one head's scores a long text's view shows: query rows around the chosen query.

    >>> w = attention_window(run, layer=15, head=3, query=1000, k=4)      # run: RunTensors
    >>> w["rows"], w["keys"]              # the grid's query rows and key columns, [start, stop)
    ([992, 1008), [960, 1008))
    >>> sorted(w)[:4]
    ['head', 'k', 'keys', 'layer']

What the page's script reads for a text past the offline page's limit (`gatherlens serve`):
the full score row of each of the WINDOW_ROWS query rows (float32, so the dense weights, the
top-k at any k and the kept keys are exact), the model's own picks of those rows, the V columns
the value figure draws for key 0 and the chosen query's kept keys. The score grid draws the
WINDOW_KEYS key columns that end at the last row (causal) or centre on the query.
"""
from __future__ import annotations

import base64

import torch

from gatherlens.ops.attention.select import select_topk
from gatherlens.report.explore import value_columns
from gatherlens.report.run_tensors import RunTensors, kind_data

__all__ = ["attention_window", "grid_span", "kept_keys", "span", "WINDOW_ROWS", "WINDOW_KEYS"]

WINDOW_ROWS = 16     # query rows of the long score grid (the gather figure shows 12 of them)
WINDOW_KEYS = 48     # key columns of the long score grid


def span(n: int, centre: int, size: int) -> tuple[int, int]:
    """[start, stop) of `size` positions of n around `centre`, kept inside [0, n)."""
    w = min(n, size)
    start = min(max(centre - w // 2, 0), n - w)
    return start, start + w


def grid_span(run: RunTensors, query: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(rows, keys): the WINDOW_ROWS query rows around `query` and the WINDOW_KEYS key columns the grid
    draws, each [start, stop): ending at the last row's key (causal) or centred on the query."""
    N, Hq, Q, L = run.shape
    r0, r1 = span(Q, query, WINDOW_ROWS)
    if run.causal:
        c1 = min(L, r1 + L - Q)
        c0 = max(0, c1 - WINDOW_KEYS)
    else:
        c0, c1 = span(L, query + L - Q, WINDOW_KEYS)
    return (r0, r1), (c0, c1)


def kept_keys(run: RunTensors, layer: int, head: int, query: int, k: int, row: torch.Tensor) -> list[int]:
    """The keys query `query` keeps at k: the model's own picks at its k, else the top-k of `row`
    (the same tie rule as the model: lower key first); best first."""
    if k == run.run_k and not run.dense_run:
        return [j for j in run.picks[layer, head, query].tolist()[:k] if j >= 0]
    _, idx = select_topk(row.unsqueeze(0), k)                                 # (1, k)
    return [j for j in idx[0].tolist() if j >= 0]


def attention_window(run: RunTensors, layer: int, head: int, query: int, k: int) -> dict:
    """JSON-ready window of (layer, head) around `query` (see the module doc)."""
    run.check(layer, head, query)
    (r0, r1), (c0, c1) = grid_span(run, query)
    scores = run.scores(layer, head, range(r0, r1))                           # (R, L)
    kept = kept_keys(run, layer, head, query, k, scores[query - r0])
    cols = value_columns(run.value.shape[-1])
    need = sorted({0, *kept})
    v = run.value[layer, run.kv_head(head)][need][:, cols]                    # (n, C)
    return {"layer": layer, "head": head, "query": query, "k": k, "rows": [r0, r1], "keys": [c0, c1],
            "kind": kind_data(run.kinds[layer]),
            "scores": base64.b64encode(scores.contiguous().numpy().tobytes()).decode("ascii"),
            "picks": run.picks[layer, head, r0:r1].tolist(),
            "values": {str(j): [float(x) for x in row] for j, row in zip(need, v.tolist())}}
