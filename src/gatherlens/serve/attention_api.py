"""GET /api/attention: one head's rows around one query and the dense / top-k / sparse figure,
from the text's kept run (serve/runs.py), so a change of layer, head or query runs no model.

    GET /api/attention?text=&model=&k=&topk=&layer=&head=&query=&lang=&run_k=
    -> {"window": {...}, "compare": {...}, "svg": "<svg ...>", "cached": true}

window: report.window.attention_window (what the page's script draws the grid, the gather and
the value figures from; scores -inf where that layer's own mask forbids a key, and its kind and
window); compare: the numbers of the KeepComparison (keys each keeps, dense
weight on them, relative L2 of the outputs); svg: its figure (render.keep_compare). A text not
kept (a first request, or one pushed out of the cache) is run once, then kept. k is the k the
view selects with; run_k (default k) the k the run was made with, as the page shows it: a view
at another k selects from that run's scores.
"""
from __future__ import annotations

from dataclasses import replace

from gatherlens.params import head_index, layer_index, query_index
from gatherlens.serve.params import query_int
from gatherlens.serve.runs import KeptRun, RunCache, run_key

__all__ = ["attention_body", "kept_run", "compare_data", "run_k_param"]


def run_k_param(q, p, settings) -> int:
    """The run's k: the query's run_k (the page's) or the view's k; an int in [1, settings.max_k],
    read like every other int of the API (serve.params.query_int)."""
    return query_int(q, "run_k", p.k, 1, settings.max_k)


def kept_run(lm, p, settings, runs: RunCache) -> tuple[KeptRun, bool]:
    """The kept run of these parameters, running the model when it is not kept; (run, was kept)."""
    from gatherlens.report.collect import collect

    key = run_key(p)
    run = runs.get(key)
    if run is not None:
        return run, True
    story = collect(lm, p.text, top_k=p.k if p.topk else None, max_tokens=settings.max_tokens)
    return runs.put(key, story.tensors, story.shown_tokens), False


def compare_data(rec) -> dict:
    """The KeepComparison's numbers (no tensors): what the page and a script read."""
    return {"layer": rec.layer, "head": rec.head, "query": rec.query, "topk": list(rec.topk),
            "pages": list(rec.pages), "page_size": rec.page_size, "budget": rec.budget,
            "topk_mass": round(rec.topk_mass, 6), "sparse_mass": round(rec.sparse_mass, 6),
            "topk_error": round(rec.topk_error, 6), "sparse_error": round(rec.sparse_error, 6),
            "keys": rec.length, "kind": rec.kind, "window": rec.window,
            "ring": list(rec.ring) if rec.ring is not None else None}


def attention_body(lm, p, settings, runs: RunCache, run_k: int | None = None) -> dict:
    """The answer of GET /api/attention (runs in a worker thread, with the model's lock held)."""
    from gatherlens.render.keep_compare import keep_comparison_svg
    from gatherlens.report.keep_compare import keep_comparison
    from gatherlens.report.window import attention_window

    run, cached = kept_run(lm, replace(p, k=run_k or p.k), settings, runs)
    t = run.tensors
    N, Hq, Q, L = t.shape
    layer = layer_index(N // 2 if p.layer is None else p.layer, N)   # /api/explain's checks and wording
    head, query = head_index(p.head, Hq, layer), query_index(p.query, Q)
    k = p.k if p.topk else min(p.k, L)
    rec = keep_comparison(t, run.tokens, layer, head, query, k, settings.sparse())
    return {"window": attention_window(t, layer, head, query, k), "compare": compare_data(rec),
            "svg": keep_comparison_svg(rec, p.lang), "cached": cached}
