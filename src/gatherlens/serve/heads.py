"""GET /api/heads: every layer and head of one run, as the head gallery measures them.

    >>> s = ServeSettings()
    >>> body = heads_body(lm, explain_params({"text": "The cat sat on the mat"}, s), s)
    >>> body["layers"], body["heads"], body["tiles"][0]["tag"], body["tiles"][0]["map"][1]
    (30, 9, 'broad', [15, -1, -1, -1, -1, -1])

The same run as /api/explain (gatherlens.report.collect at the request's k, top-k on or off) and
the same numbers as the page's gallery (gatherlens.report.heads: the rules, the kept share, the
small maps as levels 0 .. levels - 1, -1 where no query may look); `names` gives each tag in
the request's language.
"""
from __future__ import annotations

from gatherlens.i18n import text

__all__ = ["heads_body"]


def heads_body(lm, p, settings) -> dict:
    """The JSON body for checked parameters `p` (serve.params.ExplainParams) within the server's
    `settings` (serve.settings.ServeSettings: the longest text in tokens); runs the model."""
    from gatherlens.report.collect import collect
    from gatherlens.report.heads import gallery_data, head_gallery
    from gatherlens.trace.head_records import HEAD_TAGS

    story = collect(lm, p.text, top_k=p.k if p.topk else None, layer=p.layer, head=p.head,
                    query=p.query, max_tokens=settings.max_tokens)
    return {"model": story.model_name, "text": story.text, "tokens": story.tokens,
            **gallery_data(head_gallery(story)),
            "names": {tag: text(f"gal_tag_{tag}", p.lang) for tag in HEAD_TAGS}}
