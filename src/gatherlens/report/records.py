"""The story as the plain records render draws: the score grid and the terminal summary.

    >>> scores_svg(score_grid(story.attention, story.shown_tokens), lang="zh")
    >>> print_summary(explain_summary(story), paths, Console(), lang="zh")

render reads no report object: what its figures and the summary show is copied here, from the
Story, into the records of gatherlens.trace.story_records (the head groups already are one).
"""
from __future__ import annotations

from gatherlens.trace.story_records import (Candidate, ExplainSummary, GatherLine, KeyRow,
                                            LookupLine, NextToken, ScoreGrid, TokenRow, TopKeys)

__all__ = ["score_grid", "explain_summary", "drawn_query"]

SHOWN_VALUES = 4  # values of each token's word-table row the summary prints


def score_grid(view, labels: list[str], run=None) -> ScoreGrid:
    """The score grid of an AttentionView (gatherlens.report.collect), positions named by `labels`;
    past MAX_TOKENS queries only the window the page draws (report.window.grid_span of `run`, the
    story's RunTensors), which also gives the layer's kind and window."""
    from gatherlens.report.defaults import MAX_TOKENS
    from gatherlens.report.window import grid_span

    Q, L = view.scores.shape
    (r0, r1), (c0, c1) = (0, Q), (0, L)
    if run is not None and Q > MAX_TOKENS:
        (r0, r1), (c0, c1) = grid_span(run, view.query - (len(labels) - Q))
    kind = run.kinds[view.layer] if run is not None else None
    return ScoreGrid(layer=view.layer, head=view.head, top_k=view.top_k, query=view.query,
                     scores=view.scores[r0:r1, c0:c1], dense=view.dense[r0:r1, c0:c1],
                     allowed=view.allowed[r0:r1, c0:c1], indices=view.indices[r0:r1], labels=tuple(labels),
                     row0=r0, col0=c0, queries=Q, keys=L, kind=kind.kind if kind else "full",
                     window=kind.window if kind else None)


def explain_summary(story) -> ExplainSummary:
    """The summary record of a Story (gatherlens.report.collect): every section's plain data."""
    word = next((e for e in story.embeddings if e.kind == "word"), None)
    gathers = tuple(GatherLine(op=g["op"], module=g["module"] or "", count=int(g["count"]),
                               bytes_read=int(g["bytes_read"])) for g in story.gathers)
    return ExplainSummary(
        model_name=story.model_name, model_class=story.model_class, text=story.text,
        table=_table_name(word),
        width=word.table_shape[1] if word is not None else 0,
        tokens=_token_rows(story, word), heads=story.heads, keys=_top_keys(story),
        lookups=tuple(LookupLine(module=e.module, table_shape=tuple(e.table_shape), ids=tuple(e.ids),
                                 row_bytes=_row_bytes(e)) for e in story.embeddings),
        next_token=_next_token(story), gathers=gathers, events=story.events,
        bytes_read=story.bytes_read)


def _row_bytes(e) -> int:
    """Bytes one row of the lookup's table takes: its GGUF blocks, or d x the element size."""
    return e.record.row_bytes if e.quantized else e.table_shape[1] * e.record.source.element_size()


def _table_name(word) -> str:
    """The word table's name as the summary heads its values ("" when no word lookup ran)."""
    if word is None:
        return ""
    return word.record.table_name if word.quantized else word.record.source_name


def _token_rows(story, word) -> tuple[TokenRow, ...]:
    """Each shown token, its id and the first values of the row it gathers (if a word lookup ran)."""
    if word is None:
        return tuple(TokenRow(t, i) for t, i in zip(story.shown_tokens, story.ids))
    rows = word.record.output.reshape(-1, word.table_shape[1])[:, :SHOWN_VALUES].tolist()  # (S, 4)
    return tuple(TokenRow(t, i, tuple(r)) for t, i, r in zip(story.shown_tokens, story.ids, rows))


def drawn_query(story) -> tuple[int, list[int], list[str]]:
    """`qrow, picked, keys = drawn_query(story)`: the drawn query's row in the attention view, the
    keys its top-k kept (best first) and the view's key tokens."""
    att, toks = story.attention, story.shown_tokens
    Q, L = att.scores.shape
    qrow = att.query - (len(toks) - Q)
    return qrow, [j for j in att.indices[qrow].tolist() if j >= 0], toks[-L:]


def _top_keys(story) -> TopKeys:
    """The keys the drawn query kept, with their score, top-k weight and dense weight."""
    att, toks = story.attention, story.shown_tokens
    qrow, picked, keys = drawn_query(story)
    rows = tuple(KeyRow(key=j, token=keys[j], score=float(att.scores[qrow, j]), weight=w,
                        dense=float(att.dense[qrow, j]))
                 for j, w in zip(picked, att.weights[qrow].tolist()))
    return TopKeys(layer=att.layer, head=att.head, kv_head=att.kv_head, query=att.query,
                   query_token=toks[att.query], top_k=att.top_k, rows=rows, mass=att.mass)


def _next_token(story) -> NextToken | None:
    """The five best next tokens with top-k and with dense attention; None for an encoder."""
    p = story.prediction
    if p is None:
        return None
    return NextToken(after=story.shown_tokens[-1], top_k=story.top_k,
                     top=tuple(Candidate(i, t, pr) for i, t, _, pr in p.top),
                     dense=tuple(Candidate(i, t, pr) for i, t, _, pr in p.dense_top))
